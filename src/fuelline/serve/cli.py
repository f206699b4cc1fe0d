"""`fuelline serve`: N OpenAI-compatible servers of one model, kept healthy in the foreground."""

from __future__ import annotations

import signal
import sys
import time

import click


class _StopRequested(Exception):
    """SIGINT, SIGTERM or SIGHUP arrived: leave the keep-healthy loop and stop the servers."""


@click.command("serve", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--engine", required=True, type=click.Choice(["sglang", "vllm", "transformers"]),
              help="sglang, vllm, or transformers (`transformers serve`, also on CPU)")
@click.option("--model", required=True, help="model directory or hub id, as the engine takes it")
@click.option("--ports", required=True, help="one server per port: a range 30000-30007 or a list 30000,30002")
@click.option("--gpus-per-server", type=int, default=1, show_default=True,
              help="consecutive GPUs per server (tensor parallel when > 1); 0: CPU servers. Without GPUs, "
                   "servers run on CPU")
@click.option("--host", default="127.0.0.1", show_default=True, help="address the servers listen on")
@click.option("--log-dir", type=click.Path(file_okay=False), default=None,
              help="one server-PORT.log per server  [default: logs/serve-MODEL_NAME]")
@click.option("--servers-file", type=click.Path(dir_okay=False), default=None,
              help="JSON list of the servers for clients  [default: LOG_DIR/servers.json]")
@click.option("--startup-timeout", type=float, default=600.0, show_default=True,
              help="seconds for every server to answer GET /v1/models")
@click.option("--check-interval", type=float, default=5.0, show_default=True,
              help="seconds between health checks while running")
@click.argument("extra_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ENGINE ARGS...]")
def serve_command(engine, model, ports, gpus_per_server, host, log_dir, servers_file, startup_timeout,
                  check_interval, extra_args):
    """Start one inference server per port and keep them healthy until Ctrl-C.

    Each server's output goes to its log file; once all answer, the servers file lists their URLs
    (for `fuelline chat regenerate`). A server that dies is restarted on its port. Ctrl-C or
    SIGTERM stops exactly the servers started here. Arguments after `--` go to the engine.
    """
    from fuelline.serve.launcher import ServerGroup

    def say(line: str) -> None:
        click.echo(f"{time.strftime('%H:%M:%S')} {line}")

    # A mistake (bad ports, missing model, engine not installed, a failed start) raises; `fuelline`
    # prints it as `error: …` and exits 2 once the servers are stopped.
    group = ServerGroup(engine, model, ports, host=host, gpus_per_server=gpus_per_server, log_dir=log_dir,
                        extra_args=extra_args, servers_file=servers_file, startup_timeout=startup_timeout,
                        on_event=say)
    # SIGINT too, explicitly: a shell starts `fuelline serve &` with SIGINT ignored, and Python
    # then installs no Ctrl-C handler of its own, so the servers would outlive a Ctrl-C or a kill -INT.
    previous = {sig: signal.signal(sig, _request_stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    ready = False
    try:
        started = time.monotonic()
        group.start()
        ready = True
        say(f"{len(group.urls)} {engine} server(s) of {group.model} ready in {time.monotonic() - started:.1f} s; "
            f"servers file {group.servers_file}; Ctrl-C stops them")
        group.keep_healthy(interval=check_interval)
    except _StopRequested:
        if not ready:  # start() has already stopped what it had started
            say("interrupted while the servers were starting; stopped them")
            sys.exit(1)
    finally:
        _stop(group, previous)


def _request_stop(signum, frame) -> None:
    raise _StopRequested(signal.Signals(signum).name)


def _stop(group, previous: dict) -> None:
    """Stop the servers; a second Ctrl-C or SIGTERM meanwhile skips the grace period."""
    running = [s for s in group.servers if s.process is not None and s.process.returncode is None]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: group.hurry())
    try:
        if running:
            click.echo(f"{time.strftime('%H:%M:%S')} stopping {len(running)} server(s)", err=True)
        group.stop()
        if running:
            click.echo(f"{time.strftime('%H:%M:%S')} stopped; logs kept in {group.log_dir}", err=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
