"""Reliability family (f), issue 25: `fuelline chat regenerate` against real HTTP servers on
127.0.0.1 (fuelline.serve.echo's fault modes) that answer wrongly, break the connection, stall,
or all die mid-run.

A trial runs the CLI as a subprocess with a time limit and judges what it left:
- ok: exit 0, every answer written is the echo's answer to the regenerated history, every input
  id is written or in OUT.errors with a reason, and stats.json adds up to the input;
- clear_error: exit nonzero with a message naming the servers, no traceback, and what was
  written is still right;
- silent_wrong: an answer written that the server did not give as one (empty, partial, garbage),
  or records missing from both files or from the counts;
- crash: a traceback or a signal; hang: no end within the limit.

Called by benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import orjson
from common import SHARED_DATA
from trials import Tally, cli, failure_outcome, free_port, run, run_in_parallel

ANSWER_FAULTS = ("empty", "whitespace", "abort", "bad-usage", "two-choices", "no-choices", "no-message",
                 "reasoning-only", "wrong-types", "html", "error-object", "truncated-json")
CONNECTION_FAULTS = ("http500", "drop", "cut", "stall")
TRIAL_LIMIT_S = 90  # a healthy trial takes a few seconds; past this it is a hang
CLIENT = ("--concurrency", "4", "--request-timeout", "3", "--stall-timeout", "3", "--attempts", "5", "-q")


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    """Every fault, beside a good server (the reduced run), and alone every 1st, 2nd and 3rd request
    (full); the servers dying, 2 or 8 times. Trials run 4 at a time: they mostly wait on backoffs."""
    rng = random.Random(seed)
    chats, many = small_chats(work, 12 if full else 8), many_chats(work)
    layouts = [("beside a good one", 1), *([("alone", 1), ("alone", 2), ("alone", 3)] if full else [])]
    trials = [(f"servers: {fault}", partial(faulty_server, work, chats, fault, layout, every))
              for fault in (*ANSWER_FAULTS, *CONNECTION_FAULTS) for layout, every in layouts]
    trials += [("servers: all die mid-run (SIGTERM)",
                partial(all_servers_die, work, many, trial, rng.randint(30, 150)))
               for trial in range(8 if full else 2)]
    return run_in_parallel(trials)


def faulty_server(work: Path, chats: Path, fault: str, layout: str, every: int) -> tuple[str, str]:
    """One server answering wrongly every `every`-th request, alone or beside a good server."""
    configs = [("--fault", fault, "--fault-every", str(every))]
    if layout != "alone":
        configs.append(())
    out = work / f"fault-{fault}-{layout.replace(' ', '-')}-{every}" / "out.jsonl"
    with echo_servers(configs) as urls:
        code, stderr = run(regenerate_argv(chats, out, urls), timeout=TRIAL_LIMIT_S)
    outcome, note = judge(code, stderr, chats, out)
    return outcome, f"{layout}, every {every}: {note}"


def all_servers_die(work: Path, chats: Path, trial: int, after: int) -> tuple[str, str]:
    """Two servers answering, both sent SIGTERM after `after` conversations: the run must stop with
    the all-down error within --all-down-timeout, and what it wrote be right."""
    out = work / f"all-die-{trial}" / "out.jsonl"
    with echo_servers([("--delay", "0.02"), ("--delay", "0.02")], handles=True) as (urls, procs):
        proc = subprocess.Popen(regenerate_argv(chats, out, urls, "--all-down-timeout", "3"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=terminate_after, args=(out, after, procs, proc), daemon=True).start()
        try:
            _, stderr = proc.communicate(timeout=TRIAL_LIMIT_S)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            code, stderr = None, f"hung for {TRIAL_LIMIT_S} s"
    outcome, note = judge(code, stderr, chats, out, error_names="no server has answered")
    return outcome, f"killed after {after} lines: {note}"


def terminate_after(out: Path, lines: int, servers: list[subprocess.Popen], run: subprocess.Popen) -> None:
    while run.poll() is None and (not out.exists() or out.read_bytes().count(b"\n") < lines):
        time.sleep(0.01)
    for server in servers:
        server.send_signal(signal.SIGTERM)


def regenerate_argv(chats: Path, out: Path, urls: list[str], *extra: str) -> list[str]:
    argv = cli("chat", "regenerate", "-i", chats, "-o", out, "--model", "echo", *CLIENT, *extra)
    for url in urls:
        argv += ["--server", url]
    return argv


def judge(code: int | None, stderr: str, chats: Path, out: Path, error_names: str = "127.0.0.1") -> tuple[str, str]:
    """The trial's outcome and a note (see the module doc)."""
    if code != 0:
        outcome = failure_outcome(code, stderr, error_names)
        if outcome != "clear_error":
            return outcome, stderr[-600:]
        wrong = wrong_answers(chats, out)
        return ("silent_wrong", wrong) if wrong else ("clear_error", "")
    wrong = wrong_answers(chats, out) or unaccounted(chats, out)
    return ("silent_wrong", wrong) if wrong else ("ok", "")


