"""Shared helpers of the benchmarks: where the data is, machine description, result files."""

from __future__ import annotations

import datetime
import json
import os
import platform
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
