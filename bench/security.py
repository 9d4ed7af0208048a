"""Security: the cost of TLS and SASL/SCRAM, side by side with plaintext in one run.

``python -m bench security [--members N] [--connections C] [--workers W] [--repeat N]
[--duration S] [--warmup S] [--output PATH]``

One real daemon (``connect-coordinator serve``, a subprocess) with four listeners: PLAINTEXT,
SSL, SASL_PLAINTEXT and SASL_SSL (a throw-away CA and server certificate made here with the
``cryptography`` package: EC P-256, TLS 1.3 by default; two users added offline with
``connect-coordinator users add``, SCRAM-SHA-256 and -512, 4096 iterations).

* **Handshake cost**: a load process (``bench/_security_load.py``) runs ``--workers``
  concurrent loops of connect, (TLS handshake,) ApiVersions, (SaslHandshake + two
  SaslAuthenticate for SCRAM,) close, for ``--duration`` seconds after ``--warmup``: connections
  per second, connect-to-ready latency, and the daemon's CPU time per connection (utime + stime
  of the daemon process over the run, divided by the connections it served). The SCRAM client
  caches its salted password (the server never runs PBKDF2 for SCRAM), so the client's cost is
  the TLS handshake and a few HMACs.
* **Steady heartbeats over TLS**: ``--members`` simulated workers set up Stable (as ``bench
  throughput``), then ``bench/_loadgen.py`` sends their steady heartbeats over ``--connections``
  connections to the PLAINTEXT, the SSL and the SASL_SSL (SCRAM-SHA-256, authenticated once per
  connection) listeners, in alternating order per repetition; heartbeats per second, latency
  and the daemon's CPU time per heartbeat in the measured window, medians of ``--repeat``. One
  more row: the same members on a second daemon with ``authorizer=acl``, where an ACL allows
  the PLAINTEXT listener's User:ANONYMOUS to READ the group (one ACL decision per heartbeat).

Both load generators run in their own process, on the same machine as the daemon. Headlines:
TLS + SCRAM-SHA-256 connections per second against plaintext, and steady heartbeats per second
over TLS against plaintext. Rows go to ``bench/results/security.json`` (or ``--output``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import (
    RESULTS,
    BenchError,
    Process,
    child_env,
    listeners,
    machine,
    run_loadgen_sampled,
    start_daemon,
)

USERS = {"bench-256": ("SCRAM-SHA-256", "bench-password-256"),
         "bench-512": ("SCRAM-SHA-512", "bench-password-512")}
DAEMON_ENV = {"CONNECT_COORDINATOR_GROUP_CONNECT_SESSION_TIMEOUT_MS": "300000",
              "CONNECT_COORDINATOR_GROUP_CONNECT_HEARTBEAT_INTERVAL_MS": "200",
              "CONNECT_COORDINATOR_GROUP_CONNECT_MAX_SIZE": "1000000",  # (scale, not the cap)
              "CONNECT_COORDINATOR_SOCKET_MAX_CONNECTIONS": "100000"}
HANDSHAKES = (  # (row name, listener, sasl user or None)
    ("PLAINTEXT", "PLAINTEXT", None),
    ("SSL (TLS)", "SSL", None),
    ("SASL_PLAINTEXT SCRAM-SHA-256", "SASL_PLAINTEXT", "bench-256"),
    ("SASL_SSL SCRAM-SHA-256", "SASL_SSL", "bench-256"),
    ("SASL_SSL SCRAM-SHA-512", "SASL_SSL", "bench-512"),
)
HEARTBEATS = (("PLAINTEXT", "PLAINTEXT", None), ("SSL (TLS)", "SSL", None),
              ("SASL_SSL SCRAM-SHA-256", "SASL_SSL", "bench-256"),
              ("PLAINTEXT, authorizer=acl", "PLAINTEXT", None))
ACL_ROW = "PLAINTEXT, authorizer=acl"  # on a second daemon: User:ANONYMOUS allowed by an ACL


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) as PEM files: localhost, 127.0.0.1."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise BenchError("the security benchmark needs the cryptography package "
                         "(pip install -e '.[bench]')") from None
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def add_users(data: Path, workdir: Path) -> None:
    for user, (mechanism, password) in USERS.items():
        pw = workdir / f"{user}.pw"
        pw.write_text(password + "\n", encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "-m", "coordinator.cli", "users", "add", "--data-dir", str(data), user,
             "--mechanism", mechanism, "--password-file", str(pw)],
            capture_output=True, text=True, env=child_env(), timeout=60, check=False)
        if done.returncode != 0:
            raise BenchError(f"users add failed: {done.stderr.strip()}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_json(module: str, spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    path = workdir / f"{module}-spec.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", module, str(path)], capture_output=True,
                          text=True, env=child_env(),
                          timeout=spec["warmup_s"] + spec["duration_s"] + 300, check=False)
    if done.returncode != 0:
        raise BenchError(f"{module} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _loadgen_window(spec: dict[str, Any], workdir: Path, pid: int) -> dict[str, Any]:
    """``bench/_loadgen.py`` in its own process; the daemon's CPU time is sampled when the
    measured window opens and closes (the connections' TLS and SASL set-up, with heartbeats
    already flowing on the first ones, is outside it)."""
    result = run_loadgen_sampled(spec, workdir, lambda: {"cpu": cpu_seconds(pid)})
    result["server_cpu_s"] = result.pop("window").get("cpu", 0.0)
    return result


def _sasl(user: str | None) -> dict[str, str] | None:
    if user is None:
        return None
    mechanism, password = USERS[user]
    return {"mechanism": mechanism, "user": user, "password": password}


def _acl_daemon(workdir: Path, count: int) -> tuple[Process, list[tuple[str, int]]]:
    """A second daemon with ``authorizer=acl``: ACLs let User:ANONYMOUS (its PLAINTEXT
    listener) READ and ALTER the benchmark's group, made with ``acls add`` by a super user
    over SASL_PLAINTEXT; then ``count`` members set up Stable as on the first one."""
    from bench.throughput import GROUP, setup_members
    data = workdir / "acl-data"
    add_users(data, workdir)
    user = "bench-256"
    process, _ = start_daemon(data, extra_env={
        **DAEMON_ENV, "CONNECT_COORDINATOR_AUTHORIZER": "acl",
        "CONNECT_COORDINATOR_SUPER_USERS": f"User:{user}"},
        extra_args=["--listen", "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0"])
    try:
        host, port = listeners(process)["SASL_PLAINTEXT"]
        done = subprocess.run(
            [sys.executable, "-m", "coordinator.cli", "acls", "add", "--bootstrap",
             f"{host}:{port}", "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism",
             USERS[user][0], "--sasl-username", user, "--sasl-password-file",
             str(workdir / f"{user}.pw"), "--allow-principal", "User:ANONYMOUS",
             "--operation", "Read", "--operation", "Alter", "--group", GROUP],
            capture_output=True, text=True, env=child_env(), timeout=60, check=False)
        if done.returncode != 0:
            raise BenchError(f"acls add failed: {done.stderr.strip()}")
        members = asyncio.run(setup_members(*listeners(process)["PLAINTEXT"], count))
    except BaseException:
        process.stop()
        raise
    return process, members


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from bench.throughput import GROUP, setup_members

    ca, cert, key = make_certificates(workdir / "tls")
    data = workdir / "data"
    add_users(data, workdir)
    env = {**DAEMON_ENV, "CONNECT_COORDINATOR_SSL_CERTFILE": str(cert),
           "CONNECT_COORDINATOR_SSL_KEYFILE": str(key)}
    daemon, _ = start_daemon(data, extra_env=env, extra_args=[
        "--listen", "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,"
                    "SASL_SSL://127.0.0.1:0"])
    tls = {"cafile": str(ca)}
    acl_daemon: Process | None = None
    try:
        bound = listeners(daemon)
        handshake_runs: dict[str, list[dict[str, Any]]] = {}
        for rep in range(args.repeat):
            order = HANDSHAKES if rep % 2 == 0 else HANDSHAKES[::-1]
            for name, listener, user in order:
                host, port = bound[listener]
                before = cpu_seconds(daemon.pid)
                result = _run_json("bench._security_load", {
                    "host": host, "port": port, "workers": args.workers, "warmup_s": args.warmup,
                    "duration_s": args.duration, "tls": tls if "SSL" in listener else None,
                    "sasl": _sasl(user)}, workdir)
                _check(daemon, name)
                result["server_cpu_us"] = ((cpu_seconds(daemon.pid) - before) * 1e6
                                           / max(1, result["total_connections"]))
                if result["errors"] or not result["connections"]:
                    raise BenchError(f"{name}: {result['errors']} failed connections, "
                                     f"{result['connections']} made")
                handshake_runs.setdefault(name, []).append(result)
        started = time.perf_counter()
        host, port = bound["PLAINTEXT"]
        members = asyncio.run(setup_members(host, port, args.members))
        acl_daemon, acl_members = _acl_daemon(workdir, args.members)
        setup_s = time.perf_counter() - started
        acl_bound = listeners(acl_daemon)
        heartbeat_runs: dict[str, list[dict[str, Any]]] = {}
        for rep in range(args.repeat):
            order = HEARTBEATS if rep % 2 == 0 else HEARTBEATS[::-1]
            for name, listener, user in order:
                target = acl_daemon if name == ACL_ROW else daemon
                host, port = (acl_bound if name == ACL_ROW else bound)[listener]
                result = _loadgen_window({
                    "host": host, "port": port, "group": GROUP,
                    "members": acl_members if name == ACL_ROW else members,
                    "connections": args.connections, "depth": args.depth,
                    "warmup_s": args.warmup, "duration_s": args.duration, "check": True,
                    "tls": tls if "SSL" in listener else None, "sasl": _sasl(user)}, workdir,
                    target.pid)
                _check(target, name)
                if result["errors"]:
                    raise BenchError(f"{name}: {result['errors']} of {result['checked']} sampled "
                                     f"heartbeat responses carried an error: {result['error_codes']}")
                heartbeat_runs.setdefault(name, []).append(result)
    finally:
        daemon.stop()
        if acl_daemon is not None:
            acl_daemon.stop()
    return {"setup_seconds": round(setup_s, 3),
            "handshakes": [_handshake_row(name, handshake_runs[name]) for name, _, _ in HANDSHAKES],
            "heartbeats": [_heartbeat_row(name, heartbeat_runs[name], args)
                           for name, _, _ in HEARTBEATS]}


def _check(daemon: Process, name: str) -> None:
    if daemon.proc.poll() is not None:
        raise BenchError(f"the daemon exited during {name}:\n{daemon.stderr()[-3000:]}")


def _median(runs: list[dict[str, Any]], key: str, digits: int = 1) -> float:
    return round(statistics.median(r[key] for r in runs), digits)


def _handshake_row(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"listener": name, "per_second": _median(runs, "per_second"),
            "p50_ms": _median(runs, "p50_ms", 2), "p99_ms": _median(runs, "p99_ms", 2),
            "server_cpu_us": _median(runs, "server_cpu_us", 0),
            "runs": [round(r["per_second"], 1) for r in runs]}


def _heartbeat_row(name: str, runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    return {"listener": name, "connections": args.connections, "members": args.members,
            "per_second": _median(runs, "per_second"), "p50_us": _median(runs, "p50_us"),
            "p99_us": _median(runs, "p99_us"),
            "server_cpu_us": round(statistics.median(r["server_cpu_s"] * 1e6 / max(1, r["requests"])
                                                     for r in runs), 1),
            "runs": [round(r["per_second"], 1) for r in runs],
            "checked": sum(r["checked"] for r in runs)}


def render(result: dict[str, Any]) -> str:
    head = (f"{'handshake':>30} {'conns/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'daemon CPU us/conn':>19}")
    lines = [head, "-" * len(head)]
    for r in result["handshakes"]:
        lines.append(f"{r['listener']:>30} {r['per_second']:>9.0f} {r['p50_ms']:>8.2f} "
                     f"{r['p99_ms']:>8.2f} {r['server_cpu_us']:>19.0f}")
    head = (f"{'steady heartbeats':>30} {'conns':>6} {'req/s':>9} {'p50 us':>8} {'p99 us':>8} "
            f"{'daemon CPU us/hb':>17}")
    lines += ["", head, "-" * len(head)]
    for r in result["heartbeats"]:
        lines.append(f"{r['listener']:>30} {r['connections']:>6} {r['per_second']:>9.0f} "
                     f"{r['p50_us']:>8.0f} {r['p99_us']:>8.0f} {r['server_cpu_us']:>17.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench security",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=1_000,
                        help="simulated members for the heartbeat rows (default 1000)")
    parser.add_argument("--connections", type=int, default=100,
                        help="connections of the heartbeat load (default 100)")
    parser.add_argument("--depth", type=int, default=128,
                        help="max heartbeats in flight per connection (default 128)")
    parser.add_argument("--workers", type=int, default=16,
                        help="concurrent connecting loops of the handshake load (default 16)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (median; default 3)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per run")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before measuring")
    parser.add_argument("--output", type=Path, default=RESULTS / "security.json",
                        help="where to write the rows (default bench/results/security.json)")
    args = parser.parse_args(argv)
    if min(args.members, args.connections, args.depth, args.workers, args.repeat) < 1 \
            or args.duration <= 0 or args.warmup < 0:
        parser.error("--members, --connections, --depth, --workers, --repeat must be >= 1, "
                     "--duration > 0, --warmup >= 0")
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-security-") as tmp:
            measured = measure(args, Path(tmp))
    except BenchError as exc:
        print(f"bench security: {exc}", file=sys.stderr)
        return 1
    hs = {r["listener"]: r for r in measured["handshakes"]}
    hb = {r["listener"]: r for r in measured["heartbeats"]}
    conn_ratio = hs["SASL_SSL SCRAM-SHA-256"]["per_second"] / hs["PLAINTEXT"]["per_second"]
    hb_ratio = hb["SSL (TLS)"]["per_second"] / hb["PLAINTEXT"]["per_second"]
    result = {
        "benchmark": "security",
        "unit": "connections per second and steady heartbeats per second (medians); latency at "
                "the client; daemon CPU per connection / per heartbeat",
        "repeat": args.repeat, "duration_s": args.duration, "warmup_s": args.warmup,
        "members": args.members, "connections": args.connections, "depth": args.depth,
        "workers": args.workers, **machine(), **measured,
        "headline": {"connections_tls_scram_over_plaintext": round(conn_ratio, 3),
                     "heartbeats_tls_over_plaintext": round(hb_ratio, 3)},
        "seconds": round(time.perf_counter() - started, 3),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(render(result))
    print(f"(medians of {args.repeat} runs of {args.duration:g} s; handshakes: {args.workers} "
          f"connecting loops; heartbeats: {args.members} Stable members set up in "
          f"{measured['setup_seconds']:.1f} s; load generators in their own processes on "
          f"{machine()['cpus']} CPUs)")
    print(f"(rows written to {args.output})")
    print(f"headline: TLS + SCRAM-SHA-256 / plaintext connections per second: {conn_ratio:.2f} "
          f"({hs['SASL_SSL SCRAM-SHA-256']['per_second']:.0f} / {hs['PLAINTEXT']['per_second']:.0f}); "
          f"steady heartbeats over TLS / plaintext: {hb_ratio:.2f} "
          f"({hb['SSL (TLS)']['per_second']:.0f} / {hb['PLAINTEXT']['per_second']:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
