"""Processes on this machine, from /proc: is a pid alive, and is it still the same process (its
start time), so that a pid reused by another process is not mistaken for the one that was recorded.
Evidence for leases (`leases.py`) and for leftovers of dead processes (`artifact_tree.py`)."""

from __future__ import annotations

import os


def process_start_ticks(pid: int) -> int | None:
    """Start time of a live process (clock ticks since boot, /proc/<pid>/stat field 22); None if
    there is no such process or it is a zombie."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = data[data.rindex(")") + 2 :].split()  # comm may hold spaces and parentheses
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def process_alive(pid: int, start_ticks: int | None = None) -> bool:
    """Alive, and (if given) the same process: same start time, so a reused pid does not count."""
    now = process_start_ticks(pid)
    return now is not None and (start_ticks is None or now == start_ticks)


_BOOT_TIME: float | None = None


def process_start_epoch(pid: int) -> float | None:
    global _BOOT_TIME
    ticks = process_start_ticks(pid)
    if ticks is None:
        return None
    if _BOOT_TIME is None:
        with open("/proc/stat") as f:
            _BOOT_TIME = float(next(line.split()[1] for line in f if line.startswith("btime")))
    return _BOOT_TIME + ticks / os.sysconf("SC_CLK_TCK")
