"""A peer worker written the way a tooz user would: one process of the ``python -m bench peers``
comparison. Private (``_``): started by ``bench/peers.py``, not a benchmark.

    python -m bench._tooz_worker --url redis://127.0.0.1:PORT?membership_timeout=3 \\
        --group G --member-id w1-r0 --name w1 --tasks 16 --prefix job --poll 1.0 --record FILE

It does what the tooz documentation suggests for spreading work over a group:

* ``tooz.coordination.get_coordinator(url, member_id)``, ``start(start_heart=True)``: tooz's own
  heart thread keeps the member's Redis key alive (it beats every ``membership_timeout / 2``);
* ``join_partitioned_group(group)``: join (creating the group if needed) and get a
  :class:`tooz.partitioner.Partitioner`, a consistent hash ring over the members, kept up to
  date by ``watch_join_group`` / ``watch_leave_group`` callbacks;
* every ``--poll`` seconds, ``run_watchers()`` (which reads the group and drops members whose
  key expired), then the tasks it owns are ``{t : partitioner.belongs_to_self(t)}``; it stops
  the tasks it no longer owns, then starts the ones it newly owns.

A member that finds itself gone from the ring (its key expired while it was paused or cut off,
and another member removed it) stops everything it runs and joins again under the same id;
the next ``run_watchers()`` puts it back in its ring. That is the best a tooz user can do: tooz
has no epochs and no fencing, so until this process runs its next poll it keeps believing it
owns its tasks. Nothing here is slowed down or made worse on purpose.

On stdout (the benchmark's log of it) it prints ``joined ...`` once it is in the group and
``ring ...`` whenever its view of the members changes.

Each start and stop is one JSON line in the same format as the bundled recording plugin of the
worker client (``worker_client.examples.recording``, whose writer is reused), so one analysis
(``bench/_records.py``) covers both systems. SIGTERM or SIGINT: stop every task (recording the
stops), leave the group, exit 0.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from worker_client.examples.recording import _record


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench._tooz_worker", description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="tooz backend URL (redis://HOST:PORT?membership_timeout=S)")
    p.add_argument("--group", required=True, help="tooz group id")
    p.add_argument("--member-id", required=True, help="tooz member id (unique per group)")
    p.add_argument("--name", required=True, help="the worker's name in the records")
    p.add_argument("--tasks", type=int, required=True, help="number of tasks: PREFIX/0 .. PREFIX/N-1")
    p.add_argument("--prefix", default="job", help="task name prefix (default job)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between run_watchers() calls")
    p.add_argument("--record", required=True, help="the start/stop record file (JSON lines, appended)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from tooz import coordination

    group = args.group.encode()
    me = args.member_id.encode()
    tasks = [f"{args.prefix}/{i}" for i in range(args.tasks)]
    record_config: dict[str, str | None] = {"record.file": args.record, "worker.id": args.name}
    running: set[str] = set()
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())

    def apply(owned: set[str]) -> None:
        for task in sorted(running - owned):  # stop what moved away first ...
            running.discard(task)
            _record(record_config, task, "stop")
        for task in sorted(owned - running):  # ... then start what is new
            running.add(task)
            _record(record_config, task, "start")

    coordinator = coordination.get_coordinator(args.url, me)
    coordinator.start(start_heart=True)
    coordinator.heartbeat()  # our key exists before we are listed in the group
    partitioner = coordinator.join_partitioned_group(group)
    print(f"joined {args.name} as {args.member_id}", flush=True)
    ring: list[bytes] = []
    try:
        while not stopping.is_set():
            coordinator.run_watchers()
            if sorted(partitioner.ring.nodes) != ring:  # for the log: what this member sees
                ring = sorted(partitioner.ring.nodes)
                print(f"ring {b' '.join(ring).decode()}", flush=True)
            if me not in partitioner.ring.nodes:
                # Removed from the group (our key expired: we were paused or cut off). Whatever
                # we ran is someone else's now: stop it all, then join again.
                apply(set())
                try:
                    coordinator.join_group(group, capabilities={"weight": 1}).get()
                except coordination.MemberAlreadyExist:
                    pass
            else:
                apply({t for t in tasks if partitioner.belongs_to_self(t)})
            stopping.wait(args.poll)
    finally:
        apply(set())
        try:
            coordinator.leave_partitioned_group(partitioner)
        except Exception as exc:  # leaving is best effort; the key expires anyway
            print(f"leave failed: {exc!r}", file=sys.stderr)
        coordinator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
