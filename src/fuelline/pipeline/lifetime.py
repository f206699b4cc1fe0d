"""Worker processes that die with their parent.

A worker would otherwise outlive a parent killed by SIGKILL (the kernel's out-of-memory killer,
a scheduler): blocked on a lock or a pipe it keeps its memory, and it may still be writing into
the output directory a resumed run is writing. So each worker

1. asks Linux to send it SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG), checking right
   after that the parent has not died already, and
2. runs a watchdog thread that ends the process once its parent process id changes (the orphan
   was re-parented): the fallback where there is no prctl, and where the parent's thread that
   started the worker has ended (Linux signals on that thread's death, not the process's).

Threads inside a worker (a tokenizer's thread pool) go with their process. The resource tracker
of multiprocessing exits by itself once every holder of its pipe, the workers included, is gone.

Ctrl-C reaches every process of the terminal's group. The parent says how to resume; a worker
ends without a word: it starts with SIGINT ignored (`spawning_workers`; an ignored signal stays
ignored across exec, and Python then installs no handler of its own), so that its imports are
never interrupted, and exits quietly on SIGINT once started (`quiet_on_interrupt`); the parent
holds a Ctrl-C of those moments back until its workers have started. What it left
half written is a temp file, which the resumed run removes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from multiprocessing import resource_tracker
from typing import Iterator

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
INTERRUPTED_EXIT = 130  # the shell's code for SIGINT
WATCH_INTERVAL_S = 1.0


def die_with_parent(parent_pid: int, interval: float = WATCH_INTERVAL_S) -> None:
    """Make this process end when process `parent_pid`, its parent, ends."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still applies
    if os.getppid() != parent_pid:  # the parent died before the signal was asked for
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid, interval), name="fuelline-parent-watch",
                     daemon=True).start()


def _watch_parent(parent_pid: int, interval: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(interval)
    os._exit(1)


@contextmanager
def spawning_workers() -> Iterator[None]:
    """SIGINT ignored while this process starts a worker, so that it starts with it ignored, and
    blocked meanwhile, so that a Ctrl-C in those milliseconds waits here (unless a thread of this
    process that does not block it, a library's, takes it: then it is lost, and the next is heard)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread sets handlers
        yield
        return
    resource_tracker.ensure_running()  # started before, not within: starting it unblocks SIGINT again
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def quiet_on_interrupt() -> None:
    """In a worker: end on SIGINT at once and without a traceback (the parent reports the interrupt)."""
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(INTERRUPTED_EXIT))
