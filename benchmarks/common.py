"""Shared helpers of the benchmarks: where the data is, machine description, result files, and
the smoke mode every script has.

Smoke mode (`--smoke`, declared by `parse_args`): the script runs end to end on a tiny input (the
first SMOKE_RECORDS records of the real corpus, a few conversations, a tiny model built on the
spot), in seconds, so that tests/test_benchmarks.py can run every script and a change that breaks
one fails CI. A peer whose package is absent (the peers live in benchmarks/.venv, not in the
project's venv) is skipped with one line saying so. The result goes to a temporary directory
removed at exit, never to benchmarks/results, and one line says how many figures it holds.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import glob
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import zstandard

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("FUELLINE_SHARED_DATA", ROOT.parent / "shared" / "data"))
RESULTS = Path(__file__).resolve().parent / "results"
POETRY = SHARED_DATA / "chinese-poetry.jsonl.zst"
# A smoke run's corpus: 2,000 poems give every step work (the cleaner drops some, dedup finds 19
# exact and 4 near duplicates, 300 would have none), the loader ~125 windows of 1,024 tokens
# (batches of 32), and keep each step under a second or two.
SMOKE_RECORDS = 2_000
_smoke_dir: Path | None = None  # a smoke run's scratch directory (its inputs and result), removed at exit
_hogs = 0  # busy processes beside this run (`--hogs`)
# A busy loop that ends when the process that started it is gone, even killed.
HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    sum(range(1_000_000))\n"


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The script's arguments, plus `--smoke` (module docstring) and `--hogs N`; a smoke run and the
    hogs start here."""
    global _smoke_dir, _hogs
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny end-to-end run in seconds (CI's check that the script works): peers that are "
                             "not installed are skipped, and no result file is written")
    parser.add_argument("--hogs", type=int, default=0, metavar="N",
                        help="run beside N busy processes (what a loaded machine costs, fuelline and peers alike); "
                             "the result is written as NAME_beside_hogs.json")
    args = parser.parse_args()
    if args.hogs > 0 and _hogs == 0:
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
        atexit.register(lambda: [hog.kill() for hog in hogs])
        _hogs = args.hogs
        print(f"beside {_hogs} busy process(es)", flush=True)
    if args.smoke and _smoke_dir is None:
        _smoke_dir = Path(tempfile.mkdtemp(prefix="fuelline-smoke-"))
        atexit.register(shutil.rmtree, _smoke_dir, ignore_errors=True)
        print("smoke run: a tiny input; the result stays out of benchmarks/results", flush=True)
    return args


def smoke() -> bool:
    return _smoke_dir is not None


def hogs() -> int:
    """How many busy processes run beside this one (`--hogs`); a script that waits for an idle
    machine must not wait for them."""
    return _hogs


def peer_available(module: str) -> bool:
    """Whether a peer's package (e.g. "datatrove") can be imported. A smoke run goes on without it,
    saying so; a real run stops, since its result would lack the comparison it exists for."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package of a dotted name is absent
        found = False
    if found:
        return True
    if not smoke():
        sys.exit(f"{module} not installed: run `bash benchmarks/setup_peers.sh`, then this script with "
                 "benchmarks/.venv/bin/python")
    print(f"{module} not installed (benchmarks/setup_peers.sh): skipped", flush=True)
    return False


def corpus_head(records: int = SMOKE_RECORDS) -> Path:
    """A smoke run's corpus: the poetry corpus's first `records` lines, byte for byte, as a .jsonl.zst
    of their own in the run's scratch directory."""
    assert _smoke_dir is not None, "corpus_head is a smoke run's input"
    text = b""
    with open(POETRY, "rb") as f:
        reader = zstandard.ZstdDecompressor().stream_reader(f)
        while text.count(b"\n") < records and (chunk := reader.read(1 << 20)):
            text += chunk
    path = _smoke_dir / f"chinese-poetry-head-{records}.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"".join(text.splitlines(keepends=True)[:records])))
    return path


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "system": platform.system()}


def best_of(fn, repeats: int) -> tuple[float, object]:
    """Fastest wall time of `repeats` calls (the least disturbed by other load), and the result."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def tiny_model(directory: Path, chats: Path, layers: int) -> Path:
    """A smoke run's target instead of a real model: fuelline.models' tiny chat model (a random Qwen3
    of hidden 64 over a 768-token vocabulary trained on the conversations of `chats`, JSONL), built in
    seconds from nothing but them: no download (SmolLM2's) and no 151k-token vocabulary to convert."""
    from fuelline.models import tiny_chat_model

    return tiny_chat_model(directory, chats.read_text(encoding="utf-8").splitlines(), layers=layers)


def write_result(name: str, payload: dict) -> Path:
    """benchmarks/results/NAME.json; in a smoke run, the same file in a temporary directory, and a
    line that says how many figures it holds (the smoke test reads it)."""
    directory = RESULTS if _smoke_dir is None else _smoke_dir / "results"
    directory.mkdir(exist_ok=True)
    path = directory / (f"{name}_beside_hogs.json" if _hogs else f"{name}.json")
    measured = len(figures(payload))
    payload = {"benchmark": name, "date": datetime.date.today().isoformat(), "machine": machine(),
               **({"beside_busy_processes": _hogs} if _hogs else {}), **payload}
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    if smoke():
        print(f"smoke result {name}: {measured} figures, not kept", flush=True)
    return path


def figures(value) -> list[float]:
    """The numbers of a result, nested anywhere (booleans are not figures)."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in figures(v)]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in figures(v)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def memory_mib(pid: int | str) -> tuple[float, float]:
    """(resident, anonymous) memory of a process in MiB, from /proc; (0, 0) once it is gone.

    Resident memory counts the pages of memory-mapped files too, which the kernel can drop at
    any time; anonymous memory is what the process owns.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0, 0.0
    fields = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines()
              if line.startswith(("VmRSS:", "RssAnon:"))}
    return fields.get("VmRSS", 0) / 1024, fields.get("RssAnon", 0) / 1024


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (datatrove's forkserver starts its workers one level further down)."""
    found, queue = [], [pid]
    while queue:
        for listing in glob.glob(f"/proc/{queue.pop()}/task/*/children"):
            try:
                children = [int(k) for k in Path(listing).read_text().split()]
            except OSError:
                continue
            found.extend(children)
            queue.extend(children)
    return found


class MemoryPeaks:
    """Samples, every 50 ms, the memory of this process and of every process below it (workers).

    ru_maxrss cannot tell them apart: a worker started by fork+exec is charged the parent's size
    at the fork.
    """

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peaks = {"parent_rss": 0.0, "parent_anon": 0.0, "worker_rss": 0.0, "worker_anon": 0.0}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _sample(self, prefix: str, pid) -> None:
        rss, anon = memory_mib(pid)
        self.peaks[f"{prefix}_rss"] = max(self.peaks[f"{prefix}_rss"], rss)
        self.peaks[f"{prefix}_anon"] = max(self.peaks[f"{prefix}_anon"], anon)

    def _watch(self) -> None:
        while not self._done.wait(self.interval):
            self._sample("parent", os.getpid())
            for pid in descendants(os.getpid()):
                self._sample("worker", pid)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()

    def result(self) -> dict:
        return {f"peak_{k}_mib": round(v) for k, v in self.peaks.items()}
