"""``mypy --strict`` over the sans-IO cores (the group coordinator's core, the worker's membership
state machine, the assignors), with the [tool.mypy] settings of pyproject.toml: the type gate runs
with the test suite, so CI enforces it. mypy's cache is the git-ignored ``.mypy_cache`` at the
repository root, so a rerun only re-checks what changed."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "pyproject.toml"
CORES = ["coordinator/group", "worker_client/membership.py", "connect_wire/assignors"]


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(CONFIG), *args],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )


def test_config_checks_the_cores_strictly() -> None:
    config = tomllib.loads(CONFIG.read_text())["tool"]["mypy"]
    assert config["strict"] is True
    assert config["files"] == CORES


def test_cores_pass_mypy_strict() -> None:
    result = _mypy()
    assert result.returncode == 0, result.stdout + result.stderr
    # Every core module was checked (not "no issues found in 0 source files").
    modules = [f for p in CORES for f in ((ROOT / p).rglob("*.py") if (ROOT / p).is_dir() else [ROOT / p])]
    assert f"no issues found in {len(modules)} source files" in result.stdout, result.stdout


def test_the_gate_reports_an_untyped_function(tmp_path: Path) -> None:
    # The same settings on a file with an unannotated function: strict must reject it.
    sample = tmp_path / "untyped_sample.py"
    sample.write_text("def half(x):\n    return x / 2\n")
    result = _mypy(str(sample))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "[no-untyped-def]" in result.stdout, result.stdout
