"""What the launcher asks the network about a server: can its port be listened on, where is it
reached from this machine, and does it answer `GET /v1/models` (its readiness and health probe).

A server bound to a wildcard address (0.0.0.0, ::) is reached on loopback. The probe gives a
server PROBE_TIMEOUT_S to answer: a busy server that takes longer counts as not answering for
that round, which the launcher reports but does not act on (see `fuelline.serve.launcher`).
"""

from __future__ import annotations

import errno
import http.client
import json
import socket

PROBE_TIMEOUT_S = 3.0


def server_url(host: str, port: int) -> str:
    """The base URL of a server bound to host:port, as this machine reaches it."""
    connect = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{connect}]:{port}" if ":" in connect else f"http://{connect}:{port}"


def probe_models(url: str, timeout: float = PROBE_TIMEOUT_S) -> dict | None:
    """The JSON of GET URL/v1/models when it answers 200 ({} when the body is not JSON), else None."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)
    try:
        connection.request("GET", "/v1/models")
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException):
        return None  # not answering is what the probe measures, not an error
    finally:
        connection.close()
    if response.status != 200:
        return None
    try:
        listing = json.loads(body)
    except ValueError:
        return {}
    return listing if isinstance(listing, dict) else {}


def served_name(url: str, model_path: str) -> str:
    """The model name requests to the server at `url` must carry: `model_path` when its
    `/v1/models` lists it (or lists nothing), else the first id it lists."""
    listing = probe_models(url) or {}
    ids = [m.get("id") for m in listing.get("data", []) if isinstance(m, dict)]
    return model_path if model_path in ids or not ids else str(ids[0])


def cannot_listen(host: str, port: int) -> str | None:
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
