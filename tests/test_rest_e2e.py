"""Kafka Connect's REST API on `connect-worker run --rest-listen`, end to end with real
processes: one coordinator daemon and two workers for the whole module (w1 open, w2 behind
HTTP basic authentication), driven by `kafka-connect-py` (a real Kafka Connect client from PyPI)
for the lifecycle and by raw HTTP (urllib) for status codes, error bodies and the endpoints
that client does not cover (offsets, PATCH config, health)."""

from __future__ import annotations

import base64
import json
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from kafka_connect import KafkaConnect

from connect_wire.messages import ConnectGroupDescribeRequest
from coordinator.admin import AdminClient
from tests.daemon_fixture import ROOT, Daemon, DaemonPool, daemon_env
from tests.test_worker_e2e import PLUGIN, SESSION_MS, _free_port
from tests.tls_fixture import TlsFiles, tls_ca  # noqa: F401 - a fixture

GROUP = "rest"
USER, PASSWORD = "admin", "s3cret=ok"  # (a password may contain '=')
CONVERGE_S = 30.0


class Workers:
    def __init__(self, base: Path, daemon: Daemon, group: str = GROUP) -> None:
        self.base, self.daemon, self.group = base, daemon, group
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.urls: dict[str, str] = {}
        self.records = base / "records.jsonl"
        self.records.touch()
        self.users = base / "users.properties"
        # (java.util.Properties lines, as Kafka's PropertyFileLoginModule reads them: the first
        # unescaped '=', ':' or blank ends the user; '\' escapes)
        self.users.write_text(f"# REST users\n{USER}={PASSWORD}\nother=x\ncolon:pa=ss\n"
                              "spaced  pass word\nesc\\=aped = \\u00e9t\\u00e9\n")

    def spawn(self, name: str, auth: bool = False) -> None:
        port = _free_port()
        self.urls[name] = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", self.daemon.bootstrap,
               "--group", self.group, "--instance-id", name, "--session-timeout-ms", str(SESSION_MS),
               "--max-delay-ms", "0", "--rest-listen", f"127.0.0.1:{port}",
               "--rest-request-timeout-ms", "5000"]
        if auth:
            cmd += ["--rest-basic-auth-file", str(self.users)]
        with open(self.base / f"worker-{name}.log", "wb") as err:
            self.procs[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                                env=daemon_env(), cwd=ROOT)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.base.glob("worker-*.log")))

    def close(self) -> dict[str, int | None]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                codes[name] = None
        return codes

    def describe(self) -> Any:
        with AdminClient(self.daemon.host, self.daemon.port, timeout_s=5) as c:
            (g,) = c.call(ConnectGroupDescribeRequest(group_ids=(self.group,))).groups
        return g


def http(method: str, url: str, body: Any = None, auth: tuple[str, str] | None = None,
         raw: bytes | None = None, context: ssl.SSLContext | None = None
         ) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON body or None) of one request."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as resp:
            status, headers, text = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        status, headers, text = exc.code, dict(exc.headers), exc.read()
    return status, headers, json.loads(text) if text else None


