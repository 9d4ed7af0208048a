"""The simulator's results pinned byte for byte: every scenario x both assignors x two seeds, each
run's metrics (but ``wall_ms``), extra numbers and full event trace, digested.

A refactoring of simulation/ must leave these digests as they are (the simulator is
deterministic per seed). A change meant to alter the model's behaviour regenerates them, and
says so in its commit:

    PYTHONPATH=. python tests/test_simulation_golden.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from simulation import ASSIGNORS, SCENARIOS, run

GOLDEN = Path(__file__).with_name("simulation_golden.json")
SEEDS = (0, 1)
WORKERS, TASKS = 3, 10


def digest(scenario: str, assignor: str, seed: int) -> str:
    result = run(scenario, assignor, WORKERS, TASKS, seed, trace=True)
    metrics = {k: v for k, v in result.metrics.items() if k != "wall_ms"}
    blob = json.dumps({"metrics": metrics, "extra": result.extra, "events": result.events},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def digests() -> dict[str, str]:
    return {f"{s}/{a}/{seed}": digest(s, a, seed)
            for s in SCENARIOS for a in ASSIGNORS for seed in SEEDS}


def test_results_are_those_pinned() -> None:
    want = json.loads(GOLDEN.read_text())
    got = digests()
    changed = sorted(k for k in got if want.get(k) != got[k])
    gone = sorted(set(want) - set(got))
    assert not changed and not gone, (
        f"{len(changed)} runs differ from the pinned results (e.g. {changed[:5]}), {len(gone)} pinned "
        f"runs are gone ({gone[:5]}). A refactoring must not change them; a change of the model's "
        "behaviour regenerates them: PYTHONPATH=. python tests/test_simulation_golden.py --write")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: PYTHONPATH=. python tests/test_simulation_golden.py --write")
    GOLDEN.write_text(json.dumps(digests(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
