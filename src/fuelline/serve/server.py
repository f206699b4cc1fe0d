"""One server of a group: its port, GPUs and command line, the process that runs it now, its
log, and its state in the launcher's keep-healthy loop.

Each start appends a header line and then the process's stdout and stderr to the server's log
(`LOG_DIR/server-PORT.log`), so the log of a restarted server holds every start; `log_tail`
reads only what the current process wrote. The process runs in a session and process group of
its own, behind the parent-death signal of `fuelline.serve.processes`, which says how it is stopped.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from fuelline.serve import engines
from fuelline.serve.processes import signal_group, wait_group_gone, with_parent_death_signal

LOG_TAIL_LINES = 25


@dataclass
class Server:
    """One server of a group; `process` is the current one, replaced on restart."""

    port: int
    gpus: list[str]
    argv: list[str]
    log: Path
    url: str
    process: subprocess.Popen | None = None
    log_offset: int = 0  # where the current process's output starts in the log
    state: str = "new"  # starting, healthy, unresponsive, exited, stopped
    since: float = 0.0  # when it entered its state
    starts: int = 0
    failures: int = 0  # exits since it was last healthy for a while, for the launcher's backoff
    restart_at: float = 0.0

    def set_state(self, state: str, now: float | None = None) -> None:
        self.state, self.since = state, time.monotonic() if now is None else now

    def start(self, env: dict[str, str], hide_gpus: bool) -> None:
        """Start the server's process, appending to its log; `env` is added to this process's
        environment, `hide_gpus` shows a server without GPUs none. In the main thread signals are
        blocked meanwhile, so a Ctrl-C cannot fall between the fork and `process` being set."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        if self.gpus or hide_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        argv = engines.resolve_program(self.argv)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        blocked = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        in_main = threading.current_thread() is threading.main_thread()
        with open(self.log, "ab") as log:
            self.log_offset = log.seek(0, os.SEEK_END)
            self.starts += 1
            log.write(f"==== fuelline serve, {datetime.now().isoformat(timespec='seconds')}: start "
                      f"{self.starts} of the server on port {self.port}: {shlex.join(argv)}\n".encode())
            log.flush()
            if in_main:
                signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
            try:
                self.process = subprocess.Popen(
                    with_parent_death_signal(argv), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                )
            finally:
                if in_main:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        self.set_state("starting")

    def terminate(self, grace: float, hurry: threading.Event | None) -> None:
        """SIGTERM to the server's process group, SIGKILL after `grace` seconds (or as soon as
        `hurry` is set); then reap it. Nothing when no process of it runs."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        pgid = process.pid  # start_new_session: the server leads its own group; unreaped, so still ours
        signal_group(pgid, signal.SIGTERM)
        if not wait_group_gone(process, grace, hurry):
            signal_group(pgid, signal.SIGKILL)
            wait_group_gone(process, 10.0, None)
        process.wait()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines the current process wrote to its log, indented."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode("utf-8", "replace")
        except OSError as e:
            return f"    (cannot read the log: {e})"
        # progress bars redraw with \r: keep each line's last state; leave out the health checks' access lines
        kept = [line.rsplit("\r", 1)[-1] for line in text.splitlines()
                if line.strip() and '"GET /v1/models HTTP' not in line]
        return "\n".join("    " + line for line in kept[-lines:]) or "    (the log is empty)"
