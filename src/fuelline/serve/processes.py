"""Processes of the servers a launcher starts: a parent-death signal, exit status without reaping,
process-group membership and signals.

A server's exit is read with `waitid(WNOWAIT)`, which leaves the process unreaped, so its pid,
and with it its process group id, cannot be handed to another process before the launcher has
signalled the group and reaped it: stopping never reaches a process the launcher did not start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>

_TRAMPOLINE = f"""\
import ctypes, os, signal, sys
signal.pthread_sigmask(signal.SIG_SETMASK, [])
ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, int(signal.SIGTERM), 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    sys.exit("fuelline serve: the launcher exited before this server started")
os.execv(sys.argv[2], sys.argv[2:])
"""


def with_parent_death_signal(argv: list[str]) -> list[str]:
    """argv behind the trampoline above on Linux; elsewhere argv itself (no parent-death signal)."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-I", "-S", "-c", _TRAMPOLINE, str(os.getpid()), *argv]


def exit_status(process: subprocess.Popen) -> int | None:
    """The exit code (negative: killed by that signal) without reaping the process, or None if it runs."""
    if process.returncode is not None:
        return process.returncode
    if not hasattr(os, "waitid"):
        return process.poll()
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return process.poll()
    if info is None:
        return None
    return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status


def group_members(pgid: int) -> list[int] | None:
    """Live (not zombie) processes in process group `pgid`, from /proc; None where there is no /proc."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # the process ended while /proc was listed: not a member any more
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def wait_group_gone(process: subprocess.Popen, timeout: float, hurry: threading.Event | None) -> bool:
    """Wait until the leader has exited and no live process is left in its group."""
    deadline = time.monotonic() + timeout
    while True:
        leader_done = exit_status(process) is not None
        members = group_members(process.pid)
        if members is None and leader_done:  # no /proc: after the leader is reaped, ask the kernel
            process.wait()
            members = [process.pid] if group_exists(process.pid) else []
        if leader_done and not members:
            return True
        if time.monotonic() > deadline or (hurry is not None and hurry.is_set()):
            return False
        time.sleep(0.05)


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # every process of the group has exited already: what the signal was for


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
