"""A group of OpenAI-compatible inference servers of one model: start, watch, restart, stop.

`ServerGroup` starts one server per port (command lines from `fuelline.serve.engines`), each
in a session and process group of its own, its stdout and stderr appended to
`LOG_DIR/server-PORT.log`. On Linux every server also gets a parent-death signal (SIGTERM),
so it goes when the launcher goes, even by SIGKILL. Start-up waits until every server answers
`GET /v1/models` with 200; a server that exits first fails the start with the tail of its log,
and everything started is stopped again. Then the group writes the servers file (below) that
regeneration clients read.

Stopping touches exactly the processes the group started: SIGTERM to each server's process
group, SIGKILL to what is left after a grace period. A server's exit is noticed with
`waitid(WNOWAIT)`, which leaves the process unreaped, so its pid, and with it the process
group id, cannot be handed to another process before the group is signalled and reaped.

The keep-healthy loop (`keep_healthy`, or `start_monitor` in a thread) checks every server's
process and `/v1/models` every few seconds; a server whose process died is started again on
the same port and GPUs, its log appended, after a backoff of 1, 2, 4, … 60 s (reset once it has
been healthy for a minute), and the servers file is rewritten with the new pid. A server that
is alive but does not answer is reported, not restarted: it may be busy, and killing it would
lose its requests. Linux sends the parent-death signal when the *thread* that started a
process ends, so servers are started by the main thread, or else by a thread of the group's
own that lives until `stop()` (a restart by the monitor thread, a group built in a worker).

Servers file (JSON, written atomically, removed by `stop()` while it still describes this group):

    {"format": "fuelline.servers", "version": 1, "engine": "transformers", "model": NAME,
     "host": "127.0.0.1", "started": ISO time, "launcher_pid": PID,
     "servers": [{"url": "http://127.0.0.1:30000", "port": 30000, "pid": PID, "log": PATH, "gpus": []}]}

`model` is the name requests must carry: the id the first server's `/v1/models` reports (for
`transformers serve MODEL`, MODEL exactly as given; any other name is answered with 400).
"""

from __future__ import annotations

import concurrent.futures
import errno
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Self

from fuelline.model_source import CONFIG_ONLY, resolve_model
from fuelline.pipeline.options import Options, option
from fuelline.serve import engines
from fuelline.serve.processes import (describe_exit, exit_status, signal_group, wait_group_gone,
                                      with_parent_death_signal)

SERVERS_FORMAT = "fuelline.servers"
SERVERS_VERSION = 1
LOG_TAIL_LINES = 25
PROBE_TIMEOUT_S = 3.0
HEALTHY_RESET_S = 60.0  # a server healthy this long starts its backoff from 1 s again
MAX_BACKOFF_S = 60.0


class ServerStartError(RuntimeError):
    """A server did not come up; the message holds the tail of its log."""


class EngineNotInstalled(RuntimeError):
    """The engine's module or program is not in this environment."""


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
    failures: int = 0  # exits since it was last healthy for HEALTHY_RESET_S, for the backoff
    restart_at: float = 0.0


