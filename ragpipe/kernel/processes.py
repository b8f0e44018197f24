"""Which process runs a piece of work: machine identity, process start times, worker tags.

A run records the process that executes it (``worker_tag``); the reaper reads the tag back
(``parse_worker_tag``) to decide whether that process is gone. Plain procfs reads: no framework.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

WORKER = "ragpipe/worker"
_PID = re.compile(r"[0-9]{1,10}")


def machine_id() -> str:
    """This process's machine as the reaper must tell it apart: host name, boot ID and PID
    namespace. Two containers or cloned VMs may share a host name, and a PID means nothing
    outside its namespace and boot."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # no procfs: the host name alone (the reaper then cannot tell reused PIDs either)
        return socket.gethostname()
    return f"{socket.gethostname()}/{boot}/{namespace}"


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot, /proc/<pid>/stat field 22): with the PID
    it names one process, so a reused PID is not mistaken for the worker. None: no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[19]  # the command name may hold spaces and parens


def worker_tag(run_id: str) -> dict[str, str]:
    """``{ragpipe/worker: "<run id>@<machine>:<pid>:<start>"}``: the process executing ``run_id``.

    The value names the run because a re-execution inherits its parent's tags: a copied tag names
    the parent, so it never vouches for (or condemns) the new run (``ragpipe.orchestration.launch.reap_stale_runs``).
    """
    pid = os.getpid()
    return {WORKER: f"{run_id}@{machine_id()}:{pid}:{process_start(pid) or '-'}"}


def parse_worker_tag(value: str | None) -> tuple[str, str, int, str] | None:
    """(run ID, machine, pid, start) of a ``worker_tag`` value; None when absent or malformed."""
    run_id, _, rest = (value or "").partition("@")
    parts = rest.rsplit(":", 2)
    if not run_id or len(parts) != 3 or not parts[0] or not _PID.fullmatch(parts[1]) or not parts[2]:
        return None
    return run_id, parts[0], int(parts[1]), parts[2]
