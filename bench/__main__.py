"""Dispatcher: ``python -m bench <name> [options]``, ``python -m bench all``, ``python -m bench list``.

A benchmark is a module ``bench/<name>.py`` with a ``main(argv: list[str]) -> int``.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

USAGE = "usage: python -m bench {list | all | <name>} [options]"


def names() -> list[str]:
    """Every benchmark module in bench/ (not private, not this dispatcher)."""
    return sorted(
        m.name for m in pkgutil.iter_modules([str(HERE)])
        if not m.name.startswith("_") and not m.ispkg
    )


def run(name: str, argv: list[str]) -> int:
    module = importlib.import_module(f"bench.{name}")
    entry = getattr(module, "main", None)
    if entry is None:
        print(f"bench: bench/{name}.py has no main(argv)", file=sys.stderr)
        return 2
    return int(entry(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    available = names()
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        print("benchmarks: " + ", ".join(available))
        return 0 if argv else 2
    name, rest = argv[0].replace("-", "_"), argv[1:]  # `etcd-layout` runs bench/etcd_layout.py
    if name == "list":
        print("\n".join(available))
        return 0
    if name == "all":
        status = 0
        for each in available:
            print(f"== {each}", flush=True)
            status = max(status, run(each, rest))
        return status
    if name not in available:
        print(f"bench: unknown benchmark {argv[0]!r}; choose one of: "
              f"{', '.join(['all', 'list', *available])}", file=sys.stderr)
        return 2
    return run(name, rest)


if __name__ == "__main__":
    sys.exit(main())
