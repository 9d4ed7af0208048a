"""Running ``python -m bench`` from a smoke test: this checkout first on the path, without the
daemon's environment settings of the calling shell (they would change what the bench measures)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECT_COORDINATOR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout, check=False,
    )
