"""Debian packages the tests run for real (Prometheus, etcd-server, PostgreSQL).

A binary is looked for where Debian installs it; when it is missing and this is root (CI's
container), its package is installed with apt-get, as ``bench peers`` installs redis-server
(bench/peers.py); otherwise the test fails and says what to install — never skipped, so a
machine without it cannot pass the suite silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

import pytest

CANDIDATES = ("/usr/bin", "/usr/local/bin", "/usr/sbin")


def find(name: str, *, path_too: bool = True) -> str | None:
    """``name`` in Debian's directories (and on PATH first when ``path_too``)."""
    found = shutil.which(name) if path_too else None
    return found or next(
        (f"{d}/{name}" for d in CANDIDATES if os.access(f"{d}/{name}", os.X_OK)), None)


def binary(name: str, package: str, *, path_too: bool = True) -> str:
    """The path of ``name``: found, or installed from Debian's ``package`` (apt-get, as root), or
    the test fails."""
    return ensure(package, lambda: find(name, path_too=path_too), what=name)


def ensure(package: str, locate: Callable[[], str | None], *, what: str) -> str:
    """``locate()``'s answer: found, or found after installing Debian's ``package`` (apt-get, as
    root), or the test fails saying what to install (``what`` names the missing thing)."""
    found = locate()
    if found:
        return found
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.fail(f"{what} is not installed and this is not root: install Debian's "
                    f"{package} package (`sudo apt-get install -y {package}`) and run again")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", package]
    done = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update"], capture_output=True, text=True, env=env, check=False)
        done = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
    found = locate()
    if done.returncode != 0 or not found:
        pytest.fail(f"apt-get install {package} failed ({done.returncode}):\n"
                    f"{(done.stdout + done.stderr)[-2000:]}")
    return found