@dataclass
class _Options:
    startup_timeout: float
    grace: float
    env: dict[str, str]
    on_event: Callable[[str], None] | None
    events: list[str] = field(default_factory=list)


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
        model = str(model)
        self.engine, self.host = engine, host
        self.model_path = os.path.expanduser(model) if model.startswith("~") else model
        self.ports = engines.parse_ports(ports)
        self.log_dir = Path(log_dir) if log_dir is not None else engines.default_log_dir(self.model_path)
        self.servers_file = Path(servers_file) if servers_file is not None else self.log_dir / "servers.json"
        self.extra_args = tuple(extra_args)
        available = engines.visible_gpus() if gpus is None else list(gpus)
        self._hide_gpus = bool(available) and gpus_per_server == 0
        assigned = engines.assign_gpus(len(self.ports), gpus_per_server, available)
        self.servers = [
            Server(port=port, gpus=ids, log=self.log_dir / f"server-{port}.log", url=_url(host, port),
                   argv=engines.server_command(engine, self.model_path, host, port, len(ids), self.extra_args))
            for port, ids in zip(self.ports, assigned)
        ]
        self.model = self.model_path  # replaced by what /v1/models reports once started
        self.started_at: str | None = None
        self._options = _Options(startup_timeout, grace, dict(env or {}), on_event)
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

    @property
    def events(self) -> list[str]:
        return list(self._options.events)

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
            self._wait_until_healthy(self.servers, self._options.startup_timeout)
            self.model = self._served_name(self.servers[0])
            self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
            self._write_servers_file()
        except BaseException:
            self._stop_all()
            raise

    def stop(self) -> None:
        """Stop the monitor, then every server (SIGTERM to its group, SIGKILL after the grace period)."""
        self.stop_monitor()
        self._stop_all()
        self._remove_servers_file()
        if self._spawner is not None:
            self._spawner.shutdown()
            self._spawner = None

    def hurry(self) -> None:
        """Make a running or coming `stop()` skip what is left of the grace period."""
        self._hurry.set()

    def kill_server(self, i: int, sig: int = signal.SIGKILL) -> int:
        """Send `sig` to server i's process only, as a crash would; the monitor restarts it. Returns the pid."""
        process = self.servers[i].process
        if process is None or exit_status(process) is not None:
            raise RuntimeError(f"server {i} (port {self.servers[i].port}) is not running")
        os.kill(process.pid, sig)
        return process.pid

    def restart_server(self, i: int, timeout: float | None = None) -> None:
        """Stop server i if it runs, start it again and wait until it answers."""
        server = self.servers[i]
        with self._lock:
            self._terminate(server)
            self._spawn(server)
        self._wait_until_healthy([server], self._options.startup_timeout if timeout is None else timeout)
        with self._lock:
            self._write_servers_file()

    def healthy(self) -> list[bool]:
        """Whether each server's process runs and its `/v1/models` answers 200 right now."""
        return [s.process is not None and exit_status(s.process) is None and _probe(s.url) is not None
                for s in self.servers]

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
            self._terminate(server)  # whatever it left in its process group, then reap it
            server.failures += 1
            delay = min(MAX_BACKOFF_S, 2.0 ** (server.failures - 1))
            server.restart_at = now + delay
            self._set_state(server, "exited", now)
            self._event(f"server {server.port}: process exited with {describe_exit(code)}; "
                        f"restarting in {delay:g} s\n{_log_tail(server, 5)}")
            return
        answered = _probe(server.url) is not None
        if answered and server.state != "healthy":
            self._event(f"server {server.port}: healthy, pid {server.process.pid}"
                        + (" (answering again)" if server.state == "unresponsive" else ""))
            self._set_state(server, "healthy", now)
        elif answered and now - server.since > HEALTHY_RESET_S:
            server.failures = 0
        elif not answered and server.state == "healthy":
            self._set_state(server, "unresponsive", now)
            self._event(f"server {server.port}: process {server.process.pid} runs but GET /v1/models does not "
                        f"answer; left running")
        elif not answered and server.state == "starting" and now - server.since > self._options.startup_timeout:
            self._event(f"server {server.port}: no answer {self._options.startup_timeout:g} s after its start; "
                        f"stopping it to start again")
            self._terminate(server)  # next round sees an exited process and restarts it with backoff

    # -- processes ----------------------------------------------------------------------------

    def _check_can_start(self) -> None:
        missing = engines.engine_missing(self.engine)
        if missing:
            raise EngineNotInstalled(missing)
        resolve_model(self.model_path, CONFIG_ONLY)  # a typo: one line now, not an engine retrying the Hub
        for server in self.servers:
            problem = _cannot_listen(self.host, server.port)
            if problem:
                raise ValueError(f"cannot start a server on {self.host}:{server.port}: {problem}")

    def _spawn(self, server: Server) -> None:
        """Start server's process from a thread that lives as long as the group (its parent-death
        signal fires when the starting thread ends): the main thread, else the group's own."""
        if threading.current_thread() is threading.main_thread():
            self._spawn_here(server)
            return
        with self._lock:
            if self._spawner is None:
                self._spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fuelline-serve-spawn")
        self._spawner.submit(self._spawn_here, server).result()

    def _spawn_here(self, server: Server) -> None:
        """Start server's process, appending to its log; in the main thread signals are blocked
        meanwhile, so a Ctrl-C cannot fall between the fork and the group recording the process."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self._options.env}
        if server.gpus or self._hide_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(server.gpus)
        argv = engines.resolve_program(server.argv)
        server.log.parent.mkdir(parents=True, exist_ok=True)
        blocked = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        in_main = threading.current_thread() is threading.main_thread()
        with open(server.log, "ab") as log:
            server.log_offset = log.seek(0, os.SEEK_END)
            server.starts += 1
            log.write(f"==== fuelline serve, {datetime.now().isoformat(timespec='seconds')}: start "
                      f"{server.starts} of the server on port {server.port}: {shlex.join(argv)}\n".encode())
            log.flush()
            if in_main:
                signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
            try:
                server.process = subprocess.Popen(
                    with_parent_death_signal(argv), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                )
            finally:
                if in_main:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        self._set_state(server, "starting")

    def _wait_until_healthy(self, servers: list[Server], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(servers)
        while waiting:
            for server in list(waiting):
                code = exit_status(server.process)
                if code is not None:
                    raise ServerStartError(
                        f"the {self.engine} server of {self.model_path} on port {server.port} exited with "
                        f"{describe_exit(code)} while starting; last lines of {server.log}:\n{_log_tail(server)}")
                if _probe(server.url) is not None:
                    self._set_state(server, "healthy")
                    self._event(f"server {server.port}: healthy, pid {server.process.pid}")
                    waiting.remove(server)
            if waiting and time.monotonic() > deadline:
                first = waiting[0]
                raise ServerStartError(
                    f"no answer to GET /v1/models from port(s) {', '.join(str(s.port) for s in waiting)} within "
                    f"{timeout:g} s (raise --startup-timeout for a large model); last lines of {first.log}:\n"
                    f"{_log_tail(first)}")
            if waiting:
                time.sleep(0.25)

    def _terminate(self, server: Server) -> None:
        """SIGTERM to the server's process group, SIGKILL after the grace period; then reap it."""
        process = server.process
        if process is None or process.returncode is not None:
            return
        pgid = process.pid  # start_new_session: the server leads its own group; unreaped, so still ours
        signal_group(pgid, signal.SIGTERM)
        if not wait_group_gone(process, self._options.grace, self._hurry):
            signal_group(pgid, signal.SIGKILL)
            wait_group_gone(process, 10.0, None)
        process.wait()

    def _stop_all(self) -> None:
        with self._lock:
            running = [s for s in self.servers if s.process is not None and s.process.returncode is None]
            for server in running:  # all get SIGTERM at once, so the grace periods overlap
                signal_group(server.process.pid, signal.SIGTERM)
            for server in running:
                self._terminate(server)
                self._set_state(server, "stopped")

    # -- bookkeeping --------------------------------------------------------------------------

    def _served_name(self, server: Server) -> str:
        listing = _probe(server.url) or {}
        ids = [m.get("id") for m in listing.get("data", []) if isinstance(m, dict)]
        return self.model_path if self.model_path in ids or not ids else str(ids[0])

    def servers_file_content(self) -> dict:
        return {
            "format": SERVERS_FORMAT, "version": SERVERS_VERSION, "engine": self.engine, "model": self.model,
            "model_path": self.model_path, "host": self.host, "started": self.started_at,
            "launcher_pid": os.getpid(),
            "servers": [{"url": s.url, "port": s.port, "pid": s.process.pid if s.process else None,
                         "log": str(s.log), "gpus": s.gpus} for s in self.servers],
        }

    def _write_servers_file(self) -> None:
        from fuelline.io.atomic import write_bytes_atomic

        content = json.dumps(self.servers_file_content(), indent=2) + "\n"
        write_bytes_atomic(self.servers_file, content.encode())

    def _remove_servers_file(self) -> None:
        try:
            written = json.loads(self.servers_file.read_text())
        except (OSError, ValueError):
            return
        if written.get("launcher_pid") == os.getpid() and written.get("started") == self.started_at:
            self.servers_file.unlink(missing_ok=True)

    def _set_state(self, server: Server, state: str, now: float | None = None) -> None:
        server.state, server.since = state, time.monotonic() if now is None else now

    def _event(self, line: str) -> None:
        self._options.events.append(line)
        if self._options.on_event is not None:
            self._options.on_event(line)