def until(check: Callable[[], Any], what: str, workers: Workers, timeout_s: float = CONVERGE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s\n{workers.logs()}"
        time.sleep(0.2)


def healthy(url: str, auth: tuple[str, str] | None = None) -> bool:
    try:
        return http("GET", url + "/health", auth=auth)[0] == 200
    except urllib.error.URLError:  # not listening yet
        return False


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    base = tmp_path_factory.mktemp("rest")
    with DaemonPool(base) as pool:
        w = Workers(base, pool.start())
        try:
            w.spawn("w1")
            w.spawn("w2", auth=True)
            until(lambda: healthy(w.urls["w1"]) and healthy(w.urls["w2"], (USER, PASSWORD)),
                  "both workers healthy", w)
            yield w
        finally:
            codes = w.close()
        assert codes == {"w1": 0, "w2": 0}, w.logs()


def connector(workers: Workers, name: str, tasks: int = 2, **extra: str) -> dict[str, Any]:
    return {"name": name, "config": {"connector.class": PLUGIN, "tasks.max": str(tasks),
                                     "record.file": str(workers.records), **extra}}


def worker_ids(workers: Workers) -> set[str]:
    return {u.removeprefix("http://") for u in workers.urls.values()}


def states(st: dict[str, Any]) -> tuple[str, list[str]]:
    return st["connector"]["state"], [t["state"] for t in st["tasks"]]


def test_lifecycle_through_kafka_connect_py(workers: Workers) -> None:
    kc = KafkaConnect(url=workers.urls["w1"])
    assert kc.get_cluster_info()["kafka_cluster_id"] == GROUP
    info = kc.create_connector(connector(workers, "life", tasks=2))
    assert info["name"] == "life" and info["config"]["tasks.max"] == "2"
    assert info["config"]["connector.class"] == PLUGIN and info["config"]["name"] == "life"
    assert "life" in kc.list_connectors()
    assert kc.get_connector_config("life") == info["config"]

    def running() -> dict[str, Any] | None:
        st = kc.get_connector_status("life")
        return st if states(st) == ("RUNNING", ["RUNNING", "RUNNING"]) else None

    st = until(running, "life RUNNING", workers)
    assert {st["connector"]["worker_id"], *(t["worker_id"] for t in st["tasks"])} <= worker_ids(workers)
    assert [t["id"] for t in st["tasks"]] == [0, 1] and st["type"] in ("source", "sink", "unknown")
    listed = kc.list_connectors(expand="status")
    assert listed["life"]["status"]["connector"]["state"] == "RUNNING"
    tasks = kc.list_connector_tasks("life")
    assert [t["id"] for t in tasks] == [{"connector": "life", "task": 0}, {"connector": "life", "task": 1}]
    assert tasks[0]["config"]["connector.class"] == PLUGIN
    assert kc.get_connector_task_status("life", 1)["state"] == "RUNNING"

    kc.pause_connector("life")
    until(lambda: states(kc.get_connector_status("life")) == ("PAUSED", ["PAUSED", "PAUSED"]),
          "life PAUSED", workers)
    kc.resume_connector("life")
    until(running, "life RUNNING again", workers)
    kc.stop_connector("life")
    # (a STOPPED connector's tasks are not shown, as Kafka Connect)
    until(lambda: states(kc.get_connector_status("life")) == ("STOPPED", []), "life STOPPED", workers)

    # Offsets (not in kafka-connect-py): alter, get, reset while STOPPED.
    url = f"{workers.urls['w1']}/connectors/life/offsets"
    offsets = {"offsets": [{"partition": {"file": "a.txt"}, "offset": {"line": 7}},
                           {"partition": {"file": "b.txt"}, "offset": {"line": 1}}]}
    status, _, body = http("PATCH", url, offsets)
    assert (status, body) == (200, {"message": "The offsets for this connector have been altered "
                                               "successfully"})
    status, _, body = http("GET", url)
    assert status == 200
    assert sorted(body["offsets"], key=str) == sorted(offsets["offsets"], key=str)
    status, _, body = http("PATCH", url, {"offsets": [{"partition": {"file": "b.txt"}, "offset": None}]})
    assert status == 200
    assert http("GET", url)[2] == {"offsets": [offsets["offsets"][0]]}
    status, _, body = http("DELETE", url)
    assert (status, body) == (200, {"message": "The offsets for this connector have been reset "
                                               "successfully"})
    assert http("GET", url)[2] == {"offsets": []}

    kc.resume_connector("life")
    until(running, "life RUNNING after stop", workers)
    st = kc.restart_connector("life", include_tasks=True, only_failed=False)
    assert states(st) == ("RESTARTING", ["RESTARTING", "RESTARTING"])
    assert kc.restart_connector("life") is None  # 204: the connector instance only
    kc.restart_connector_task("life", 1)
    (c,) = [c for c in workers.describe().connectors if c.name == "life"]
    config = {e.name: e.value for e in c.config}
    assert (config["connect.restart.generation"], config["connect.restart.connector"],
            config["connect.restart.task.1"]) == ("1", "1", "1")
    until(running, "life RUNNING after the restarts", workers)

    updated = kc.update_connector("life", {"connector.class": PLUGIN, "tasks.max": "3",
                                           "record.file": str(workers.records), "record.tag": "v2"})
    assert updated["config"]["tasks.max"] == "3" and updated["config"]["record.tag"] == "v2"
    until(lambda: states(kc.get_connector_status("life")) == ("RUNNING", ["RUNNING"] * 3),
          "life with 3 tasks", workers)
    # the verbs' counters survive an update (they are not the REST config's)
    assert "connect.restart.generation" not in updated["config"]

    kc.delete_connector("life")
    with pytest.raises(requests.HTTPError) as err:
        kc.get_connector("life")
    assert err.value.response.status_code == 404
    assert err.value.response.json() == {"error_code": 404, "message": "Connector life not found"}


def test_restart_only_failed_tasks_answers_202_with_them_restarting(workers: Workers) -> None:
    kc = KafkaConnect(url=workers.urls["w1"])
    kc.create_connector(connector(workers, "flaky", tasks=2, **{"fail.mode": "start"}))
    until(lambda: states(kc.get_connector_status("flaky")) == ("RUNNING", ["FAILED", "FAILED"]),
          "flaky's tasks FAILED", workers)
    st = kc.get_connector_status("flaky")
    assert "start() failed on purpose" in st["tasks"][0]["trace"]
    # kafka-connect-py sends includeTasks=True&onlyFailed=True (Python's spelling)
    st = kc.restart_connector("flaky", include_tasks=True, only_failed=True)
    assert states(st) == ("RUNNING", ["RESTARTING", "RESTARTING"])
    assert "trace" not in st["tasks"][0]
    (c,) = [c for c in workers.describe().connectors if c.name == "flaky"]
    config = {e.name: e.value for e in c.config}
    assert config.get("connect.restart.task.0") == "1" and config.get("connect.restart.task.1") == "1"
    assert "connect.restart.generation" not in config and "connect.restart.connector" not in config
    # Nothing failed: 202, nothing restarted.
    status, _, body = http("POST", f"{workers.urls['w1']}/connectors/flaky/restart?includeTasks=true"
                                   "&onlyFailed=TRUE&includeTasks=true")
    assert status == 202 and body["connector"]["state"] == "RUNNING"
    kc.delete_connector("flaky")


def test_status_codes_and_error_bodies(workers: Workers) -> None:
    base = workers.urls["w1"]
    status, headers, body = http("POST", f"{base}/connectors", connector(workers, "codes", tasks=1))
    assert status == 201 and headers["Location"] == "/connectors/codes", body
    status, _, body = http("POST", f"{base}/connectors", connector(workers, "codes", tasks=1))
    assert (status, body) == (409, {"error_code": 409, "message": "Connector codes already exists"})
    # The plugin's own validate refuses the config: 400, nothing written.
    status, _, body = http("POST", f"{base}/connectors", connector(workers, "bad", **{"tick.ms": "soon"}))
    assert status == 400 and body["error_code"] == 400
    assert body["message"].startswith("Connector configuration is invalid and contains the following "
                                      "1 error(s):\ntick.ms: must be a whole number"), body
    status, _, body = http("POST", f"{base}/connectors", {"name": "bad", "config": {"tasks.max": "1"}})
    assert status == 400 and "contains no connector type" in body["message"]
    status, _, body = http("POST", f"{base}/connectors", connector(workers, "bad", tasks=0))
    assert status == 400 and "tasks.max" in body["message"]
    status, _, body = http("POST", f"{base}/connectors", raw=b"{not json")
    assert status == 400 and body["error_code"] == 400
    status, _, body = http("POST", f"{base}/connectors", {"name": "bad", "config": {
        "connector.class": PLUGIN, "connect.target.state": "STOPPED"}})
    assert status == 400 and "reserved" in body["message"]
    assert "bad" not in http("GET", f"{base}/connectors")[2]

    # PUT config: 201 created (Location), 200 updated, a differing name 400.
    put = {"connector.class": PLUGIN, "tasks.max": "1", "record.file": str(workers.records)}
    status, headers, body = http("PUT", f"{base}/connectors/viaput/config", put)
    assert status == 201 and headers["Location"] == "/connectors/viaput"
    status, _, body = http("PUT", f"{base}/connectors/viaput/config", {**put, "record.tag": "x"})
    assert status == 200 and body["config"]["record.tag"] == "x"
    status, _, body = http("PUT", f"{base}/connectors/viaput/config", {**put, "name": "other"})
    assert (status, body["message"]) == (400, "Connector name configuration (other) doesn't match "
                                              "connector name in the URL (viaput)")
    # PATCH: null deletes a key, others are set.
    status, _, body = http("PATCH", f"{base}/connectors/viaput/config", {"record.tag": None, "a.b": "c"})
    assert status == 200 and "record.tag" not in body["config"] and body["config"]["a.b"] == "c"
    assert http("GET", f"{base}/connectors/viaput/config")[2] == {**put, "a.b": "c", "name": "viaput"}
    # initial_state
    status, _, body = http("POST", f"{base}/connectors", {**connector(workers, "idle", tasks=1),
                                                          "initial_state": "PAUSED"})
    assert status == 201
    until(lambda: http("GET", f"{base}/connectors/idle/status")[2]["connector"]["state"] == "PAUSED",
          "idle PAUSED", workers)

    # Offsets of a connector that is not STOPPED: 400 with Kafka Connect's message.
    status, _, body = http("PATCH", f"{base}/connectors/codes/offsets",
                           {"offsets": [{"partition": {"p": 1}, "offset": {"o": 1}}]})
    assert (status, body["message"]) == (400, "Connectors must be in the STOPPED state before their "
                                              "offsets can be modified. This can be done for the "
                                              "specified connector by issuing a 'PUT' request to the "
                                              "'/connectors/codes/stop' endpoint")
    assert http("DELETE", f"{base}/connectors/codes/offsets")[0] == 400
    assert http("PATCH", f"{base}/connectors/codes/offsets", {"offsets": []})[0] == 400

    # 404s, each with Kafka Connect's error body.
    for method, path in (("GET", "/connectors/nope"), ("GET", "/connectors/nope/status"),
                         ("DELETE", "/connectors/nope"), ("PUT", "/connectors/nope/pause"),
                         ("GET", "/connectors/nope/offsets"), ("POST", "/connectors/nope/restart"),
                         ("PATCH", "/connectors/nope/config"), ("GET", "/connectors/nope/tasks"),
                         ("GET", "/connectors/codes/tasks/5/status"),
                         ("POST", "/connectors/codes/tasks/5/restart"),
                         ("GET", "/connectors/codes/tasks/x/status"), ("GET", "/no/such/path")):
        status, _, body = http(method, base + path)
        assert status == 404 and body["error_code"] == 404 and body["message"], (method, path, body)
    # 405 for a wrong method, with Allow.
    status, headers, body = http("DELETE", f"{base}/connectors")
    assert status == 405 and body["error_code"] == 405 and "GET" in headers["Allow"]
    # A trailing slash is the same resource.
    assert http("GET", f"{base}/connectors/")[2] == http("GET", f"{base}/connectors")[2]
    assert http("GET", f"{base}/connectors/codes/config/")[0] == 200
    # expand=status and expand=info together
    expanded = http("GET", f"{base}/connectors?expand=status&expand=info")[2]
    assert set(expanded["codes"]) == {"status", "info"}
    assert expanded["codes"]["info"]["config"]["tasks.max"] == "1"
    assert http("PUT", f"{base}/connectors/codes/stop")[0] == 204
    assert http("PUT", f"{base}/connectors/codes/pause")[0] == 202
    assert http("PUT", f"{base}/connectors/codes/resume")[0] == 202

    # Plugins: validate through a plugin given by its class (URL-encoded).
    status, _, plugins = http("GET", f"{base}/connector-plugins/")
    assert status == 200 and isinstance(plugins, list)
    quoted = urllib.request.quote(PLUGIN, safe="")
    status, _, body = http("PUT", f"{base}/connector-plugins/{quoted}/config/validate",
                           {"tick.ms": "soon", "tasks.max": "1"})
    assert status == 200 and body["name"] == PLUGIN and body["error_count"] == 1
    errors = {c["value"]["name"]: c["value"]["errors"] for c in body["configs"]}
    assert errors["tick.ms"] and errors["tasks.max"] == []
    status, _, body = http("PUT", f"{base}/connector-plugins/{quoted}/config/validate",
                           {"connector.class": "other:Class"})
    assert status == 400
    status, _, body = http("PUT", f"{base}/connector-plugins/no.such:Plugin/config/validate", {})
    assert status == 200 and body["error_count"] == 1

    for name in ("codes", "viaput", "idle"):
        assert http("DELETE", f"{base}/connectors/{name}")[0] == 204


def test_basic_auth_on_every_path_and_both_workers_answer_the_same(workers: Workers) -> None:
    base = workers.urls["w2"]
    for path in ("/", "/health", "/connectors", "/connectors/x/status", "/no/such/path"):
        for auth in (None, (USER, "wrong"), ("nobody", PASSWORD)):
            status, headers, body = http("GET", base + path, auth=auth)
            assert status == 401 and headers["WWW-Authenticate"].startswith("Basic "), (path, auth)
            assert body["error_code"] == 401
    for user, password in (("colon", "pa=ss"), ("spaced", "pass word"), ("esc=aped", "\u00e9t\u00e9")):
        assert http("GET", base + "/", auth=(user, password))[0] == 200, (user, password)
    status, _, body = http("POST", f"{base}/connectors", connector(workers, "authd", tasks=1))
    assert status == 401 and "authd" not in http("GET", f"{workers.urls['w1']}/connectors")[2]
    kc = KafkaConnect(url=base, auth=f"{USER}:{PASSWORD}")
    # (kafka-connect-py splits auth on every ':', so the password must not contain one)
    kc.create_connector(connector(workers, "authd", tasks=1))
    assert http("GET", f"{workers.urls['w1']}/connectors/authd")[2] == kc.get_connector("authd")
    kc.delete_connector("authd")


def test_unjoined_worker_is_unhealthy_and_answers_409_past_its_request_timeout(workers: Workers) -> None:
    """A worker whose coordinator cannot be reached: /health 503 (not joined), and a request
    that needs the coordinator 409 once its request timeout has passed (Kafka Connect's answer
    while its group rebalances), never 500."""
    port = _free_port()  # (nothing listens there)
    rest = _free_port()
    cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", f"127.0.0.1:{port}",
           "--group", GROUP, "--rest-listen", f"127.0.0.1:{rest}", "--rest-request-timeout-ms", "1000"]
    with open(workers.base / "worker-lonely.log", "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                env=daemon_env(), cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{rest}"

        def answer() -> tuple[int, dict[str, str], Any] | None:
            try:
                return http("GET", url + "/health")
            except urllib.error.URLError:
                return None

        status, _, body = until(answer, "the lonely worker's REST API", workers)
        assert status == 503 and body["status"] == "starting", body
        status, _, body = http("GET", url + "/connectors")
        assert status == 409 and body["error_code"] == 409, body
        assert "did not answer within 1 s" in body["message"], body
        assert http("GET", url + "/")[0] == 200  # (needs no coordinator)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, workers.logs()


def test_https_with_the_listeners_own_certificate(workers: Workers, tls_ca: TlsFiles) -> None:  # noqa: F811
    """--rest-ssl-certfile/--rest-ssl-keyfile: HTTPS only (a plain HTTP request gets no answer
    from it), the advertised URL https://, a client that trusts the CA works as with HTTP."""
    rest = _free_port()
    cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", workers.daemon.bootstrap,
           "--group", GROUP, "--instance-id", "w3", "--session-timeout-ms", str(SESSION_MS),
           "--max-delay-ms", "0", "--rest-listen", f"127.0.0.1:{rest}",
           "--rest-ssl-certfile", str(tls_ca.server.cert), "--rest-ssl-keyfile", str(tls_ca.server.key)]
    with open(workers.base / "worker-w3.log", "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                env=daemon_env(), cwd=ROOT)
    try:
        trusting = ssl.create_default_context(cafile=str(tls_ca.ca.cert))
        url = f"https://127.0.0.1:{rest}"

        def ready() -> bool:
            try:
                return http("GET", url + "/health", context=trusting)[0] == 200
            except urllib.error.URLError:
                return False

        until(ready, "w3 healthy over HTTPS", workers)
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            http("GET", f"http://127.0.0.1:{rest}/health")
        with pytest.raises(urllib.error.URLError):  # (a client that does not trust the CA)
            http("GET", url + "/health", context=ssl.create_default_context())
        kc = KafkaConnect(url=url, ssl_verify=str(tls_ca.ca.cert))
        kc.create_connector(connector(workers, "secure", tasks=1))
        assert "secure" in kc.list_connectors()
        members = {m.instance_id: m.worker_url for m in workers.describe().members}
        assert members["w3"] == url and members["w1"] == workers.urls["w1"]
        kc.delete_connector("secure")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, workers.logs()


def test_rest_settings_that_cannot_be_used_exit_2_with_one_line(workers: Workers, tmp_path: Path) -> None:
    empty = tmp_path / "empty.properties"
    empty.write_text("# nobody\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for extra, expect in (
                ([f"127.0.0.1:{port}"], f"cannot serve the REST API on 127.0.0.1:{port} (--rest-listen)"),
                ([f"127.0.0.1:{_free_port()}", "--rest-basic-auth-file", str(empty)],
                 "--rest-basic-auth-file: "),
                ([f"127.0.0.1:{_free_port()}", "--rest-ssl-certfile", str(empty)],
                 "--rest-ssl-certfile and --rest-ssl-keyfile go together")):
            r = subprocess.run([sys.executable, "-m", "worker_client.cli", "run", "--bootstrap",
                                workers.daemon.bootstrap, "--group", "rest-bad", "--rest-listen", *extra],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               env=daemon_env(), cwd=ROOT, timeout=60)
            assert r.returncode == 2, (extra, r.stderr)
            assert expect in r.stderr.strip().splitlines()[-1], (extra, r.stderr)


def test_names_task_counts_and_shapes_as_kafka_connect(workers: Workers) -> None:
    """What a Kafka Connect client sees for unusual names and tasks.max values: a Location a
    client can follow (percent-encoded), a name with a control character refused (400, nothing
    written: it used to be written and then answered with no response at all), a POSTed name
    trimmed, a tasks.max that is not an INT refused (400, not 500), validate counting the same
    errors create refuses, ?expand with no known value a map, HEAD on a GET path."""
    base = workers.urls["w1"]
    odd = "sp ace?#x"
    status, headers, body = http("POST", f"{base}/connectors", connector(workers, odd, tasks=1))
    assert status == 201 and body["name"] == odd, body
    assert headers["Location"] == "/connectors/sp%20ace%3F%23x"
    assert http("GET", base + headers["Location"] + "/config")[2]["name"] == odd
    assert http("DELETE", base + headers["Location"])[0] == 204

    status, _, body = http("POST", f"{base}/connectors", connector(workers, "ctl\x01x", tasks=1))
    assert status == 400 and body["error_code"] == 400, body
    assert "may not contain control sequences" in body["message"], body
    assert "ctl\x01x" not in http("GET", f"{base}/connectors")[2]

    status, headers, body = http("POST", f"{base}/connectors", connector(workers, "  trimmed ", tasks=1))
    assert (status, body["name"], headers["Location"]) == (201, "trimmed", "/connectors/trimmed"), body
    assert http("DELETE", f"{base}/connectors/trimmed")[0] == 204

    for value, why in (("2147483648", "Not a number of type INT"), ("1_0", "Not a number of type INT"),
                       ("abc", "Not a number of type INT"), ("0", "Value must be at least 1")):
        status, _, body = http("PUT", f"{base}/connectors/counts/config",
                               {"connector.class": PLUGIN, "tasks.max": value})
        assert status == 400 and f"Invalid value {value} for configuration tasks.max: {why}" in \
            body["message"], (value, body)
    assert "counts" not in http("GET", f"{base}/connectors")[2]
    quoted = urllib.request.quote(PLUGIN, safe="")
    status, _, body = http("PUT", f"{base}/connector-plugins/{quoted}/config/validate",
                           {"tasks.max": "many", "name": "a\x01"})
    assert status == 200 and body["error_count"] == 2, body
    errors = {c["value"]["name"]: c["value"]["errors"] for c in body["configs"]}
    assert errors["tasks.max"] and errors["name"], errors

    status, _, body = http("POST", f"{base}/connectors", connector(workers, "shapes", tasks=1))
    assert status == 201
    assert http("GET", f"{base}/connectors?expand=nothing")[2]["shapes"] == {}
    # (no Kafka topics: Kafka Connect's answer with topic tracking off)
    for method, path in (("GET", "/connectors/shapes/topics"), ("PUT", "/connectors/shapes/topics/reset")):
        status, _, body = http(method, base + path)
        assert (status, body) == (403, {"error_code": 403, "message": "Topic tracking is disabled."})
    with urllib.request.urlopen(urllib.request.Request(f"{base}/connectors", method="HEAD"),
                                timeout=30) as resp:
        assert resp.status == 200 and resp.read() == b""
    assert http("PUT", f"{base}/connectors/shapes/stop")[0] == 204
    status, _, body = http("PATCH", f"{base}/connectors/shapes/offsets", {"offsets": []})
    assert (status, body["message"]) == (400, "Partitions / offsets need to be provided for an "
                                              "alter offsets request")
    assert http("DELETE", f"{base}/connectors/shapes")[0] == 204


def test_a_body_of_another_content_type_is_refused_with_415(workers: Workers) -> None:
    """As Kafka Connect (Jersey's @Consumes(application/json)): curl -d without a
    Content-Type sends application/x-www-form-urlencoded, which is refused, not read."""
    base = workers.urls["w1"]
    body = json.dumps(connector(workers, "typed", tasks=1)).encode()
    for ctype in ("application/x-www-form-urlencoded", "text/plain"):
        req = urllib.request.Request(f"{base}/connectors", data=body, method="POST",
                                     headers={"Content-Type": ctype})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 415
        assert json.loads(err.value.read()) == {"error_code": 415,
                                                "message": "HTTP 415 Unsupported Media Type"}
    assert "typed" not in http("GET", f"{base}/connectors")[2]
    req = urllib.request.Request(f"{base}/connectors", data=body, method="POST",
                                 headers={"Content-Type": "application/json; charset=utf-8"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 201
    assert http("DELETE", f"{base}/connectors/typed")[0] == 204


def test_a_body_larger_than_the_coordinator_takes_is_refused_at_once(workers: Workers) -> None:
    """A config the coordinator's frame limit (1 MiB by default) cannot carry: 413 with the
    limit, not a retry loop the coordinator ends by closing the worker's connection each time
    and a misleading 409 ("retry later") after the request timeout."""
    base = workers.urls["w1"]
    config = {"connector.class": PLUGIN, "tasks.max": "1", "big": "x" * 2 * 1024 * 1024}
    status, _, body = http("PUT", f"{base}/connectors/huge/config", config)
    assert status == 413 and "1048576" in body["message"], (status, body)  # (the body itself)
    assert "huge" not in http("GET", f"{base}/connectors")[2]
    # Each body fits, the connector they make does not: a PATCH adding to a big config.
    status, _, body = http("PUT", f"{base}/connectors/huge/config", {**config, "big": "x" * 600_000})
    assert status == 201, body
    status, _, body = http("PATCH", f"{base}/connectors/huge/config", {"more": "y" * 600_000})
    assert status == 413 and body["error_code"] == 413, (status, body)
    assert "1048576" in body["message"], body
    assert "more" not in http("GET", f"{base}/connectors/huge/config")[2]
    assert http("DELETE", f"{base}/connectors/huge")[0] == 204


def test_a_body_that_never_arrives_is_answered_408(workers: Workers) -> None:
    """A client that sends part of its body and then nothing: 408 once the request timeout
    (5 s here) has passed, not a connection and a buffer held for as long as the client likes."""
    host, port = workers.urls["w1"].removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(b"PUT /connectors/slow/config HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 1000\r\n\r\n{\"connector.class\": ")
        answer = s.recv(4096)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), answer
    assert json.loads(body) == {"error_code": 408,
                                "message": "The request body was not received within 5 s"}


def test_idle_connections_are_bounded(workers: Workers) -> None:
    """Connections that never finish a request (slowloris) cannot take the worker's file
    descriptors: past MAX_CONNECTIONS a new one is answered 503 and closed at once; once they
    go, the worker serves again."""
    from worker_client.rest import MAX_CONNECTIONS

    pid = workers.procs["w1"].pid
    before = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    url = workers.urls["w1"].removeprefix("http://")
    host, port = url.rsplit(":", 1)
    idle: list[socket.socket] = []
    try:
        for n in range(MAX_CONNECTIONS + 150):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"GET /connectors HTTP/1.1\r\nHost: x\r\n")  # (never finished)
            idle.append(s)
            if n % 50 == 49:
                time.sleep(0.2)  # (within the listen backlog)
        time.sleep(2.0)  # (the ones turned away are closed within a second)
        grown = len(list(Path(f"/proc/{pid}/fd").iterdir())) - before
        assert grown <= MAX_CONNECTIONS + 10, grown
        answers = []
        for s in idle:
            s.settimeout(0.05)
            try:
                answers.append(s.recv(4096))
            except TimeoutError:  # (served: waiting for the rest of its request)
                answers.append(None)
        busy = [a for a in answers if a is not None]
        assert all(a.startswith(b"HTTP/1.1 503 ") for a in busy), busy[:3]
        assert len(busy) >= len(idle) - MAX_CONNECTIONS, len(busy)
    finally:
        for s in idle:
            s.close()
    until(lambda: healthy(workers.urls["w1"]), "w1 serving again", workers)


def _outcome(method: str, url: str, body: Any = None) -> tuple[str, Any]:
    """("answer", status) or ("connection error" | "timeout", the exception's repr)."""
    try:
        return "answer", http(method, url, body)[0]
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return ("timeout" if isinstance(reason, TimeoutError) else "connection error"), repr(exc)


def test_worker_killed_mid_request_and_another_worker_answers_consistently(workers: Workers) -> None:
    """kill -9 of a worker while a create, a config update and a status read are inside it
    (each waiting for the coordinator, held by a SIGSTOP of the daemon shorter than the
    session): each client gets a connection error at once, not a hang until its timeout; the
    other worker then shows each change either fully applied or not at all, and retrying them
    there works (POST 201, or 409 if the first one had been applied; PUT 200)."""
    base = workers.urls["w1"]
    kept = connector(workers, "kept", tasks=1, **{"record.tag": "v1"})
    assert http("POST", f"{base}/connectors", kept)[0] == 201
    workers.spawn("victim")
    victim_url = workers.urls["victim"]
    victim = workers.procs.pop("victim")  # (killed here: not one of the module's clean exits)
    try:
        until(lambda: healthy(victim_url), "the victim healthy", workers)
        born = connector(workers, "born", tasks=1)
        update = {**kept["config"], "record.tag": "v2"}
        calls = {"create": ("POST", f"{victim_url}/connectors", born),
                 "update": ("PUT", f"{victim_url}/connectors/kept/config", update),
                 "status": ("GET", f"{victim_url}/connectors/kept/status", None)}
        with ThreadPoolExecutor(len(calls)) as pool:
            workers.daemon.proc.send_signal(signal.SIGSTOP)
            try:
                futures = {name: pool.submit(_outcome, *call) for name, call in calls.items()}
                time.sleep(0.4)  # (the victim reads each request and asks the paused coordinator)
                victim.kill()
                victim.wait(10)
            finally:
                workers.daemon.proc.send_signal(signal.SIGCONT)
            outcomes = {name: f.result(timeout=60) for name, f in futures.items()}
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    assert {name: kind for name, (kind, _) in outcomes.items()} == dict.fromkeys(calls, "connection error"), \
        outcomes

    # The other worker: every change fully applied or not at all ...
    status, _, body = http("GET", f"{base}/connectors/born/config")
    assert status == 404 or (status, body) == (200, {**born["config"], "name": "born"}), (status, body)
    created_before = status == 200
    got = http("GET", f"{base}/connectors/kept/config")[2]
    assert got in ({**kept["config"], "name": "kept"}, {**update, "name": "kept"}), got
    # ... and the same requests retried there work.
    assert http("POST", f"{base}/connectors", born)[0] == (409 if created_before else 201)
    assert http("GET", f"{base}/connectors/born/config")[2] == {**born["config"], "name": "born"}
    status, _, body = http("PUT", f"{base}/connectors/kept/config", update)
    assert status == 200 and body["config"]["record.tag"] == "v2"
    assert http("GET", f"{base}/connectors/kept/config")[2] == {**update, "name": "kept"}
    assert http("GET", f"{base}/connectors/kept/status")[0] == 200
    for name in ("born", "kept"):
        assert http("DELETE", f"{base}/connectors/{name}")[0] == 204


def _describes(workers: Workers) -> float:
    """ConnectGroupDescribe requests the coordinator answered so far (its /metrics)."""
    assert workers.daemon.metrics_url is not None
    with urllib.request.urlopen(workers.daemon.metrics_url, timeout=30) as resp:
        text = resp.read().decode()
    return sum(float(v) for v in re.findall(
        r'^connect_coordinator_requests_total\{api="ConnectGroupDescribe",[^}]*\} (\S+)$', text, re.M))


def test_concurrent_reads_share_the_describes(workers: Workers) -> None:
    """Reads that come in together share one ConnectGroupDescribe in flight (each one queued in
    the group's partition ahead of the members' heartbeats: one per request used to be sent),
    and every answer is still that of a Describe sent after the read came in."""
    base = workers.urls["w1"]
    assert http("POST", f"{base}/connectors", connector(workers, "shared", tasks=1))[0] == 201
    n = 40
    start = threading.Barrier(n)

    def read(i: int) -> tuple[int, Any]:
        start.wait()
        path = "/connectors/shared/status" if i % 2 else "/connectors?expand=status"
        status, _, body = http("GET", base + path)
        return status, body

    before = _describes(workers)
    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(read, range(n)))
    sent = _describes(workers) - before
    assert [status for status, _ in answers] == [200] * n, answers
    assert all((body if i % 2 else body["shared"]["status"])["name"] == "shared"
               for i, (_, body) in enumerate(answers))
    assert sent <= n // 2, f"{sent:g} Describes for {n} concurrent reads"
    # A write then a read: the read sees it (its Describe was sent after the write ended).
    update = {**connector(workers, "shared", tasks=1)["config"], "record.tag": "v2"}
    for tag in ("v2", "v3"):
        assert http("PUT", f"{base}/connectors/shared/config", {**update, "record.tag": tag})[0] == 200
        assert http("GET", f"{base}/connectors/shared/config")[2]["record.tag"] == tag
    assert http("DELETE", f"{base}/connectors/shared")[0] == 204


