"""A group of OpenAI-compatible inference servers of one model: start, watch, restart, stop.

`ServerGroup` starts one server per port (command lines from `fuelline.serve.engines`; each
server's process and log: `fuelline.serve.server`), each with a parent-death signal on Linux so
it goes when the launcher goes, even by SIGKILL. Start-up waits until every server answers
`GET /v1/models` with 200 (`fuelline.serve.network`); a server that exits first fails the start
with the tail of its log, and everything started is stopped again. Then the group writes the
servers file that regeneration clients read (`fuelline.serve.servers_file`). Stopping touches
exactly the processes the group started (`fuelline.serve.processes` says how).

The keep-healthy loop (`keep_healthy`, or `start_monitor` in a thread) checks every server's
process and `/v1/models` every few seconds; a server whose process died is started again on
the same port and GPUs, its log appended, after a backoff of 1, 2, 4, … 60 s (reset once it has
been healthy for a minute), and the servers file is rewritten with the new pid. A server that
is alive but does not answer is reported, not restarted: it may be busy, and killing it would
lose its requests. Linux sends the parent-death signal when the *thread* that started a
process ends, so servers are started by the main thread, or else by a thread of the group's
own that lives until `stop()` (a restart by the monitor thread, a group built in a worker).
"""
from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Self

from fuelline.model_source import CONFIG_ONLY, resolve_model
from fuelline.pipeline.options import Options, option
from fuelline.serve import engines
from fuelline.serve.network import cannot_listen, probe_models, served_name, server_url
from fuelline.serve.processes import describe_exit, exit_status, signal_group
from fuelline.serve.server import Server
from fuelline.serve.servers_file import read_servers_file, remove_servers_file, write_servers_file

__all__ = ["EngineNotInstalled", "ServeConfig", "Server", "ServerGroup", "ServerStartError", "read_servers_file"]

HEALTHY_RESET_S = 60.0  # a server healthy this long starts its backoff from 1 s again
MAX_BACKOFF_S = 60.0


class ServerStartError(RuntimeError):
    """A server did not come up; the message holds the tail of its log."""


class EngineNotInstalled(RuntimeError):
    """The engine's module or program is not in this environment."""


@dataclass
class ServeConfig(Options):
    """The options of `fuelline serve`, declared once; a pipeline's regenerate step takes them as
    `serve_*` keys for the servers it starts for itself."""

    engine: str = option("transformers", "sglang, vllm, or transformers (`transformers serve`, also on CPU)",
                         choices=list(engines.ENGINES), identity=False)
    model: str = option("", "model directory or hub id, as the engine takes it", required=True)
    ports: str = option("30000", "one server per port: a range 30000-30007 or a list 30000,30002", identity=False)
    gpus_per_server: int = option(1, "consecutive GPUs per server (tensor parallel when > 1); 0: CPU servers. "
                                  "Without GPUs, servers run on CPU", identity=False, min=0)
    host: str = option("127.0.0.1", "address the servers listen on", identity=False)
    startup_timeout: float = option(600.0, "seconds for every server to answer GET /v1/models", identity=False,
                                    min=1)