def read_servers_file(path: str | os.PathLike) -> tuple[str, list[str]]:
    """(model name to request, server URLs) from a servers file written by `fuelline serve`."""
    path = Path(path)
    try:
        content = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no servers file here; `fuelline serve` writes it once its servers "
                                f"answer, and removes it when it stops them") from None
    except ValueError as e:
        raise ValueError(f"{path}: not a servers file (invalid JSON: {e})") from None
    if not isinstance(content, dict) or content.get("format") != SERVERS_FORMAT:
        found = content.get("format") if isinstance(content, dict) else type(content).__name__
        raise ValueError(f"{path}: not a servers file (format {found!r}, expected {SERVERS_FORMAT!r})")
    if content.get("version") != SERVERS_VERSION:
        raise ValueError(f"{path}: servers file version {content.get('version')!r}; this fuelline reads "
                         f"version {SERVERS_VERSION}")
    servers, model = content.get("servers"), content.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError(f"{path}: servers file without a model name")
    if not isinstance(servers, list) or not servers:
        raise ValueError(f"{path}: servers file lists no servers")
    urls = [s.get("url") if isinstance(s, dict) else None for s in servers]
    if not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
        raise ValueError(f"{path}: every server needs a url like http://127.0.0.1:30000, found {urls}")
    return model, urls