def wrong_answers(chats: Path, out: Path) -> str:
    """The first written answer that is not the echo's answer to the regenerated history, if any."""
    from fuelline.serve.echo import echo_answer

    inputs = {r["id"]: r for r in map(orjson.loads, chats.read_bytes().splitlines())}
    written = [orjson.loads(line) for line in out.read_bytes().splitlines()] if out.exists() else []
    ids = [r["id"] for r in written]
    if len(set(ids)) != len(ids):
        return "an id written twice"
    for record in written:
        turns = record["conversations"]
        if [t["role"] for t in turns] != [t["role"] for t in inputs[record["id"]]["conversations"]]:
            return f"{record['id']}: turns changed"
        for k, turn in enumerate(turns):
            if turn["role"] == "assistant" and turn["content"] != echo_answer(turns[:k]):
                return f"{record['id']} turn {k}: {turn['content'][:80]!r} is not the server's answer"
    return ""


def unaccounted(chats: Path, out: Path) -> str:
    """Ids in neither file, errors without a reason, or stats that do not add up to the input."""
    ids = {orjson.loads(line)["id"] for line in chats.read_bytes().splitlines()}
    written = {orjson.loads(line)["id"] for line in out.read_bytes().splitlines()}
    errors = [orjson.loads(line) for line in out.with_name(out.name + ".errors").read_bytes().splitlines()]
    stats = orjson.loads(out.with_suffix(".stats.json").read_bytes())
    if written | {e["id"] for e in errors} != ids or written & {e["id"] for e in errors}:
        return f"{len(ids - written - {e['id'] for e in errors})} ids in neither the output nor the errors file"
    if not all(e.get("reason") and e.get("detail") for e in errors):
        return "an error without a reason"
    if (stats["records_in"], stats["records_out"], sum(stats["dropped"].values()),
            sum(stats["failures"].values())) != (len(ids), len(written), len(errors), len(errors)):
        return f"stats do not add up: in {stats['records_in']} out {stats['records_out']} dropped {stats['dropped']}"
    return ""


@contextmanager
def echo_servers(configs: list[tuple[str, ...]], handles: bool = False):
    """Echo servers on free ports, each with its options; killed at the end of the block."""
    procs, urls = [], []
    try:
        for options in configs:
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, "-m", "fuelline.serve.echo", "--port", str(port),
                                           *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            urls.append(f"http://127.0.0.1:{port}")
            wait_until_up(urls[-1])
        yield (urls, procs) if handles else urls
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def wait_until_up(url: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(f"{url}/v1/models", timeout=1)
            return
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"setup failed: the echo server {url} did not start in {seconds:.0f} s")
            time.sleep(0.05)


def small_chats(work: Path, count: int, most_answers: int = 4) -> Path:
    """The first conversations of the ShareGPT sample with at most `most_answers` assistant turns
    (one of the first ten has 165: a minute of retries alone), as `fuelline chat prepare` writes them."""
    from fuelline.io import read_records

    prepared = work / "servers-prepared"
    code, stderr = run(cli("chat", "prepare", "-i", SHARED_DATA / "chat" / "sharegpt_zh_1K.jsonl.zst",
                           "--train-output", prepared, "--eval-output", work / "servers-eval", "-q"))
    if code != 0:
        sys.exit(f"setup failed: {stderr[-2000:]}")
    short = (r for r in read_records(prepared)
             if sum(t["role"] == "assistant" for t in r["conversations"]) <= most_answers)
    records = [r for _, r in zip(range(count), short)]
    path = work / "servers-chats.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def many_chats(work: Path, count: int = 300) -> Path:
    """Enough two-turn conversations for servers to die in the middle of the run."""
    path = work / "servers-many.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"id": f"c{i}", "conversations": [
        {"role": "user", "content": f"问题 {i}"}, {"role": "assistant", "content": "旧"},
        {"role": "user", "content": f"再问 {i}"}, {"role": "assistant", "content": "旧"}]}) + b"\n"
        for i in range(count)))
    return path
