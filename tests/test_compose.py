"""The compose files: one image built once, healthchecks, the demo plugin writing its
records, and two listeners (INTERNAL for the containers, EXTERNAL for the host); the single
node's secured: SASL_SSL on both, SCRAM users, ACLs.

There is no Docker engine on the development machine, so the services' own commands,
environment and healthchecks run here as local processes, with each container address mapped
to this machine: the INTERNAL listener's service name (``coordinator``) becomes ``localhost``
(what a container resolves it to), published ports become free ports. What is checked is what a
container or the host would see: the EXTERNAL listener answers FindCoordinator and Metadata
with the host's address and the INTERNAL one with the service's, the setup job creates the
demo's connectors (twice: idempotent), the workers' entrypoints join and write the records,
and each healthcheck passes on a healthy service and fails on an unhealthy one. The secured
single node: its certs job makes the CA, the server certificate and the passwords (``/secrets``
becomes a directory here), its users job adds the users offline to the data dir the coordinator
then runs on, everyone authenticates over TLS with the CA, the setup job (as admin) adds the
workers' ACL, and the worker user may run group demo but not change it.
"""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.metadata.v12.request import MetadataRequest

from connect_wire import client_security
from coordinator import config as cfg
from coordinator.admin import AdminClient
from coordinator.cli import parser as coordinator_parser
from tests.daemon_fixture import ROOT, DaemonPool, daemon_env