def test_offsets_change_while_the_stopped_tasks_stop_answers_409_with_the_coordinators_refusal(
        workers: Workers) -> None:
    """PATCH .../offsets right after PUT .../stop while the task is still in its stop() (a slow
    stop, within its stop budget): asked again until the request timeout, then 409 with the
    coordinator's refusal naming the worker it waits for (it answered each time: not "did
    not answer"); once the stop has ended the same PATCH succeeds."""
    group, rest = "rest-slow-stop", _free_port()
    cmd = [sys.executable, "-m", "worker_client.cli", "run", "--bootstrap", workers.daemon.bootstrap,
           "--group", group, "--instance-id", "slow", "--rest-listen", f"127.0.0.1:{rest}",
           "--rest-request-timeout-ms", "1000", "--task-shutdown-graceful-timeout-ms", "30000"]
    with open(workers.base / "worker-slow.log", "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                env=daemon_env(), cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{rest}"
        until(lambda: healthy(url), "the slow worker healthy", workers)
        config = {"connector.class": "worker_client.examples.recording:RecordingConnector",
                  "tasks.max": "1", "record.file": str(workers.records), "stop.delay.ms": "4000"}
        assert http("POST", url + "/connectors", {"name": "slow", "config": config})[0] == 201
        until(lambda: http("GET", url + "/connectors/slow/status")[2]["tasks"][:1] == [
            {"id": 0, "state": "RUNNING", "worker_id": f"127.0.0.1:{rest}"}], "slow running", workers)
        assert http("PUT", url + "/connectors/slow/stop")[0] == 204
        change = {"offsets": [{"partition": {"p": 0}, "offset": {"o": 1}}]}
        status, _, body = http("PATCH", url + "/connectors/slow/offsets", change)
        assert status == 409, body
        assert body["message"].startswith("Cannot complete request momentarily: the group's "
                                          "coordinator still answered REBALANCE_IN_PROGRESS: "), body
        assert "still stopping on member(s)" in body["message"] and "(slow)" in body["message"], body
        until(lambda: http("PATCH", url + "/connectors/slow/offsets", change)[0] == 200,
              "the offsets changed once the stop ended", workers)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, workers.logs()
