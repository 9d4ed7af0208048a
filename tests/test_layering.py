"""The packages' layers (issue 14): ``connect_wire`` below both; the daemon (``coordinator``) and
the worker client (``worker_client``) never import each other, so shared code (the structured
log setup, connect_wire.logs) lives below both. Checked in fresh interpreters: importing each
side's entry points loads nothing of the other."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
for module in {modules!r}:
    __import__(module)
bad = sorted(m for m in sys.modules if m == {forbidden!r} or m.startswith({forbidden!r} + "."))
print(",".join(bad))
"""


@pytest.mark.parametrize(("modules", "forbidden"), [
    (["coordinator.cli", "coordinator.server.app", "coordinator.runtime.shard",
      "coordinator.logs"], "worker_client"),
    (["worker_client.cli", "worker_client.worker", "worker_client.logs"], "coordinator"),
])
def test_one_side_never_imports_the_other(modules: list[str], forbidden: str) -> None:
    done = subprocess.run([sys.executable, "-c", CHECK.format(modules=modules, forbidden=forbidden)],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "", f"{modules} imported {done.stdout.strip()}"


def test_both_logs_are_the_shared_setup() -> None:
    import connect_wire.logs
    import coordinator.logs
    import worker_client.logs

    assert coordinator.logs.configure is connect_wire.logs.configure
    assert worker_client.logs.configure is connect_wire.logs.configure
    assert worker_client.logs.emergency is connect_wire.logs.emergency
