"""Every benchmark script runs end to end in its smoke mode (`--smoke`, benchmarks/common.py): a tiny
input, peers that are not installed skipped (their venv, benchmarks/.venv, is not CI's), no result
file kept. A change that breaks a benchmark fails here, not at the next measurement (bench_pack.py
failed with a TypeError, unseen, after the step-protocol change). The scripts are found by name, so a
new one is covered.

Each run is in a session of its own and its environment carries a tag; once it has ended, no
process may hold the tag (Ray's head and workers, servers, DataLoader and datatrove workers
inherit it, also those that start a session of their own, as `ray start` does)."""

import ast
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fuelline.serve.processes import with_parent_death_signal

from .conftest import ROOT, shared_file

BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for pattern in ("bench_*.py", "gpu_*.py") for p in BENCHMARKS.glob(pattern))
# The line common.write_result prints in a smoke run: the script got to its result, and the result
# holds measurements.
SMOKE_RESULT = re.compile(r"^smoke result \S+: ([1-9]\d*) figures", re.M)
SMOKE_TIMEOUT_S = 300  # each takes 1-50 s on 2 cores (2026-12-03); a loaded CI machine gets room


def test_every_benchmark_script_declares_the_smoke_flag():
    """Through `common.parse_args`, which adds `--smoke` and starts the smoke run; a script that calls
    argparse's own `parse_args` would not have it."""
    assert {"bench_pack.py", "gpu_prefetch.py"} <= set(SCRIPTS), SCRIPTS
    for script in SCRIPTS:
        tree = ast.parse((BENCHMARKS / script).read_text(encoding="utf-8"))
        imported = {alias.name for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module == "common" for alias in node.names}
        own = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
               and isinstance(node.func, ast.Attribute) and node.func.attr == "parse_args"]
        assert "parse_args" in imported and not own, f"{script}: parse the arguments with common.parse_args"


def results_digest() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((BENCHMARKS / "results").glob("*"))}


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment holds `tag` (zombies have none left)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if tag.encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:  # gone, or not ours
            continue
    return found


def processes_left(tag: str, grace_s: float = 10.0) -> list[str]:
    """The tagged processes still alive after `grace_s`, killed; their command lines."""
    deadline = time.monotonic() + grace_s
    while (pids := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            left.append(f"{pid}: {command[:200]}")
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    return left


@pytest.mark.slow
@pytest.mark.timeout(SMOKE_TIMEOUT_S + 60)
@pytest.mark.parametrize("script", SCRIPTS)
def test_the_benchmark_runs_end_to_end_in_smoke_mode(script):
    shared_file("chinese-poetry.jsonl.zst")
    shared_file("chat/gsm8k-train.jsonl.zst")
    before, tag = results_digest(), f"fuelline-smoke-{uuid.uuid4().hex}"
    env = {**os.environ, "FUELLINE_SMOKE_TAG": tag}
    argv = with_parent_death_signal([sys.executable, str(BENCHMARKS / script), "--smoke"])  # SIGTERM if pytest dies
    child = subprocess.Popen(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, stderr = child.communicate()
        pytest.fail(f"{script} --smoke ran over {SMOKE_TIMEOUT_S} s:\n{stdout[-2000:]}\n{stderr[-3000:]}")
    finally:
        left = processes_left(tag)
    assert child.returncode == 0, f"{script} --smoke exited {child.returncode}:\n{stdout[-2000:]}\n{stderr[-4000:]}"
    assert SMOKE_RESULT.search(stdout), f"{script} --smoke measured nothing:\n{stdout[-3000:]}"
    assert not left, f"{script} --smoke left processes behind: {left}"
    assert results_digest() == before, f"{script} --smoke changed benchmarks/results"
