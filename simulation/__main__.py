"""``python -m simulation run|replay|sweep|report|analyze``.

* ``run``: one run; prints its metrics as JSON (exit 1 on a violation).
* ``replay SEED``: the same run with its event trace printed, one event a line.
* ``sweep``, ``report``, ``analyze``: :mod:`simulation.sweep`, :mod:`simulation.report`,
  :mod:`simulation.analyze` (their ``main(argv)``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from . import ASSIGNORS, SCENARIOS, run


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", default="random-faults", choices=sorted(SCENARIOS))
    p.add_argument("--assignor", default="incremental", choices=ASSIGNORS)
    p.add_argument("--workers", type=int, default=5)
    p.add_argument("--tasks", type=int, default=50)


def _replay_hint(a: argparse.Namespace, seed: int) -> str:
    return (f"python -m simulation replay {seed} --scenario {a.scenario} --assignor {a.assignor} "
            f"--workers {a.workers} --tasks {a.tasks}")


SPARK_EXTRA = ("pyspark", "py4j", "pandas", "pyarrow", "matplotlib")
"""What ``sweep``, ``report`` and ``analyze`` need beyond the package: the ``spark`` extra."""


def _delegate(name: str, argv: Sequence[str]) -> int:
    try:
        module = importlib.import_module(f"simulation.{name}")
        return int(module.main(list(argv)) or 0)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing in SPARK_EXTRA:
            # The README's install has no Spark; this was a traceback.
            print(f"python -m simulation {name} needs {missing}, which is not installed: "
                  "pip install 'connect-coordinator[spark]' (PySpark, pandas, pyarrow, "
                  "matplotlib; Spark also needs Java 17)", file=sys.stderr)
            return 2
        if exc.name != f"simulation.{name}":
            raise
        print(f"error: simulation.{name} is not available (simulation/{name}.py is missing)",
              file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("sweep", "report", "analyze"):
        return _delegate(argv[0], argv[1:])
    parser = argparse.ArgumentParser(prog="python -m simulation", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="one run; print its metrics as JSON")
    _run_args(p_run)
    p_run.add_argument("--seed", type=int, default=0)
    p_replay = sub.add_parser("replay", help="re-run a seed and print its event trace")
    p_replay.add_argument("seed", type=int)
    _run_args(p_replay)
    p_replay.add_argument("--json", action="store_true", help="one JSON object per event")
    for name in ("sweep", "report", "analyze"):
        sub.add_parser(name, help=f"simulation.{name}.main(argv)", add_help=False)
    sub.add_parser("scenarios", help="list the scenarios")
    a = parser.parse_args(argv)
    if a.command == "scenarios":
        for name, s in SCENARIOS.items():
            print(f"{name:32} {s.description}")
        return 0
    if a.command == "run":
        result = run(a.scenario, a.assignor, a.workers, a.tasks, a.seed)
        print(json.dumps(result.metrics, indent=2))
        if result.metrics["violation"]:
            print(f"violation (seed {a.seed}): {result.metrics['violation']}", file=sys.stderr)
            print(f"replay: {_replay_hint(a, a.seed)}", file=sys.stderr)
            return 1
        return 0
    result = run(a.scenario, a.assignor, a.workers, a.tasks, a.seed, trace=True)
    for ev in result.events:
        if a.json:
            print(json.dumps(ev))
        else:
            epoch = f" e{ev['epoch']}" if ev["epoch"] != -1 else ""
            parts = [f"{ev['t_ms']:>9}", f"{ev['kind']:<20}", f"{ev['worker']:<7}{epoch}"]
            if ev["item"]:
                parts.append(str(ev["item"]))
            if ev["detail"]:
                parts.append(str(ev["detail"]))
            print(" ".join(parts))
    print(json.dumps(result.metrics))
    if result.metrics["violation"]:
        print(f"violation (seed {a.seed}): {result.metrics['violation']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
