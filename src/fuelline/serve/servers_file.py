"""The servers file: where the servers of one `fuelline serve` listen, for the clients that use them.

JSON, written atomically once every server answers, rewritten when a server is restarted (its
new pid), and removed when the launcher stops its servers, but only while it still describes
them (another launcher may have taken the path since):

    {"format": "fuelline.servers", "version": 1, "engine": "transformers", "model": NAME,
     "model_path": PATH, "host": "127.0.0.1", "started": ISO time, "launcher_pid": PID,
     "servers": [{"url": "http://127.0.0.1:30000", "port": 30000, "pid": PID, "log": PATH, "gpus": []}]}

`model` is the name requests must carry: the id the first server's `/v1/models` reports (for
`transformers serve MODEL`, MODEL exactly as given; any other name is answered with 400).
Readers need only `model` and the servers' `url`s.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fuelline.io.atomic import write_bytes_atomic
from fuelline.serve.server import Server

SERVERS_FORMAT = "fuelline.servers"
SERVERS_VERSION = 1


def write_servers_file(path: Path, *, engine: str, model: str, model_path: str, host: str, started: str | None,
                       servers: list[Server]) -> None:
    content = {
        "format": SERVERS_FORMAT, "version": SERVERS_VERSION, "engine": engine, "model": model,
        "model_path": model_path, "host": host, "started": started, "launcher_pid": os.getpid(),
        "servers": [{"url": s.url, "port": s.port, "pid": s.process.pid if s.process else None,
                     "log": str(s.log), "gpus": s.gpus} for s in servers],
    }
    write_bytes_atomic(path, (json.dumps(content, indent=2) + "\n").encode())


def remove_servers_file(path: Path, started: str | None) -> None:
    """Remove the servers file if this process wrote it for the group started at `started`."""
    try:
        written = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # gone, or not ours to judge: a file we cannot read is left where it is
    if isinstance(written, dict) and written.get("launcher_pid") == os.getpid() and written.get("started") == started:
        path.unlink(missing_ok=True)


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
