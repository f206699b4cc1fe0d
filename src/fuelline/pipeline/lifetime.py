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
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
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