# -- process and network helpers ------------------------------------------------------------------


# Run in the child before the server: clear the signal mask (the launcher blocks signals around
# the fork), ask for SIGTERM when the launcher goes, give up if it already went, then exec the
# server, which keeps both (the parent-death signal survives exec). A separate interpreter
# instead of `preexec_fn`, which is unsafe while other threads run (the monitor does).
def _log_tail(server: Server, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines the current process wrote to its log, indented."""
    try:
        with open(server.log, "rb") as f:
            f.seek(server.log_offset)
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"    (cannot read the log: {e})"
    # progress bars redraw with \r: keep each line's last state; leave out the health checks' access lines
    kept = [line.rsplit("\r", 1)[-1] for line in text.splitlines()
            if line.strip() and '"GET /v1/models HTTP' not in line]
    return "\n".join("    " + line for line in kept[-lines:]) or "    (the log is empty)"


def _connect_host(host: str) -> str:
    """Where to reach a server bound to `host` from this machine (a wildcard bind: loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def _url(host: str, port: int) -> str:
    connect = _connect_host(host)
    return f"http://[{connect}]:{port}" if ":" in connect else f"http://{connect}:{port}"


def _probe(url: str, timeout: float = PROBE_TIMEOUT_S) -> dict | None:
    """The JSON of GET URL/v1/models when it answers 200 ({} when the body is not JSON), else None."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    try:
        connection.request("GET", "/v1/models")
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    if response.status != 200:
        return None
    try:
        listing = json.loads(body)
    except ValueError:
        return {}
    return listing if isinstance(listing, dict) else {}


def _cannot_listen(host: str, port: int) -> str | None:
    """Why a server could not listen on host:port (in use, not an address of this machine), or None."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"cannot resolve host {host!r} ({e})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closing socket (TIME_WAIT) is fine
        try:
            probe.bind(address)
        except OSError as e:
            return "the port is in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
    return None
