"""The local executor against Ray on this machine: Ray's overhead per shard and in total, and the
dedup stage's phases on a synthetic corpus large enough for each phase to show.

A Ray head is started for the benchmark (`ray start --head` on 127.0.0.1 with --workers CPUs, in a
session of its own, stopped by killing that session's processes, never by `ray stop`), and:

1. probe: connecting a driver to it, the first no-op task (a worker process started) and later
   no-op tasks, one at a time and many at once;
2. overhead per shard: the ingest stage (the cheapest real stage; clean keeps none of these
   synthetic records) over the first --slice documents, cut into each of --shard-counts shards,
   on the local executor (--workers processes) and on Ray against the head. The runs of each
   executor are fitted as wall = fixed + per_shard × shards: Ray's overhead per shard is the
   difference of the slopes, its fixed overhead (connect, worker start) that of the intercepts.
   One more Ray run with no address (a Ray instance started in-process, as the CLI does without
   --ray-address) shows the cost of starting Ray for a run;
3. dedup: the dedup stage (default config, MinHash) over the whole corpus on both executors:
   seconds and tasks per phase from stats.json, and the outputs (parts, rejects, clusters.jsonl.zst)
   checked byte for byte; planted duplicates against those found.

    python benchmarks/bench_ray.py [--docs 1000000] [--workers 2] [--slice 200000]
                                   [--shard-counts 4,32,128] [--dedup-shard-size 100000] [--repeats 1]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from itertools import islice
from pathlib import Path

import numpy as np

from bench_dedup_scale import generate
from common import ROOT, SMOKE_RECORDS, parse_args, write_result

from fuelline.dedup.stage import AUDIT_FILE, DedupStage
from fuelline.ingest import IngestStage
from fuelline.pipeline.executor import RunOptions, run_stage

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
PHASES = ("hash", "exact", "candidates", "verify", "cluster", "audit")
HEAD_START_S = 120.0


# --- a Ray head of our own -------------------------------------------------------------------------

def _session_processes(sid: int, zombies: bool = False) -> list[int]:
    """Live processes of session `sid` (zombies hold nothing and cannot be killed: only with `zombies`)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)": state ppid pgrp session
        except OSError:
            continue
        if int(fields[3]) == sid and (zombies or fields[0] != "Z"):
            found.append(int(stat.parent.name))
    return found


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text` (e.g. a Ray temp dir of ours)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes() and int(cmdline.parent.name) != os.getpid():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_init(address: str):
    import ray

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
        ray.init(address=address, log_to_driver=False, include_dashboard=False, logging_level=logging.WARNING)
    return ray


@contextlib.contextmanager
def ray_head(cpus: int, timeout: float = HEAD_START_S):
    """A Ray head on 127.0.0.1 with `cpus` CPUs, in a session of its own; yields (address, start seconds).

    Ready once `ray.init(address=…)` connects. Stopped by SIGTERM to the session (`ray start --block`
    then stops what it started), then SIGKILL to whatever of the session is left.
    """
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's socket paths must stay short (~107 bytes)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    log = Path(temp) / "ray-start.log"
    started = time.perf_counter()
    with open(log, "wb") as out:
        head = subprocess.Popen(
            [Path(sys.executable).with_name("ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
             "--port", str(port), "--num-cpus", str(cpus), "--include-dashboard=false", "--disable-usage-stats",
             "--temp-dir", temp], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    try:
        deadline = time.monotonic() + timeout
        while b"Ray runtime started" not in log.read_bytes():
            if head.poll() is not None:
                raise RuntimeError(f"ray start failed:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"ray start did not start in {timeout:.0f} s:\n{log.read_text()}")
            time.sleep(0.2)
        while True:  # the log line comes before the head takes drivers, at times
            try:
                _ray_init(address).shutdown()
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield address, time.perf_counter() - started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        deadline = time.monotonic() + 20
        while (left := _session_processes(head.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        _kill(left)
        deadline = time.monotonic() + 5  # and give init a moment to reap them, for a clean `ps` afterwards
        while _session_processes(head.pid, zombies=True) and time.monotonic() < deadline:
            time.sleep(0.2)
        shutil.rmtree(temp, ignore_errors=True)
        if left:
            print(f"warning: Ray processes {left} outlived `ray start` and were killed", file=sys.stderr)


@contextlib.contextmanager
def private_ray_tmpdir():
    """RAY_TMPDIR of our own for a Ray started in-process, so it shares no /tmp/ray with other runs;
    processes still running under it afterwards are killed (and reported)."""
    temp = tempfile.mkdtemp(prefix="rayl-", dir="/tmp")
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    try:
        yield
    finally:
        if before is None:
            del os.environ["RAY_TMPDIR"]
        else:
            os.environ["RAY_TMPDIR"] = before
        time.sleep(1)
        left = _processes_mentioning(temp)
        _kill(left)
        shutil.rmtree(temp, ignore_errors=True)
        if left:
            print(f"warning: in-process Ray left processes {left}; killed", file=sys.stderr)


# --- measurements ----------------------------------------------------------------------------------

def _noop(x):
    return x


def probe(address: str, tasks: int = 200, sequential: int = 20) -> dict:
    """Ray's own costs against the head: connect, first task, one task at a time, many at once."""
    started = time.perf_counter()
    ray = _ray_init(address)
    connect = time.perf_counter() - started
    try:
        noop = ray.remote(num_cpus=1)(_noop)
        started = time.perf_counter()
        ray.get(noop.remote(0))
        first = time.perf_counter() - started
        started = time.perf_counter()
        for i in range(sequential):
            ray.get(noop.remote(i))
        one_by_one = (time.perf_counter() - started) / sequential
        started = time.perf_counter()
        ray.get([noop.remote(i) for i in range(tasks)])
        batch = (time.perf_counter() - started) / tasks
    finally:
        started = time.perf_counter()
        ray.shutdown()
        disconnect = time.perf_counter() - started
    return {"connect_s": round(connect, 3), "first_task_s": round(first, 3),
            "task_roundtrip_ms": round(one_by_one * 1000, 2), f"batch_of_{tasks}_ms_per_task": round(batch * 1000, 2),
            "disconnect_s": round(disconnect, 3)}


def timed_run(stage, source: Path, out: Path, options: RunOptions) -> tuple[float, dict]:
    started = time.perf_counter()
    stats = run_stage(stage, source, out, options)
    return time.perf_counter() - started, stats


def best_run(stage_factory, source: Path, base: Path, name: str, options: RunOptions,
             repeats: int) -> tuple[float, dict]:
    """The fastest of `repeats` runs, each into a fresh directory (removed after)."""
    best, stats = float("inf"), None
    for r in range(repeats):
        out = base / f"{name}-r{r}"
        seconds, stats = timed_run(stage_factory(), source, out, options)
        shutil.rmtree(out, ignore_errors=True)
        best = min(best, seconds)
    return best, stats


def fit(shards: list[int], seconds: list[float]) -> dict:
    """wall = fixed + per_shard × shards, least squares (exact with two counts)."""
    if len(set(shards)) < 2:
        return {}
    slope, intercept = np.polyfit(np.asarray(shards, float), np.asarray(seconds, float), 1)
    return {"fixed_s": round(float(intercept), 3), "per_shard_ms": round(float(slope) * 1000, 2)}


def shard_overhead(source: Path, base: Path, address: str, counts: list[int], workers: int, repeats: int) -> dict:
    lines = sum(1 for _ in open(source, "rb"))
    runs = []
    for count in counts:
        shard_size = math.ceil(lines / count)
        local, stats = best_run(IngestStage, source, base, f"ingest-local-{count}",
                                RunOptions(workers=workers, shard_size=shard_size, progress=False), repeats)
        ray, ray_stats = best_run(IngestStage, source, base, f"ingest-ray-{count}",
                                  RunOptions(workers=workers, shard_size=shard_size, progress=False, executor="ray",
                                             ray_address=address), repeats)
        assert stats["records_out"] == ray_stats["records_out"] == lines, (stats, ray_stats)
        runs.append({"shards": stats["shards"], "shard_size": shard_size, "local_s": round(local, 3),
                     "ray_s": round(ray, 3), "ray_minus_local_s": round(ray - local, 3),
                     "ray_minus_local_per_shard_ms": round((ray - local) / stats["shards"] * 1000, 1),
                     "shard_seconds_local": stats["seconds"], "shard_seconds_ray": ray_stats["seconds"]})
        print(f"  {stats['shards']:>5} shards: local {local:6.2f} s   ray {ray:6.2f} s", flush=True)
    shards = [r["shards"] for r in runs]
    local_fit, ray_fit = fit(shards, [r["local_s"] for r in runs]), fit(shards, [r["ray_s"] for r in runs])
    overhead = {}
    if local_fit:
        overhead = {"per_shard_ms": round(ray_fit["per_shard_ms"] - local_fit["per_shard_ms"], 2),
                    "fixed_s": round(ray_fit["fixed_s"] - local_fit["fixed_s"], 3)}
    # One Ray run that starts its own Ray instance here (no address), at the fewest shards.
    smallest = runs[0]
    with private_ray_tmpdir():
        own, _ = best_run(IngestStage, source, base, "ingest-ray-own", RunOptions(
            workers=workers, shard_size=smallest["shard_size"], progress=False, executor="ray"), 1)
    print(f"  {smallest['shards']:>5} shards: ray with a Ray started for the run {own:6.2f} s", flush=True)
    return {"stage": "ingest", "lines": lines, "runs": runs, "fit": {"local": local_fit, "ray": ray_fit},
            "ray_overhead": overhead,
            "ray_started_in_process": {"shards": smallest["shards"], "seconds": round(own, 3),
                                       "start_cost_s": round(own - smallest["ray_s"], 3)}}


def output_digests(out: Path) -> dict[str, str]:
    """sha256 of the outputs that must not depend on the executor: parts, rejects, the audit."""
    names = [p for p in sorted(out.rglob("*")) if p.is_file()
             and (p.name.startswith("part-") and p.parent.name in (out.name, "_rejects") or p.name == AUDIT_FILE)]
    digests = {}
    for path in names:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        digests[path.relative_to(out).as_posix()] = h.hexdigest()
    return digests


def dedup_run(source: Path, out: Path, options: RunOptions) -> dict:
    seconds, stats = timed_run(DedupStage(), source, out, options)
    summary = stats["dedup"]
    return {"seconds": round(seconds, 2), "phase_seconds": {p: summary["seconds"].get(p) for p in PHASES},
            "tasks": summary.get("tasks", {}), "shards_seconds": stats["seconds"], "dropped": stats["dropped"],
            "summary": {k: v for k, v in summary.items() if k not in ("seconds", "tasks")}}


def dedup_compare(source: Path, base: Path, address: str, workers: int, shard_size: int, planted: dict) -> dict:
    runs, digests = {}, {}
    for executor, extra in (("local", {}), ("ray", {"executor": "ray", "ray_address": address})):
        out = base / f"dedup-{executor}"
        runs[executor] = dedup_run(source, out, RunOptions(workers=workers, shard_size=shard_size, progress=False,
                                                           **extra))
        digests[executor] = output_digests(out)
        shutil.rmtree(out, ignore_errors=True)
        print(f"  {executor:<5}: {runs[executor]['seconds']:.1f} s", flush=True)
    local, ray = runs["local"], runs["ray"]
    identical = digests["local"] == digests["ray"] and local["summary"] == ray["summary"]
    found = local["dropped"]
    return {
        "shard_size": shard_size, "local": local, "ray": ray,
        "ratio_ray_local": round(ray["seconds"] / local["seconds"], 3),
        "phase_ratio_ray_local": {p: round(ray["phase_seconds"][p] / local["phase_seconds"][p], 2)
                                  if local["phase_seconds"].get(p) and ray["phase_seconds"].get(p) is not None else None
                                  for p in PHASES},
        "identical": identical, "compared_files": sorted(digests["local"]),
        "planted": planted,
        "found": {"exact_duplicate": found.get("exact_duplicate", 0), "near_duplicate": found.get("near_duplicate", 0)},
    }


# --- report ----------------------------------------------------------------------------------------

def print_summary(result: dict) -> None:
    p = result["probe"]
    print(f"\nRay head started in {result['head_start_s']:.1f} s; driver connect {p['connect_s']:.2f} s, first task "
          f"{p['first_task_s']:.2f} s, then {p['task_roundtrip_ms']:.1f} ms per task one at a time, "
          f"{[v for k, v in p.items() if k.startswith('batch_of')][0]:.2f} ms per task in a batch")
    s = result["shards"]
    print(f"\ningest over {s['lines']:,} documents ({result['workers']} workers / Ray CPUs)")
    print(f"{'shards':>7}{'local s':>10}{'ray s':>10}{'ray-local':>11}{'per shard':>12}")
    for r in s["runs"]:
        print(f"{r['shards']:>7}{r['local_s']:>10.2f}{r['ray_s']:>10.2f}{r['ray_minus_local_s']:>11.2f}"
              f"{r['ray_minus_local_per_shard_ms']:>10.0f}ms")
    if s["ray_overhead"]:
        f = s["fit"]
        print(f"fit: local {f['local']['fixed_s']:.2f} s + {f['local']['per_shard_ms']:.1f} ms/shard; "
              f"ray {f['ray']['fixed_s']:.2f} s + {f['ray']['per_shard_ms']:.1f} ms/shard; "
              f"Ray's overhead {s['ray_overhead']['fixed_s']:.2f} s + {s['ray_overhead']['per_shard_ms']:.1f} ms/shard")
    own = s["ray_started_in_process"]
    print(f"ray starting its own instance: {own['seconds']:.2f} s at {own['shards']} shards "
          f"({own['start_cost_s']:+.2f} s against the running head)")
    d = result["dedup"]
    print(f"\ndedup over {result['documents']:,} documents, shard size {d['shard_size']:,}")
    print(f"{'phase':<12}{'tasks':>7}{'local s':>10}{'ray s':>10}{'ray/local':>11}")
    for phase in PHASES:
        ratio = d["phase_ratio_ray_local"][phase]
        tasks = d["local"]["tasks"].get(phase, "")
        print(f"{phase:<12}{tasks:>7}{d['local']['phase_seconds'][phase] or 0:>10.2f}"
              f"{d['ray']['phase_seconds'][phase] or 0:>10.2f}{'' if ratio is None else f'{ratio:.2f}':>11}")
    print(f"{'shards':<12}{'':>7}{d['local']['shards_seconds']:>10.2f}{d['ray']['shards_seconds']:>10.2f}"
          f"{'':>11}  (summed over shards)")
    print(f"{'wall':<12}{'':>7}{d['local']['seconds']:>10.2f}{d['ray']['seconds']:>10.2f}{d['ratio_ray_local']:>11.2f}")
    print(f"planted {d['planted']}; found {d['found']}; outputs identical: {d['identical']} "
          f"({len(d['compared_files'])} files)")


def warm_up(source: Path, base: Path, lines: int = 2_000) -> None:
    """Both stages once in this process, untimed: the first dedup in a process loads its numba
    kernels (cached, still ~0.3 s in the driver's cluster phase), which would be charged to
    whichever executor ran first."""
    small = base / "warm.jsonl"
    with open(source, "rb") as f, open(small, "wb") as out:
        out.writelines(islice(f, lines))
    for stage in (IngestStage(), DedupStage()):
        run_stage(stage, small, base / f"warm-{stage.name}", RunOptions(workers=1, progress=False))
        shutil.rmtree(base / f"warm-{stage.name}")
    small.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=1_000_000, help="synthetic documents for dedup")
    parser.add_argument("--workers", type=int, default=2, help="local processes, and the Ray head's CPUs")
    parser.add_argument("--slice", type=int, default=200_000, help="documents of the per-shard overhead runs")
    parser.add_argument("--shard-counts", default="4,32,128", help="shard counts of the overhead runs")
    parser.add_argument("--dedup-shard-size", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=1, help="overhead runs: the fastest of this many")
    args = parse_args(parser)
    if args.smoke:  # every part, on a few thousand documents
        args.docs, args.slice, args.shard_counts, args.dedup_shard_size = SMOKE_RECORDS, SMOKE_RECORDS, "2,4", 1000
    counts = sorted({int(c) for c in args.shard_counts.split(",")})

    import ray

    base = Path(tempfile.mkdtemp(prefix="fuelline-bench-ray-"))
    try:
        source = base / "docs.jsonl"
        started = time.perf_counter()
        planted = generate(source, args.docs)
        generate_s = time.perf_counter() - started
        print(f"generated {args.docs:,} documents ({source.stat().st_size / 1e6:,.0f} MB) in {generate_s:.0f} s: "
              f"{planted}", flush=True)
        head_slice = base / "slice.jsonl"
        with open(source, "rb") as f, open(head_slice, "wb") as out:
            out.writelines(islice(f, args.slice))
        warm_up(source, base)

        with ray_head(args.workers) as (address, head_start):
            print(f"Ray head at {address}, ready in {head_start:.1f} s", flush=True)
            probed = probe(address)
            print("overhead per shard (ingest):", flush=True)
            shards = shard_overhead(head_slice, base, address, counts, args.workers, args.repeats)
            print("dedup:", flush=True)
            dedup = dedup_compare(source, base, address, args.workers, args.dedup_shard_size, planted)

        result = {"documents": args.docs, "workers": args.workers, "ray_version": ray.__version__,
                  "corpus_mb": round(source.stat().st_size / 1e6), "generate_s": round(generate_s, 1),
                  "head_start_s": round(head_start, 2), "probe": probed, "shards": shards, "dedup": dedup}
        print_summary(result)
        path = write_result("ray", result)
        print(f"wrote {path}")
        if not dedup["identical"]:
            sys.exit("FAILED: the dedup outputs of the local and the Ray executor differ")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