class ServerGroup:
    """N servers of one model, one per port; a context manager that starts them and stops them.

    `gpus` overrides the GPUs to spread over (default: CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`);
    `env` is added to each server's environment; `on_event` receives one line per event.
    """

    def __init__(self, engine: str, model: str, ports, host: str = "127.0.0.1", gpus_per_server: int = 1,
                 log_dir: str | os.PathLike | None = None, extra_args=(), servers_file: str | os.PathLike | None = None,
                 startup_timeout: float = 600.0, grace: float = 15.0, env: dict[str, str] | None = None,
                 gpus: list[str] | None = None, on_event: Callable[[str], None] | None = None):
        if engine not in engines.ENGINES:
            raise ValueError(f"unknown engine {engine!r}: choose one of {', '.join(engines.ENGINES)}")
        self.engine, self.host = engine, host
        self.model_path = os.path.expanduser(str(model))
        self.ports = engines.parse_ports(ports)
        self.log_dir = Path(log_dir) if log_dir is not None else engines.default_log_dir(self.model_path)
        self.servers_file = Path(servers_file) if servers_file is not None else self.log_dir / "servers.json"
        self.extra_args = tuple(extra_args)
        available = engines.visible_gpus() if gpus is None else list(gpus)
        self._hide_gpus = bool(available) and gpus_per_server == 0
        assigned = engines.assign_gpus(len(self.ports), gpus_per_server, available)
        self.servers = [
            Server(port=port, gpus=ids, log=self.log_dir / f"server-{port}.log", url=server_url(host, port),
                   argv=engines.server_command(engine, self.model_path, host, port, len(ids), self.extra_args))
            for port, ids in zip(self.ports, assigned)
        ]
        self.model = self.model_path  # replaced by what /v1/models reports once started
        self.started_at: str | None = None
        self.startup_timeout, self._grace, self._env, self._on_event = startup_timeout, grace, dict(env or {}), on_event
        self.events: list[str] = []  # one line per event, as `on_event` receives them
        self._lock = threading.RLock()
        self._monitor: threading.Thread | None = None
        self._monitor_stop = threading.Event()
        self._hurry = threading.Event()
        self._spawner: concurrent.futures.ThreadPoolExecutor | None = None  # see _spawn

    @classmethod
    def of(cls, config: ServeConfig, **where) -> ServerGroup:
        """The servers `config` describes; `where`: log_dir, servers_file and the other keywords of `__init__`."""
        if not config.model:
            raise ValueError("no model to serve: give --model (a model directory or hub id)")
        return cls(config.engine, config.model, config.ports, host=config.host, gpus_per_server=config.gpus_per_server,
                   startup_timeout=config.startup_timeout, **where)

    # -- the public face ---------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def processes(self) -> list[subprocess.Popen | None]:
        return [s.process for s in self.servers]

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Start every server and wait until all answer; on any failure stop them all and raise."""
        self._check_can_start()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for server in self.servers:
                self._spawn(server)
                gpus = f"GPU {','.join(server.gpus)}" if server.gpus else "CPU"
                self._event(f"server {server.port}: starting, pid {server.process.pid}, {gpus}, log {server.log}")
            self._wait_until_healthy(self.servers, self.startup_timeout)
            self.model = served_name(self.servers[0].url, self.model_path)
            self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
            self._write_servers_file()
        except BaseException:
            self._stop_all()
            raise

    def stop(self) -> None:
        """Stop the monitor, then every server (SIGTERM to its group, SIGKILL after the grace period)."""
        self.stop_monitor()
        self._stop_all()
        remove_servers_file(self.servers_file, self.started_at)
        if self._spawner is not None:
            self._spawner.shutdown()
            self._spawner = None

    def hurry(self) -> None:
        """Make a running or coming `stop()` skip what is left of the grace period."""
        self._hurry.set()

    # -- keeping them healthy -----------------------------------------------------------------

    def keep_healthy(self, interval: float = 5.0, stop: threading.Event | None = None) -> None:
        """Check every `interval` seconds (every 0.5 s while a server is down) until `stop` is set."""
        stop = stop or threading.Event()
        while not stop.is_set():
            self.check()
            busy = any(s.state in ("exited", "starting") for s in self.servers)
            stop.wait(min(interval, 0.5) if busy else interval)

    def start_monitor(self, interval: float = 5.0) -> None:
        """Run `keep_healthy` in a daemon thread until `stop()` or `stop_monitor()`."""
        if self._monitor is not None:
            return
        self._monitor_stop.clear()
        self._monitor = threading.Thread(target=self.keep_healthy, args=(interval, self._monitor_stop),
                                         name="fuelline-serve-monitor", daemon=True)
        self._monitor.start()

    def stop_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor_stop.set()
            self._monitor.join()
            self._monitor = None

    def check(self) -> None:
        """One round of the keep-healthy loop over every server."""
        for server in self.servers:
            with self._lock:
                self._check_one(server, time.monotonic())

    def _check_one(self, server: Server, now: float) -> None:
        if server.state in ("stopped", "new") or server.process is None:
            return
        if server.state == "exited":
            if now >= server.restart_at:
                self._spawn(server)
                self._write_servers_file()  # the new pid
                self._event(f"server {server.port}: restarted, pid {server.process.pid} "
                            f"(start {server.starts}); log {server.log}")
            return
        code = exit_status(server.process)
        if code is not None:
            server.terminate(self._grace, self._hurry)  # whatever it left in its process group, then reap it
            server.failures += 1
            delay = min(MAX_BACKOFF_S, 2.0 ** (server.failures - 1))
            server.restart_at = now + delay
            server.set_state("exited", now)
            self._event(f"server {server.port}: process exited with {describe_exit(code)}; "
                        f"restarting in {delay:g} s\n{server.log_tail(5)}")
            return
        answered = probe_models(server.url) is not None
        if answered and server.state != "healthy":
            self._event(f"server {server.port}: healthy, pid {server.process.pid}"
                        + (" (answering again)" if server.state == "unresponsive" else ""))
            server.set_state("healthy", now)
        elif answered and now - server.since > HEALTHY_RESET_S:
            server.failures = 0
        elif not answered and server.state == "healthy":
            server.set_state("unresponsive", now)
            self._event(f"server {server.port}: process {server.process.pid} runs but GET /v1/models does not "
                        f"answer; left running")
        elif not answered and server.state == "starting" and now - server.since > self.startup_timeout:
            self._event(f"server {server.port}: no answer {self.startup_timeout:g} s after its start; "
                        f"stopping it to start again")
            server.terminate(self._grace, self._hurry)  # next round sees an exited process and restarts it with backoff

    # -- processes ----------------------------------------------------------------------------

    def _check_can_start(self) -> None:
        missing = engines.engine_missing(self.engine)
        if missing:
            raise EngineNotInstalled(missing)
        resolve_model(self.model_path, CONFIG_ONLY)  # a typo: one line now, not an engine retrying the Hub
        for server in self.servers:
            problem = cannot_listen(self.host, server.port)
            if problem:
                raise ValueError(f"cannot start a server on {self.host}:{server.port}: {problem}")

    def _spawn(self, server: Server) -> None:
        """Start server's process from a thread that lives as long as the group (its parent-death
        signal fires when the starting thread ends): the main thread, else the group's own."""
        if threading.current_thread() is threading.main_thread():
            server.start(self._env, self._hide_gpus)
            return
        with self._lock:
            if self._spawner is None:
                self._spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fuelline-serve-spawn")
        self._spawner.submit(server.start, self._env, self._hide_gpus).result()

    def _wait_until_healthy(self, servers: list[Server], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(servers)
        while waiting:
            for server in list(waiting):
                code = exit_status(server.process)
                if code is not None:
                    raise ServerStartError(
                        f"the {self.engine} server of {self.model_path} on port {server.port} exited with "
                        f"{describe_exit(code)} while starting; last lines of {server.log}:\n{server.log_tail()}")
                if probe_models(server.url) is not None:
                    server.set_state("healthy")
                    self._event(f"server {server.port}: healthy, pid {server.process.pid}")
                    waiting.remove(server)
            if waiting and time.monotonic() > deadline:
                first = waiting[0]
                raise ServerStartError(
                    f"no answer to GET /v1/models from port(s) {', '.join(str(s.port) for s in waiting)} within "
                    f"{timeout:g} s (raise --startup-timeout for a large model); last lines of {first.log}:\n"
                    f"{first.log_tail()}")
            if waiting:
                time.sleep(0.25)

    def _stop_all(self) -> None:
        with self._lock:
            running = [s for s in self.servers if s.process is not None and s.process.returncode is None]
            for server in running:  # all get SIGTERM at once, so the grace periods overlap
                signal_group(server.process.pid, signal.SIGTERM)
            for server in running:
                server.terminate(self._grace, self._hurry)
                server.set_state("stopped")

    # -- bookkeeping --------------------------------------------------------------------------

    def _write_servers_file(self) -> None:
        write_servers_file(self.servers_file, engine=self.engine, model=self.model, model_path=self.model_path,
                           host=self.host, started=self.started_at, servers=self.servers)

    def _event(self, line: str) -> None:
        self.events.append(line)
        if self._on_event is not None:
            self._on_event(line)
