"""`fuelline serve`: N OpenAI-compatible servers of one model, kept healthy in the foreground."""

from __future__ import annotations

import signal
import sys
import time

import click

from fuelline.cli_options import at_least, config_params, given, quiet_option
from fuelline.serve.launcher import ServeConfig


class _StopRequested(Exception):
    """SIGINT, SIGTERM or SIGHUP arrived: leave the keep-healthy loop and stop the servers."""


@click.command("serve", context_settings={"help_option_names": ["-h", "--help"]}, params=[
    *config_params(ServeConfig),
    click.Option(["--log-dir"], type=click.Path(file_okay=False), default=None,
                 help="one server-PORT.log per server  [default: logs/serve-MODEL_NAME]"),
    click.Option(["--servers-file"], type=click.Path(dir_okay=False), default=None,
                 help="JSON list of the servers for clients  [default: LOG_DIR/servers.json]"),
    click.Option(["--check-interval"], type=float, default=5.0, show_default=True, callback=at_least(0.1),
                 help="seconds between health checks while running"),
    quiet_option(shows_progress=False),
    click.Argument(["extra_args"], nargs=-1, type=click.UNPROCESSED, metavar="[-- ENGINE ARGS...]")])
def serve_command(log_dir, servers_file, check_interval, extra_args, **values):
    """Start one inference server per port and keep them healthy until Ctrl-C.

    Each server's output goes to its log file; once all answer, the servers file lists their URLs
    (for `fuelline chat regenerate`). A server that dies is restarted on its port. Ctrl-C or
    SIGTERM stops exactly the servers started here. Arguments after `--` go to the engine.
    """
    from fuelline.pipeline.config import build_dataclass
    from fuelline.serve.launcher import ServerGroup

    config = build_dataclass(ServeConfig, given(values), "fuelline serve")

    def say(line: str) -> None:
        click.echo(f"{time.strftime('%H:%M:%S')} {line}")

    # A mistake (bad ports, missing model, engine not installed, a failed start) raises; `fuelline`
    # prints it as `error: …` and exits 2 once the servers are stopped.
    group = ServerGroup.of(config, log_dir=log_dir, extra_args=extra_args, servers_file=servers_file, on_event=say)
    # SIGINT too, explicitly: a shell starts `fuelline serve &` with SIGINT ignored, and Python
    # then installs no Ctrl-C handler of its own, so the servers would outlive a Ctrl-C or a kill -INT.
    previous = {sig: signal.signal(sig, _request_stop) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    ready = False
    try:
        started = time.monotonic()
        group.start()
        ready = True
        say(f"{len(group.urls)} {config.engine} server(s) of {group.model} ready in {time.monotonic() - started:.1f} s; "
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
