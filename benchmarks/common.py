"""Shared helpers of the benchmarks: where the data is, machine description, result files."""

from __future__ import annotations

import datetime
import glob
import json
import os
import platform
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("FUELLINE_SHARED_DATA", ROOT.parent / "shared" / "data"))
RESULTS = Path(__file__).resolve().parent / "results"


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


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "date": datetime.date.today().isoformat(), "machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    return path


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
