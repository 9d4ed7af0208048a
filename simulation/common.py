"""Constants every part of the simulator shares: the group's id, "never", the worker's watchdog
period."""

GROUP = "g"
"""The one group every run simulates."""
INF = 1 << 62
"""A time that never comes (a deadline not set, a lease that does not expire)."""
WATCHDOG_MS = 100
"""The real worker's watchdog checks ``check_session`` every 100 ms."""