IMAGE = "connect-coordinator:local"
SINGLE = ROOT / "docker" / "compose.yaml"
CLUSTER = ROOT / "docker" / "compose.cluster.yaml"


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def ours(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {n: s for n, s in doc["services"].items() if s.get("image") == IMAGE or "build" in s}


@pytest.mark.parametrize("path", [SINGLE, CLUSTER], ids=["single", "cluster"])
def test_one_image_built_once_and_every_service_checked(path: Path) -> None:
    services = ours(load(path))
    builders = [n for n, s in services.items() if "build" in s]
    assert len(builders) == 1, builders
    assert all(s["image"] == IMAGE for s in services.values())
    assert all(s.get("pull_policy") == "never" for n, s in services.items() if n not in builders)
    assert services[builders[0]]["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    # Healthchecks on every long-running service of ours; workers wait for healthy coordinators.
    for name, s in services.items():
        if s.get("restart") == "no":
            continue  # (a one-shot job)
        assert s["healthcheck"]["test"][0] == "CMD", name
    for name, s in services.items():
        if name.startswith("worker-"):
            assert all(c == {"condition": "service_healthy"} for c in s["depends_on"].values()), name
            record = s["environment"]["CONNECT_WORKER_RECORD_FILE"]
            assert any(v.endswith(":" + str(Path(record).parent)) for v in s["volumes"]), name
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "EXPOSE 9092 9094 9464" in dockerfile


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _argv(command: list[str], local: Any) -> list[str]:
    """A service's command as a local process: our console scripts as ``python -m``."""
    scripts = {"connect-coordinator": [sys.executable, "-m", "coordinator.cli"],
               "connect-worker": [sys.executable, "-m", "worker_client.cli"],
               "python": [sys.executable]}
    return [*scripts.get(command[0], [command[0]]), *(local(a) for a in command[1:])]


def _sh(script: str, local: Any) -> list[str]:
    """A one-shot job's ``sh -c`` script as a local process: compose's ``$$`` unescaped, our
    console scripts and ``python`` as this interpreter."""
    script = local(script.replace("$$", "$"))
    script = script.replace("connect-coordinator ", f"{shlex.quote(sys.executable)} -m coordinator.cli ")
    return ["sh", "-c", script.replace("python -c ", f"{shlex.quote(sys.executable)} -c ")]


def _run_job(service: Mapping[str, Any], local: Any) -> subprocess.CompletedProcess[str]:
    assert service["entrypoint"] == ["sh", "-c"] and service["restart"] == "no"
    return subprocess.run(_sh(service["command"][0], local), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=daemon_env(), cwd=ROOT, timeout=60,
                          check=False)


def _healthy(test: list[str], local: Any) -> bool:
    assert test[0] == "CMD"
    r = subprocess.run(_argv(test[1:], local), stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, env=daemon_env(), cwd=ROOT, timeout=30, check=False)
    return r.returncode == 0


def test_the_single_node_compose_as_local_processes(tmp_path: Path) -> None:
    services = load(SINGLE)["services"]
    coordinator = services["coordinator"]
    env = dict(coordinator["environment"])
    p_int, p_ext = _free_port(), _free_port()
    metrics = {f"worker-{i}": _free_port() for i in (1, 2, 3)}
    published = {int(p.split(":")[-1]) for p in coordinator["ports"]}
    assert 9094 in published and 9092 not in published  # EXTERNAL published, INTERNAL not

    secrets, data = tmp_path / "secrets", tmp_path / "data"
    secrets.mkdir()

    def local(text: str, worker: str | None = None) -> str:
        text = (text.replace("/secrets", str(secrets)).replace("/data", str(data))
                .replace("coordinator:9092", f"localhost:{p_int}")
                .replace("0.0.0.0:9092", f"127.0.0.1:{p_int}")
                .replace("0.0.0.0:9094", f"127.0.0.1:{p_ext}")
                .replace("127.0.0.1:9094", f"127.0.0.1:{p_ext}"))
        if worker is not None:
            text = (text.replace("0.0.0.0:9465", f"127.0.0.1:{metrics[worker]}")
                    .replace("127.0.0.1:9465", f"127.0.0.1:{metrics[worker]}"))
        return text

    listeners = local(env.pop("CONNECT_COORDINATOR_LISTENERS"))
    assert env["CONNECT_COORDINATOR_LISTENER_SECURITY_PROTOCOL_MAP"] == "INTERNAL:SASL_SSL,EXTERNAL:SASL_SSL"
    assert env["CONNECT_COORDINATOR_AUTHORIZER"] == "acl"
    assert env["CONNECT_COORDINATOR_SUPER_USERS"] == "User:admin"
    assert coordinator["depends_on"] == {"users": {"condition": "service_completed_successfully"}}
    assert services["users"]["depends_on"] == {"certs": {"condition": "service_completed_successfully"}}

    # The certs job: a CA, the server's certificate, passwords and client settings; run again,
    # it keeps them. No password on any command line.
    runs = []
    for _ in range(2):
        r = _run_job(services["certs"], local)
        assert r.returncode == 0, r
        runs.append({f.name: f.read_bytes() for f in secrets.iterdir()})
    made = runs[0]
    assert runs[1] == made
    assert set(made) == {"ca.pem", "ca.key", "server.pem", "server.key", "admin.pw", "worker.pw",
                         "admin.properties", "worker.properties"}, set(made)
    for pw in ("admin.pw", "worker.pw"):
        assert made[pw].decode().strip() not in yaml.safe_dump(load(SINGLE)), pw
    subject = subprocess.run(["openssl", "x509", "-in", str(secrets / "server.pem"), "-noout", "-ext",
                              "subjectAltName"], capture_output=True, text=True, check=True).stdout
    assert "DNS:coordinator" in subject and "DNS:localhost" in subject, subject
    subprocess.run(["openssl", "verify", "-CAfile", str(secrets / "ca.pem"), str(secrets / "server.pem")],
                   capture_output=True, check=True)

    # The users job adds admin and worker to the data dir, offline; again: nothing to do.
    for _ in range(2):
        r = _run_job(services["users"], local)
        assert r.returncode == 0, r
    admin = client_security.resolve(client_security.load_config_file(str(secrets / "admin.properties")))
    worker = client_security.resolve(client_security.load_config_file(str(secrets / "worker.properties")))
    host_flags = ["--security-protocol", "SASL_SSL", "--sasl-mechanism", "SCRAM-SHA-512",
                  "--ssl-cafile", "/secrets/ca.pem", "--sasl-username", "admin",
                  "--sasl-password-file", "/secrets/admin.pw"]  # (compose.yaml's header; local())
    records = tmp_path / "records" / "records.jsonl"
    records.parent.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    with DaemonPool(tmp_path) as pool:
        d = pool.start(data, extra_env={k: local(v) for k, v in env.items()},
                       extra_args=["--listen", listeners], short_timeouts=False)
        assert d.listeners == {"INTERNAL": ("127.0.0.1", p_int), "EXTERNAL": ("127.0.0.1", p_ext)}

        # Each side is told the address of the listener it came in on.
        for listener, expect in (("EXTERNAL", ("127.0.0.1", p_ext)), ("INTERNAL", ("localhost", p_int))):
            with AdminClient(*d.listeners[listener], timeout_s=5, security=admin) as c:
                (found,) = c.call(FindCoordinatorRequest(key_type=0, coordinator_keys=("demo",))).coordinators
                (broker,) = c.call(MetadataRequest(
                    topics=(), allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False)).brokers
            assert (found.host, found.port) == expect and (broker.host, broker.port) == expect, listener

        assert _healthy(coordinator["healthcheck"]["test"], local)
        # (authenticated: without the client settings the same check fails)
        assert not _healthy(coordinator["healthcheck"]["test"][:-2], local)

        # The setup job creates the demo's connectors; run again, it changes nothing and succeeds.
        for _ in range(2):
            r = _run_job(services["setup"], local)
            assert r.returncode == 0, r
        r = subprocess.run(_argv(["connect-coordinator", "connectors", "list", "--bootstrap",
                                  "127.0.0.1:9094", "--group", "demo", "--json", *host_flags], local),
                           capture_output=True, text=True, env=daemon_env(), cwd=ROOT, timeout=30,
                           check=False)
        assert r.returncode == 0, r  # (from the host, through EXTERNAL)
        assert {c["name"]: c["tasks"] for c in json.loads(r.stdout)} == {"orders": 3, "payments": 2}
        # The worker user may run group demo (its ACL: READ) but not change its connectors.
        worker_flags = [*host_flags[:-4], "--sasl-username", "worker", "--sasl-password-file",
                        "/secrets/worker.pw"]
        r = subprocess.run(_argv(["connect-coordinator", "connectors", "delete", "--bootstrap",
                                  "127.0.0.1:9094", "--group", "demo", "orders", *worker_flags], local),
                           capture_output=True, text=True, env=daemon_env(), cwd=ROOT, timeout=30,
                           check=False)
        assert r.returncode != 0 and "AUTHORIZATION" in (r.stdout + r.stderr).upper(), r
        assert worker.username == "worker" and admin.username == "admin"

        # The workers' entrypoints, with their environment (the records file on its volume).
        try:
            for name in ("worker-1", "worker-2", "worker-3"):
                s = services[name]
                volume = s["environment"]["CONNECT_WORKER_RECORD_FILE"]
                assert Path(volume).name == records.name, volume
                wenv = {**daemon_env(), **s["environment"], "CONNECT_WORKER_RECORD_FILE": str(records)}
                with open(tmp_path / f"{name}.log", "wb") as log:
                    procs.append(subprocess.Popen(
                        _argv(s["entrypoint"], lambda a, n=name: local(a, n)),
                        stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=wenv, cwd=ROOT))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                started = {json.loads(x)["item"] for x in records.read_text().splitlines()} \
                    if records.exists() else set()
                if len(started) == 7 and all(
                        _healthy(services[n]["healthcheck"]["test"], lambda a, n=n: local(a, n))
                        for n in metrics):
                    break
                time.sleep(0.5)
            else:
                raise AssertionError("workers not healthy or records missing:\n" + "\n".join(
                    (tmp_path / f"{n}.log").read_text()[-1500:] for n in metrics))
            lines = [json.loads(x) for x in records.read_text().splitlines()]
            assert {e["worker"] for e in lines} <= {"worker-1", "worker-2", "worker-3"}
            # An unhealthy worker (its coordinator gone) fails the same check.
            procs[0].send_signal(signal.SIGTERM)
            assert procs[0].wait(15) == 0
            assert not _healthy(services["worker-1"]["healthcheck"]["test"],
                                lambda a: local(a, "worker-1"))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(15)
        d.stop()
        assert not _healthy(coordinator["healthcheck"]["test"], local)


def test_the_cluster_compose_nodes_configure_two_listeners() -> None:
    """Each etcd node's settings (image environment, the service's environment and flags) load,
    with both listeners advertised: INTERNAL as the service, EXTERNAL as its published port."""
    doc = load(CLUSTER)
    image_env = {"CONNECT_COORDINATOR_LISTENERS": "0.0.0.0:9092",
                 "CONNECT_COORDINATOR_METRICS_LISTENER": "0.0.0.0:9464",
                 "CONNECT_COORDINATOR_DATA_DIR": "/data"}  # (the Dockerfile's ENV)
    for name in ("coordinator-1", "coordinator-2"):
        s = doc["services"][name]
        args = coordinator_parser().parse_args(["serve", *s["command"]])
        overrides = {"store": args.store, "etcd.endpoints": args.etcd_endpoints,
                     "node.id": args.node_id, "advertised.listener": args.advertised_listener}
        config = cfg.load(None, overrides, environ={**image_env, **s["environment"]})
        assert [(ln.name, ln.port) for ln in config.listeners] == [("INTERNAL", 9092), ("EXTERNAL", 9094)]
        published = {p.rsplit(":", 1)[1]: int(p.rsplit(":", 2)[1]) for p in s["ports"]}
        assert config.advertised == {"INTERNAL": (name, 9092),
                                     "EXTERNAL": ("127.0.0.1", published["9094"])}, name
