"""Smoke test of ``python -m bench joins``: tiny sizes, the core and a real daemon, rows of the
expected shape. Only the structure is checked, never the timings."""

from tests.bench_run import run_bench


def test_bench_joins_smoke() -> None:
    result = run_bench("joins", "--sizes", "20,40", "--connections", "2", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    core = lines.index("core (sans-IO): N joins into one group")
    assert [line.split()[0] for line in lines[core + 2:core + 4]] == ["20", "40"]
    daemon = next(i for i, line in enumerate(lines) if line.startswith("daemon: "))
    rows = [line.split() for line in lines[daemon + 2:daemon + 4]]
    assert [row[0] for row in rows] == ["20", "40"]
    assert all(row[3] == "0" and line.endswith("kept its session")
               for row, line in zip(rows, lines[daemon + 2:daemon + 4], strict=True))
