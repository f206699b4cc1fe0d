"""Reliability family (q): refused reruns, unwritable outputs, too many workers, odd numbers given to
the library, and a tokenizer larger than its model.

- refused reruns: a finished small pipeline (clean, dedup, tokenizer, pack) run again with one option
  of each step changed, or its input edited: exit 2 in one line with the run directory byte for
  byte as it was is clear_error; any byte changed is silent_wrong.
- read-only and full outputs: every writing command into a read-only tmpfs, clean and pack into a
  tiny one: one line, exit 2, nothing written (skipped, saying so, where no tmpfs can be mounted).
- workers far above the shards: the run completes, says once that it capped them, and writes the
  bytes of --workers 1 (ok); other bytes are silent_wrong.
- library numbers: make_loader, TokenDataset, the cache collator and sampler, encode_chat with 0,
  negatives, floats, NaN and huge values: a ValueError naming the argument is clear_error, a value
  taken is silent_wrong, any other exception a crash.
- a model whose embedding is smaller than its tokenizer: cache build refused in one line, nothing written.

Called by benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import orjson

from common import SHARED_DATA
from trials import Tally, can_mount, cli, isolated, mount_tmpfs, run

PIPELINE = """[defaults]
on_error = "skip"
workers = 1
shard_size = 1000
[[step]]
use = "clean"
profile = "poetry"
min_chars = {min_chars}
[[step]]
use = "dedup"
threshold = {threshold}
[[step]]
use = "tokenizer"
vocab_size = {vocab}
[[step]]
use = "pack"
tokenizer = "@tokenizer"
template = "poetry"
val_fraction = {val}
"""
DEFAULTS = {"min_chars": 1, "threshold": 0.85, "vocab": 300, "val": 0.05}
TIMED = {"stats.json", "_plan.json", "summary.json", "pipeline.json"}  # they hold seconds


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    root = work / "refusals"
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "poems.jsonl"
    records = itertools.islice(_poems(), 3000 if full else 1000)
    corpus.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    run_dir = root / "run"
    code, stderr = _pipeline(root, DEFAULTS, corpus, run_dir)
    assert code == 0, stderr[-2000:]
    return [_reruns(root, corpus, run_dir, full), _unwritable(root, corpus, run_dir, full),
            _workers(root, corpus), _library(run_dir), _vocabulary(root)]


def _poems():
    from fuelline.io import read_records

    return read_records(SHARED_DATA / "chinese-poetry.jsonl.zst")


def _pipeline(root: Path, values: dict, corpus: Path, run_dir: Path) -> tuple[int | None, str]:
    pipeline = root / "p.toml"
    pipeline.write_text(PIPELINE.format(**values))
    return run(cli("run", pipeline, "--run-dir", run_dir, "-i", corpus, "-q"), timeout=300)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _refusal(code: int | None, stderr: str, unchanged: bool) -> tuple[str, str]:
    if code is None:
        return "hang", stderr
    if "Traceback" in stderr or code not in (0, 2):
        return "crash", stderr[-400:]
    if code == 0 or not unchanged:
        return "silent_wrong", f"exit {code}, {'unchanged' if unchanged else 'changed'}: {stderr[-300:]}"
    return ("clear_error", "") if stderr.strip().count("\n") == 0 and stderr.startswith("error: ") else \
        ("crash", f"not one line: {stderr[-300:]}")


def _reruns(root: Path, corpus: Path, run_dir: Path, full: bool) -> Tally:
    tally = Tally("refused reruns of a finished pipeline")
    changes = [{"min_chars": 8}, {"threshold": 0.9}, {"vocab": 320}, {"val": 0.1}]
    for change in changes if full else changes[1:3]:
        before = snapshot(run_dir)
        code, stderr = _pipeline(root, {**DEFAULTS, **change}, corpus, run_dir)
        tally.add(*_refusal(code, stderr, snapshot(run_dir) == before))
    edited = root / "edited.jsonl"
    lines = corpus.read_bytes().splitlines(keepends=True)
    edited.write_bytes(b"".join(lines[:-1]))
    before = snapshot(run_dir)
    code, stderr = _pipeline(root, DEFAULTS, edited, run_dir)
    tally.add(*_refusal(code, stderr, snapshot(run_dir) == before))
    return tally


def _unwritable(root: Path, corpus: Path, run_dir: Path, full: bool) -> Tally:
    tally = Tally("read-only and full output locations")
    if not can_mount(root):
        print("  skipped read-only and full outputs: no tmpfs can be mounted here (needs root)", flush=True)
        return tally
    steps = {"clean": run_dir / "01-clean", "tokenizer": run_dir / "03-tokenizer"}
    commands = {"clean": ["clean", "-i", corpus, "--profile", "poetry"], "dedup": ["dedup", "-i", steps["clean"]],
                "tokenizer": ["tokenizer", "train", "-i", steps["clean"], "--vocab-size", 300],
                "pack": ["pack", "-i", steps["clean"], "--tokenizer", steps["tokenizer"]],
                "run": ["run", root / "p.toml", "-i", corpus, "--run-dir"]}
    for k, (mount, size, read_only) in enumerate([("ro", 1 << 20, True), ("full", 64 << 10, False)]):
        disk = root / f"{mount}-disk"
        if not mount_tmpfs(disk, size, read_only=read_only):
            tally.add("crash", f"mount of {disk} failed")
            continue
        try:
            for name, args in commands.items():
                if not read_only and name not in ("clean", "pack"):
                    continue
                out = disk / "out"
                words = [*args, out] if name == "run" else [*args, "-o", out]
                code, stderr = run(cli(*words, "-q"), timeout=300)
                tally.add(*_refusal(code, stderr, not out.exists() or not read_only))
        finally:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    return tally


def _workers(root: Path, corpus: Path) -> Tally:
    tally = Tally("workers far above the input's shards")
    outputs, shard_size = {}, 400
    shards = -(-len(corpus.read_bytes().splitlines()) // shard_size)
    for workers in (1, 64):
        cwd = root / f"w{workers}"  # the same relative names: rejects record their source path
        cwd.mkdir(exist_ok=True)
        done = subprocess.run(cli("clean", "-i", corpus, "-o", "out", "--profile", "poetry", "--shard-size", shard_size,
                                  "-w", workers, "-q"), cwd=cwd, capture_output=True, text=True, timeout=300)
        outputs[workers] = ({k: v for k, v in snapshot(cwd / "out").items() if Path(k).name not in TIMED
                             and not k.startswith("_done/")}, done)
    same = outputs[64][0] == outputs[1][0]
    said = outputs[64][1].stderr.count(f"--workers 64: using {shards} (the input has {shards} shards)") == 1
    if outputs[64][1].returncode != 0:
        tally.add("crash", outputs[64][1].stderr[-400:])
    else:
        tally.add("ok" if same and said else "silent_wrong", f"same bytes {same}, said once {said}")
    return tally


def _library(run_dir: Path) -> Tally:
    tally = Tally("odd numbers given to library entry points")
    train = str(run_dir / "04-pack" / "train")
    odd = ["0", "-1", "2.5", "float('nan')", "True", "10**30"]
    calls = [(f"make_loader batch_size={v}", "batch_size", f"make_loader(TokenDataset({train!r}, 32), {v})")
             for v in odd]
    calls += [(f"make_loader {name}={v!r}", name, f"make_loader(TokenDataset({train!r}, 32), 4, {name}={v!r})")
              for name, v in (("num_workers", -1), ("world_size", 0), ("rank", 0.5), ("seed", 1.5))]
    calls += [(f"TokenDataset seq_len={v!r}", "seq_len", f"TokenDataset({train!r}, {v!r})") for v in (0, 64.0)]
    calls += [("CacheCollator", "pad_to_multiple_of", "CacheCollator(pad_to_multiple_of=-8)"),
              ("LengthGroupedBatchSampler", "max_tokens", "LengthGroupedBatchSampler([3], max_tokens=float('inf'))"),
              ("encode_chat", "max_length", "_Options(0.5, 'truncate', 1, None, 'last', 'all', 'refuse', 'raise')")]
    for label, argument, call in calls:
        outcome, note = isolated(lambda: _library_call(call, argument))
        tally.add(outcome if outcome in ("clear_error", "silent_wrong", "hang") else "crash", f"{label}: {note}")
    return tally


def _library_call(call: str, argument: str) -> str:
    from fuelline.cache.dataset import CacheCollator, LengthGroupedBatchSampler  # noqa: F401 - used by eval
    from fuelline.chat.encode import _Options  # noqa: F401
    from fuelline.loader import TokenDataset, make_loader  # noqa: F401

    try:
        loader = eval(call)  # noqa: S307 - the harness's own calls
        if hasattr(loader, "__iter__") and not isinstance(loader, TokenDataset):
            next(iter(loader), None)
    except ValueError as e:
        return "clear_error" if argument in str(e) or "batch" in str(e) else "crash"
    return "silent_wrong"


def _vocabulary(root: Path) -> Tally:
    tally = Tally("cache build with a tokenizer larger than the model's vocabulary")
    chats = root / "chats.jsonl"
    words = "the moon rises over quiet water while a boat drifts home".split()
    chats.write_text("".join(json.dumps({"id": f"c{i}", "conversations": [
        {"role": "user", "content": " ".join(words[i % 5:])}, {"role": "assistant", "content": " ".join(words)}]})
        + "\n" for i in range(8)))
    outcome, note = isolated(lambda: _small_model(root, words), timeout=300)
    if outcome != "ok":
        tally.add("crash", note)
        return tally
    out = root / "cache"
    code, stderr = run(cli("cache", "build", "--model", root / "small-model", "-i", chats, "-o", out, "--layers", "0",
                           "--device", "cpu", "-q"), timeout=300)
    before_forward = "outside the model's vocabulary" in stderr
    outcome, note = _refusal(code, stderr, not out.exists())
    tally.add(outcome if before_forward or outcome != "clear_error" else "crash", note or stderr[-300:])
    return tally


def _small_model(root: Path, words: list[str]) -> str:
    """A tiny chat model whose embedding has 100 rows under a tokenizer of a few hundred ids."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from transformers import AutoConfig, AutoModelForCausalLM

    from fuelline.models import tiny_chat_model

    model = tiny_chat_model(root / "small-model", [" ".join(words)] * 50 + [w * 3 for w in words], vocab_size=400,
                            layers=3)
    config = AutoConfig.from_pretrained(model)
    config.vocab_size = 100
    AutoModelForCausalLM.from_config(config).save_pretrained(model)
    return "ok"
