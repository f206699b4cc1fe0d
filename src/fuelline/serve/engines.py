"""The command line of one inference server per engine, and what a machine offers them.

Everything here is a pure function of its arguments except `engine_missing`, `resolve_program`
and `visible_gpus`, which look at the environment. A server gets its GPUs through
CUDA_VISIBLE_DEVICES, so inside it they are always devices 0..N-1; tensor parallelism is only
asked for when N > 1. `transformers serve` gets `--device cpu` when the server has no GPU, since
its default `auto` would otherwise pick whatever accelerator the machine has.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ENGINES = ("sglang", "vllm", "transformers")
INSTALL_HINTS = {
    "sglang": "pip install sglang",
    "vllm": "pip install vllm",
    "transformers": "pip install 'transformers[serving]'",
}


def parse_ports(spec: str | int | list[int] | tuple[int, ...]) -> list[int]:
    """Ports from `A-B` (inclusive), a comma list, or both mixed (`30000-30003,30010`)."""
    spec = str(spec) if isinstance(spec, int) else spec
    if isinstance(spec, str):
        ports = [port for part in spec.split(",") for port in _parse_port_part(part.strip(), spec)]
    else:
        ports = [int(p) for p in spec]
    for port in ports:
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} is out of range: ports are 1-65535")
    if not ports:
        raise ValueError("no ports given: write a range like 30000-30007 or a list like 30000,30001")
    duplicates = sorted({p for p in ports if ports.count(p) > 1})
    if duplicates:
        raise ValueError(f"ports given more than once: {', '.join(map(str, duplicates))}")
    return ports


def _parse_port_part(part: str, spec: str) -> list[int]:
    hint = "write a range like 30000-30007 or a list like 30000,30001"
    low, dash, high = part.partition("-")
    try:
        if not dash:
            return [int(part)]
        first, last = int(low), int(high)
    except ValueError:
        raise ValueError(f"bad port list {spec!r}: {part!r} is not a port or a range; {hint}") from None
    if first > last:
        raise ValueError(f"bad port range {part!r}: the first port is above the last; {hint}")
    return list(range(first, last + 1))


def server_command(engine: str, model: str, host: str, port: int, num_gpus: int = 0,
                   extra_args: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The argv of one server; argv[0] is the program as a user would type it (see resolve_program)."""
    tp = num_gpus if num_gpus > 1 else None
    if engine == "sglang":
        argv = ["python", "-m", "sglang.launch_server", "--model-path", model, "--host", host, "--port", str(port)]
        argv += ["--tp", str(tp)] if tp else []
    elif engine == "vllm":
        argv = ["vllm", "serve", model, "--host", host, "--port", str(port)]
        argv += ["--tensor-parallel-size", str(tp)] if tp else []
    elif engine == "transformers":
        argv = ["transformers", "serve", model, "--host", host, "--port", str(port)]
        argv += ["--device", "cpu"] if num_gpus == 0 else []
    else:
        raise ValueError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    return argv + list(extra_args)


def resolve_program(argv: list[str]) -> list[str]:
    """argv with its program made a path: `python` is this interpreter, a console script is the
    one installed beside it (the same environment), else the one on PATH."""
    program = argv[0]
    if program == "python":
        return [sys.executable, *argv[1:]]
    beside = Path(sys.executable).parent / program
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside), *argv[1:]]
    found = shutil.which(program)
    return [found or program, *argv[1:]]


def engine_missing(engine: str) -> str | None:
    """Why `engine` (one of ENGINES) cannot start here, with the install hint; None when it can."""
    modules = {"sglang": ["sglang"], "vllm": ["vllm"], "transformers": ["transformers", "fastapi", "uvicorn"]}[engine]
    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    program = {"vllm": "vllm", "transformers": "transformers"}.get(engine)
    if not absent and program and resolve_program([program])[0] == program:  # no executable found
        absent = [program]
    if not absent:
        return None
    if engine == "transformers" and absent != ["transformers"]:
        return f"transformers serve needs its serving extra ({', '.join(absent)} missing); {INSTALL_HINTS[engine]}"
    return f"{engine} is not installed; {INSTALL_HINTS[engine]}"


def visible_gpus(environ: dict[str, str] | None = None) -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set (empty or -1: none), else the
    indices `nvidia-smi -L` lists, else none."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        ids = [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
        # CUDA stops at the first invalid entry; "-1" is the usual way to hide every GPU.
        return ids[: ids.index("-1")] if "-1" in ids else ids
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []  # no driver that answers: no GPU a server could use; the launcher names each server's CPU
    if listing.returncode != 0:
        return []
    count = sum(1 for line in listing.stdout.splitlines() if line.startswith("GPU "))
    return [str(i) for i in range(count)]


def assign_gpus(num_servers: int, gpus_per_server: int, available: list[str]) -> list[list[str]]:
    """Consecutive GPUs for each server; [] for each when the machine has none or
    `gpus_per_server` is 0 (CPU servers)."""
    if gpus_per_server < 0:
        raise ValueError(f"--gpus-per-server must be 0 or more, not {gpus_per_server}")
    if gpus_per_server == 0 or (not available and gpus_per_server == 1):
        return [[] for _ in range(num_servers)]
    needed = num_servers * gpus_per_server
    if needed > len(available):
        have = f"{len(available)} ({', '.join(available)})" if available else "none"
        raise ValueError(
            f"{num_servers} server(s) with {gpus_per_server} GPU(s) each need {needed} GPUs, but this machine "
            f"has {have}; give fewer ports, a smaller --gpus-per-server, or --gpus-per-server 0 for CPU servers"
        )
    return [available[i * gpus_per_server:(i + 1) * gpus_per_server] for i in range(num_servers)]


def default_log_dir(model: str) -> Path:
    """`logs/serve-NAME`, NAME being the model directory's or repository's last part."""
    name = Path(model.rstrip("/\\")).name or "model"
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return Path("logs") / f"serve-{safe}"
