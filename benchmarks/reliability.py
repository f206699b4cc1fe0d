"""Reliability harness: kills, damaged files, bad corpora and a full disk, each trial ending in a named outcome.

    python benchmarks/reliability.py [--reduced] [--sections LETTERS] [--trials N] [--seed S] [--json PATH]

Families of scenarios:

(a) kill: a command runs on a subset of the real poetry corpus (`clean`, `boilerplate`, `dedup`,
    `tokenizer train`, `pack`, `chat prepare`, and in the full run `chat regenerate` against echo
    servers and `cache build` of a tiny local model); it is SIGKILLed with its whole process group
    at a random moment of its reference duration, run again, and every output file compared with
    an uninterrupted run's, and no temp or work file may be left.
(b) fuzz: every reader of our formats (token dataset: manifest.json, tokens.bin, docs.idx,
    mask.bin; the JsonlIndex cache; the target cache) gets damaged files drawn by hypothesis
    (truncations, flipped bytes, lying manifest fields, swapped offsets), then is verified and read.
(c) bad corpora: nesting 20,000 and 100,000 deep, a record nested 300 deep, a JSON array cut in the
    middle, lone surrogate escapes and a byte order mark in a JSON array, invalid UTF-8, an 80 MB
    line, truncated and mislabelled compressed files; `fuelline clean` under `--on-error skip` and
    `raise`, in a 3 GiB address space.
(d) disk full (root only: a tmpfs): `clean` and `pack` into a disk too small, then the same command
    again with room.

The distillation half's families, one module each: (b) also edits every field of a target
cache's manifest and index records, for both formats and every reader mode
(reliability_cache.py); (e) chat template spans fuzzed against transformers' assistant masks
(reliability_templates.py); (f) servers that answer wrongly or die under `chat regenerate`
(reliability_servers.py); (g) exports rerun after each kind of damage and vocab-map
on damaged caches and pack outputs (reliability_exports.py), for SpecForge's export and both layouts of
speculators'.

(h) tool-call arguments and reasoning in every form (integers beyond 64 bits, floats
a rendering would change, lone surrogates, each `<think>` form, fields on the wrong role, OpenAI
weights) through `chat prepare`, and through `chat regenerate` against echo servers answering in
them: no rounded number or think tag may reach the rendered text, no field vanish unsaid
(reliability_chat_forms.py).

(i) servers that stall, are slow or do not stream, and prompt records, under
`chat regenerate`, each trial bounded in time so that a hang is one (reliability_stalls.py).

(j) chat records a template should not train on as given: answers spelling control
tokens, records a template cannot render under `--on-error raise|skip` (pack and the cache build's
plan), records the chat record contract refuses (refused alike by regenerate, before any request,
by pack and by the plan), weight-0 assistant turns, and a pack resumed with a changed policy
(reliability_chat_records.py).

(k) the command line as a new user meets it (reliability_cli.py): numeric options
given zero, negatives, huge numbers, NaN, infinity or the wrong type, on the command line and in
pipeline files; records of the other pipeline to each command; `fuelline run` killed and rerun,
leaving no lock or temp file.

(l) `chat regenerate` resumed with another model, option or input (reliability_resume.py):
refused, naming what differs, the output untouched; other request settings resume.

(m) the streaming target cache (reliability_stream.py): `fuelline cache stream`
resumed with other options, damaged partitions and manifest, odd values (window 1, one-sample
partitions, a disk bound below a partition), its builder and trainer ranks SIGKILLed: every
sample once per epoch, byte-equal to the offline build's, or a clear error.

(n) `decontaminate` against bad evaluation sets, with odd values of its options,
and rerun after its evaluation set was edited (reliability_decontaminate.py); (a) kills and resumes it.

(o) tool-call and reasoning conversations on served templates without generation
blocks (Hermes', Llama 3.1's, Mistral's, Qwen2.5's, DeepSeek-R1's, Qwen3's), against transformers
on each template's twin with blocks, and on two broken templates (one ignores `tool_calls`, one
writes a turn only once another follows) that must refuse them (reliability_tool_templates.py).

(p) outputs that are, hold or lie inside an input, or another output, for every command
that writes (absolute, through symlinks and `..`, with and without --restart), and empty and
repeated inputs, evaluation sets, servers, --config and pipeline files inside outputs, and
--restart over an output holding a user's file (reliability_paths.py): refused in one line with the
tree byte for byte unchanged.

(q) refused reruns of a finished pipeline (an option of each step, an edited input),
read-only and full output locations, --workers far above the shards (capped, said once, the same
bytes), odd numbers given to the library's entry points, and a model whose embedding is smaller
than its tokenizer (reliability_refusals.py): one line, nothing changed, or a ValueError naming the
argument.

(r) the streaming cache's acknowledgements against its window
(reliability_stream_acks.py): acknowledgement modes, shuffle groups, windows, DataLoader batches
and workers, with kills and a builder resumed with another window, each trial bounded in time:
every sample once per epoch, or a refusal when a side opens or resumes, never a deadlock.

(s) the forms a planted evaluation item takes that `decontaminate` must see through (split
over turns under each --turns, in tool calls' arguments and tool results, behind invisible
characters of each kind) and the inputs it must read as meant (blank items, evaluation paths
holding `=` and `:`, odd records under --on-error skip and raise, a rerun with another --turns)
(reliability_decontaminate_forms.py).

(t) tool calls whose names and argument values are words the template itself writes (`end`, `im`,
`<|`, `assistant`, `tool_call` …, drawn from each template's rendering), on the served templates
without generation blocks, GLM-4-0414's and plain ChatML: supervised as transformers does on the
twin with blocks where the template shows calls, refused where it cannot (reliability_tool_names.py).

Outcomes of a trial are those of benchmarks/trials.py (ok, clear_error, silent_wrong, crash, hang,
leftover).

`--reduced` (CI) runs fewer trials on a smaller subset; tests/test_reliability.py runs it in three
parts that the slow part's two workers take one by one (`--sections abcd`, then the families in two
groups), and fails on any
silent_wrong, crash, hang or leftover. Results: benchmarks/results/reliability.json
(full runs) and the table in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SHARED_DATA, write_result  # noqa: E402
import reliability_cache  # noqa: E402
import reliability_chat_forms  # noqa: E402
import reliability_chat_records  # noqa: E402
import reliability_cli  # noqa: E402
import reliability_decontaminate  # noqa: E402
import reliability_decontaminate_forms  # noqa: E402
import reliability_exports  # noqa: E402
import reliability_paths  # noqa: E402
import reliability_refusals  # noqa: E402
import reliability_resume  # noqa: E402
import reliability_servers  # noqa: E402
import reliability_stalls  # noqa: E402
import reliability_stream  # noqa: E402
import reliability_stream_acks  # noqa: E402
import reliability_templates  # noqa: E402
import reliability_tool_names  # noqa: E402
import reliability_tool_templates  # noqa: E402
from trials import (OUTCOMES, Tally, can_mount, cli, damage_file, failure_outcome, free_port, isolated,  # noqa: E402
                    judged, kill_after, mount_tmpfs, run, table)

BOOKKEEPING = {"stats.json", "_plan.json", "summary.json", "training_report.json"}  # they hold seconds

SERVERS: list[subprocess.Popen] = []  # the echo servers of the full run


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every data file under `directory` (bookkeeping with timings and output locks left out)."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name not in BOOKKEEPING and not p.name.endswith((".lock", ".stats.json"))
            and "_done" not in p.parts and ".build" not in p.parts}


def leftovers(directory: Path) -> list[str]:
    return [p.relative_to(directory).as_posix() for p in directory.rglob("*")
            if ".tmp-" in p.name or p.name in ("_work", ".build")]


# --- (a) kill and resume ----------------------------------------------------------------------------

@dataclass
class Job:
    """A command writing into one output directory; `resume` is what re-running it adds."""

    name: str
    argv: Callable[[Path], list[str]]
    resume: tuple[str, ...] = ()
    lines_in_any_order: bool = False  # regenerate: answers land as servers reply


def kill_trial(job: Job, out: Path, reference: dict[str, bytes], duration: float, rng: random.Random,
               tally: Tally) -> None:
    kill_after(job.argv(out / "o"), rng.uniform(0.05, 0.95) * duration)
    code, stderr = run(job.argv(out / "o") + list(job.resume))
    if code != 0:
        tally.add("hang" if code is None else "crash", f"resume failed ({code}): {stderr}")
        return
    got = snapshot(out)
    if job.lines_in_any_order:
        got, reference = ({k: sorted(v.splitlines()) for k, v in files.items()} for files in (got, reference))
    if got != reference:
        differing = sorted(k for k in got.keys() | reference.keys() if got.get(k) != reference.get(k))
        tally.add("silent_wrong", f"resumed output differs: {differing[:5]}")
    elif leftovers(out):
        tally.add("leftover", f"left behind: {leftovers(out)[:5]}")
    else:
        tally.add("ok")


def kill_scenarios(work: Path, jobs: list[Job], trials: int, rng: random.Random) -> list[Tally]:
    tallies = []
    for job in jobs:
        tally = Tally(f"kill -9 and resume: {job.name}")
        reference_dir = work / f"ref-{job.name}"
        started = time.perf_counter()
        code, stderr = run(job.argv(reference_dir / "o"))
        duration = time.perf_counter() - started
        if code != 0:
            sys.exit(f"{job.name}: the uninterrupted run failed: {stderr[-2000:]}")
        reference = snapshot(reference_dir)
        for trial in range(trials):
            kill_trial(job, work / f"kill-{job.name}-{trial}", reference, duration, rng, tally)
        print(f"  {tally.scenario}: {dict(tally.counts)} (reference {duration:.1f} s)", flush=True)
        tallies.append(tally)
    return tallies


def poem_subset(work: Path, count: int) -> Path:
    """The first `count` raw poems of the real corpus as a .jsonl.zst."""
    from fuelline.io import read_records

    path = work / "poems.jsonl.zst"
    with zstandard.ZstdCompressor().stream_writer(open(path, "wb")) as f:
        for _, record in zip(range(count), read_records(SHARED_DATA / "chinese-poetry.jsonl.zst")):
            f.write(orjson.dumps(record) + b"\n")
    return path


def pipeline_jobs(work: Path, raw: Path, full: bool) -> list[Job]:
    """The commands of both pipelines, their inputs prepared once (uninterrupted)."""
    cleaned, tokenizer = work / "in-clean", work / "in-tokenizer"
    for argv in (cli("clean", "-i", raw, "-o", cleaned, "-w", 2, "--shard-size", 4000, "-q"),
                 cli("tokenizer", "train", "-i", cleaned, "-o", tokenizer, "--vocab-size", 1000)):
        code, stderr = run(argv)
        if code != 0:
            sys.exit(f"setup failed: {stderr[-2000:]}")
    chats = SHARED_DATA / "chat" / "sharegpt_zh_1K.jsonl.zst"
    shards = ("-w", 2, "--shard-size", 4000, "-q")
    against = held_apart_poems(work, cleaned)
    jobs = [
        Job("clean", lambda o: cli("clean", "-i", raw, "-o", o, *shards)),
        Job("boilerplate", lambda o: cli("boilerplate", "-i", cleaned, "-o", o, *shards)),
        Job("dedup", lambda o: cli("dedup", "-i", cleaned, "-o", o, *shards)),
        Job("decontaminate", lambda o: cli("decontaminate", "-i", cleaned, "-o", o, "--against", against, *shards)),
        Job("tokenizer train", lambda o: cli("tokenizer", "train", "-i", cleaned, "-o", o, "--vocab-size", 1000)),
        Job("pack", lambda o: cli("pack", "-i", cleaned, "--tokenizer", tokenizer, "-o", o, "--threads", 1,
                                  *shards)),
        Job("chat prepare", lambda o: cli("chat", "prepare", "-i", chats, "--train-output", o / "train",
                                          "--eval-output", o / "eval", "-w", 2, "--shard-size", 200, "-q")),
    ]
    if full:
        jobs += full_only_jobs(work, chats)
    return jobs


def held_apart_poems(work: Path, cleaned: Path) -> Path:
    """Every 500th cleaned poem as an evaluation set: decontaminate's kill trials drop their copies."""
    from fuelline.io import read_records

    path = work / "in-eval-poems.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"text": r["text"]}) + b"\n"
                              for k, r in enumerate(read_records(cleaned)) if k % 500 == 0))
    return path


def full_only_jobs(work: Path, chats: Path) -> list[Job]:
    """Regeneration against two echo servers, and a cache build of a tiny local Qwen3."""
    from fuelline.models import tiny_chat_model

    prepared = work / "in-chats"
    code, stderr = run(cli("chat", "prepare", "-i", chats, "--train-output", prepared, "--eval-output",
                           work / "in-eval", "-q"))
    if code != 0:
        sys.exit(f"setup failed: {stderr[-2000:]}")
    ports = [free_port(), free_port()]
    for port in ports:  # stopped by main when the harness ends
        SERVERS.append(subprocess.Popen([sys.executable, "-m", "fuelline.serve.echo", "--port", str(port),
                                         "--delay", "0.005"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    servers = [arg for port in ports for arg in ("--server", f"127.0.0.1:{port}")]
    from fuelline.io import read_records

    texts = [turn["content"] for record in read_records(prepared) for turn in record["conversations"]]
    model = tiny_chat_model(work / "model", texts[:2000])
    return [
        Job("chat regenerate", lambda o: cli("chat", "regenerate", "-i", prepared, "-o", o / "out.jsonl", *servers,
                                             "--model", "echo", "--preset", "none", "--concurrency", 8, "-q"),
            resume=("--resume",), lines_in_any_order=True),
        Job("cache build", lambda o: cli("cache", "build", "--model", model, "-i", prepared, "-o", o,
                                         "--layers", "0,1", "--max-length", 256)),
    ]


# --- (c) bad corpora --------------------------------------------------------------------------------

def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def bad_corpora(good: list[bytes], full: bool) -> dict[str, tuple[str, bytes, int]]:
    """name → (file suffix, content, bad records in it) around the good records (JSONL lines)."""
    jsonl = b"".join(line + b"\n" for line in good)
    array = b"[" + b",".join(good) + b"]"
    half = len(good) // 2
    middle = lambda bad: b"".join(line + b"\n" for line in good[:half]) + bad + b"\n" + jsonl[  # noqa: E731
        sum(len(line) + 1 for line in good[:half]):]
    cases = {
        "json array element nested 20,000 deep": (".json", array[:-1] + b"," + nested(20_000) + b"]", 1),
        "jsonl record nested 300 deep": (".jsonl", middle(b'{"title": ' + nested(300) + b"}"), 1),
        "json array cut in the middle": (".json", array[:-1] + b',{"title": "cut', 1),
        "json array with lone surrogate escapes": (".json", array[:-1] + b',{"title": "\\udc00"},'
                                                                     b'{"title": "a\\ud800b"}]', 2),
        "json array after a UTF-8 byte order mark": (".json", b"\xef\xbb\xbf" + array, 0),
        "invalid UTF-8 in a line": (".jsonl", middle(b'{"title": "\xff\xfe", "paragraphs": ["x"]}'), 1),
        "an 80 MB line": (".jsonl", middle(b'{"title": "' + b"a" * (80 << 20) + b'"}'), 1),
        "zstd cut in a frame": (".jsonl.zst", zstandard.ZstdCompressor().compress(jsonl)[:-100], 1),
        "gzip cut": (".jsonl.gz", gzip.compress(jsonl)[:-100], 1),
        "plain JSONL named .zst": (".jsonl.zst", jsonl, 1),
        "plain JSONL named .gz": (".jsonl.gz", jsonl, 1),
        "plain JSONL named .bz2": (".jsonl.bz2", jsonl, 1),
        "plain JSONL named .xz": (".jsonl.xz", jsonl, 1),
    }
    if full:
        cases["json array element nested 100,000 deep"] = (".json", array[:-1] + b"," + nested(100_000) + b"]", 1)
    return cases


def clean_stats(out: Path) -> dict:
    return orjson.loads((out / "stats.json").read_bytes())


def bad_corpus_scenarios(work: Path, raw: Path, full: bool) -> list[Tally]:
    """Each bad file through `clean` with skip (all good records kept, the bad counted) and raise."""
    from fuelline.io import read_records

    good = [orjson.dumps(r) for _, r in zip(range(400), read_records(raw))]
    (work / "good.jsonl").write_bytes(b"".join(line + b"\n" for line in good))
    code, stderr = run(cli("clean", "-i", work / "good.jsonl", "-o", work / "good-out", "-w", 1, "-q"))
    if code != 0:
        sys.exit(f"setup failed: {stderr[-2000:]}")
    expected = clean_stats(work / "good-out")
    tallies = []
    for k, (name, (suffix, content, bad)) in enumerate(bad_corpora(good, full).items()):
        tally = Tally(f"bad corpus: {name}")
        path = work / f"bad-{k}{suffix}"
        path.write_bytes(content)
        for mode in ("skip", "raise"):
            out = work / f"bad-{k}-{mode}"
            code, stderr = run(cli("clean", "-i", path, "-o", out, "-w", 1, "-q", "--on-error", mode),
                               limit_memory=True)
            if code != 0:
                tally.add(failure_outcome(code, stderr, path.name), f"{mode}: exit {code}: {stderr}")
                continue
            stats = clean_stats(out)
            counted = sum(stats["dropped"].values()) - sum(expected["dropped"].values())
            if stats["records_out"] == expected["records_out"] and counted >= bad:
                tally.add("ok")
            else:
                tally.add("silent_wrong", f"{mode}: kept {stats['records_out']} of {expected['records_out']}, "
                                          f"{counted} counted as dropped of {bad} bad")
        path.unlink()
        print(f"  {tally.scenario}: {dict(tally.counts)}", flush=True)
        tallies.append(tally)
    return tallies


# --- (d) disk full ----------------------------------------------------------------------------------

def disk_full_scenarios(work: Path, jobs: list[Job], fractions: tuple[float, ...]) -> list[Tally]:
    """Each job into a tmpfs of `fraction` of its output's size, then again with room: the same bytes."""
    tallies = []
    for job in jobs:
        error, resume = Tally(f"disk full: {job.name} (the error)"), Tally(f"disk full: {job.name} (then resumed)")
        reference_dir = work / f"ref-{job.name}"
        reference = snapshot(reference_dir)
        size = sum(p.stat().st_size for p in reference_dir.rglob("*") if p.is_file())
        for k, fraction in enumerate(fractions):
            disk = work / f"disk-{job.name.replace(' ', '-')}-{k}"
            if not mount_tmpfs(disk, max(64 << 10, int(size * fraction))):
                error.add("crash", "mount failed")
                continue
            try:
                code, stderr = run(job.argv(disk / "o"))
                if code == 0:
                    error.add("silent_wrong" if snapshot(disk) != reference else "ok", "finished on a full disk")
                elif "no space left on device while writing" in stderr:
                    error.add(failure_outcome(code, stderr, str(disk)), stderr)
                else:
                    error.add("crash", f"exit {code}: {stderr}")
                subprocess.run(["mount", "-o", f"remount,size={4 * size + (16 << 20)}", str(disk)], check=True)
                code, stderr = run(job.argv(disk / "o"))
                if code != 0:
                    resume.add("crash", f"exit {code}: {stderr}")
                elif snapshot(disk) != reference:
                    resume.add("silent_wrong", "resumed output differs")
                else:
                    resume.add("leftover" if leftovers(disk) else "ok", f"left behind: {leftovers(disk)[:5]}")
            finally:
                subprocess.run(["umount", "-l", str(disk)], capture_output=True)
        for tally in (error, resume):
            print(f"  {tally.scenario}: {dict(tally.counts)}", flush=True)
        tallies += [error, resume]
    return tallies


# --- (b) fuzzed readers -----------------------------------------------------------------------------

LIES = [None, -1, 0, 1, "12", 12.5, [], {}, "uint8", ["uint16"], 2**70]
TOKEN_FIELDS = ["format", "version", "dtype", "vocab_size", "num_documents", "num_tokens", "mask", "files"]


def token_dataset_reader(directory: Path):
    """What a training run reads after `fuelline verify`: every window, its labels and positions."""
    import numpy as np

    from fuelline.formats.tokens import verify_token_dataset
    from fuelline.loader.dataset import TokenDataset

    def read() -> dict:
        verify_token_dataset(directory)
        dataset = TokenDataset(directory, seq_len=32, document_aware=True)
        batch = dataset.__getitems__(list(range(len(dataset))))
        return {k: np.asarray(v) for k, v in batch.items()}
    return read


def fuzz_token_dataset(work: Path, source: Path, examples: int, seed: int) -> Tally:
    from hypothesis import given, settings, strategies as st
    from hypothesis import seed as hypothesis_seed

    from fuelline.formats.tokens import TokenFormatError

    original_dir = source / "train"
    original = token_dataset_reader(original_dir)()
    tally = Tally("fuzz: token dataset (manifest.json, tokens.bin, docs.idx, mask.bin)")
    names = ["manifest.json", "tokens.bin", "docs.idx", "mask.bin"]
    damage = st.one_of(
        st.tuples(st.just("truncate"), st.sampled_from(names), st.floats(0, 1), st.just(0)),
        st.tuples(st.just("flip"), st.sampled_from(names), st.floats(0, 1), st.integers(1, 255)),
        st.tuples(st.just("lie"), st.sampled_from([*TOKEN_FIELDS, "(whole manifest)"]), st.integers(0, len(LIES)),
                  st.just(0)),
        st.tuples(st.just("swap offsets"), st.just("docs.idx"), st.floats(0, 1), st.floats(0, 1)),
    )

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None)
    @given(damage)
    def trial(case) -> None:
        directory = work / "fuzz-tokens"
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(original_dir, directory)
        kind, name, a, b = case
        if kind == "lie":
            apply_lie(directory / "manifest.json", name, a)
            name = "manifest.json"
        elif kind == "swap offsets":
            swap_offsets(directory / "docs.idx", a, b)
        elif (directory / name).exists():
            damage_file(directory / name, kind, a, b)
        outcome, note = isolated(lambda: judged(token_dataset_reader(directory), original, TokenFormatError, name))
        tally.add(outcome, f"{case}: {note}")

    trial()
    return tally


def apply_lie(manifest: Path, field_name: str, which: int) -> None:
    """Replace a manifest field by a wrong value (which == len(LIES): remove it), or the whole manifest."""
    data = orjson.loads(manifest.read_bytes())
    lie = LIES[which] if which < len(LIES) else "(removed)"
    if field_name == "(whole manifest)":
        data = lie if lie != "(removed)" else None
    elif lie == "(removed)":
        data.pop(field_name, None)
    else:
        data[field_name] = lie
    manifest.write_bytes(json.dumps(data).encode())  # json: orjson refuses the 2**70 lie


def swap_offsets(path: Path, a: float, b: float) -> None:
    import numpy as np

    offsets = np.fromfile(path, dtype="<u8")
    i, j = (min(int(x * len(offsets)), len(offsets) - 1) for x in (a, b))
    offsets[[i, j]] = offsets[[j, i]]
    offsets.tofile(path)


def fuzz_jsonl_index(work: Path, cleaned: Path, examples: int, seed: int) -> list[Tally]:
    """A damaged index cache must be rebuilt (ok); a data file cut after indexing, a clear error."""
    from hypothesis import given, settings, strategies as st
    from hypothesis import seed as hypothesis_seed

    from fuelline.io import read_records
    from fuelline.io.jsonl_index import FileChangedError, JsonlIndex

    data = work / "index.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for _, r in zip(range(3000), read_records(cleaned))))
    cache = work / "index-cache"

    def records(index: JsonlIndex) -> dict:
        import numpy as np

        return {"records": np.array([orjson.dumps(index[k]) for k in range(len(index))], dtype=object)}

    def read_all() -> dict:
        return records(JsonlIndex(data, cache_dir=cache))

    original = read_all()
    cache_tally, data_tally = Tally("fuzz: JsonlIndex cache"), Tally("fuzz: JsonlIndex data file cut after indexing")

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None)
    @given(st.sampled_from(["truncate", "flip", "directory", "empty"]), st.floats(0, 1), st.integers(1, 255))
    def cache_trial(kind, where, value) -> None:
        shutil.rmtree(cache, ignore_errors=True)
        read_all()
        (entry,) = list(cache.iterdir())
        if kind == "directory":
            entry.unlink()
            entry.mkdir()
        elif kind == "empty":
            entry.write_bytes(b"")
        else:
            damage_file(entry, kind, where, value)
        outcome, note = isolated(lambda: judged(read_all, original, ValueError, entry.name))
        cache_tally.add(outcome, f"{kind} {where:.3f}: {note}")

    cache_trial()
    content = data.read_bytes()
    for where in random.Random(seed).sample(range(1, len(content)), max(1, examples // 4)):
        shutil.rmtree(cache, ignore_errors=True)
        data.write_bytes(content)
        index = JsonlIndex(data, cache_dir=cache)
        data.write_bytes(content[:where])
        outcome, note = isolated(lambda index=index: judged(lambda: records(index), original, FileChangedError,
                                                            data.name))
        data_tally.add(outcome, f"cut at {where}: {note}")
    data.write_bytes(content)
    return [cache_tally, data_tally]


# --- the run ----------------------------------------------------------------------------------------

def shown(tallies: list[Tally]) -> list[Tally]:
    for tally in tallies:
        print(f"  {tally.scenario}: {dict(tally.counts)}", flush=True)
    return tallies


# The families of their own modules, in the order they run: each has `scenarios(work, full=, seed=)`.
FAMILIES = [
    ("(e) chat template spans fuzzed against transformers' assistant masks", reliability_templates),
    ("(f) chat regenerate against servers that answer wrongly or die", reliability_servers),
    ("(g) cache exports rerun after damage, vocab-map on damaged caches and pack outputs", reliability_exports),
    ("(h) tool arguments and reasoning in every form, through chat prepare and chat regenerate",
     reliability_chat_forms),
    ("(i) chat regenerate against stalled, slow and non-streaming servers, and on prompts", reliability_stalls),
    ("(j) chat records: special-token text, unrenderable records, contract refusals, weight-0 turns, changed "
     "policies",
     reliability_chat_records),
    ("(k) the command line: odd values, wrong record types, stopped runs' locks", reliability_cli),
    ("(l) chat regenerate resumed with another model, option or input", reliability_resume),
    ("(m) the streaming target cache: resumed with other options, damaged, odd values, killed", reliability_stream),
    ("(n) decontaminate: bad evaluation sets, odd values, an evaluation set edited between runs",
     reliability_decontaminate),
    ("(o) tool-call conversations on served templates without generation blocks, and on broken ones",
     reliability_tool_templates),
    ("(p) outputs overlapping inputs or each other, empty and repeated inputs, for every command", reliability_paths),
    ("(q) refused reruns, unwritable outputs, too many workers, odd library numbers, a model smaller than its "
     "tokenizer", reliability_refusals),
    ("(r) the streaming target cache's acknowledgements against its window: no deadlock, no lost sample",
     reliability_stream_acks),
    ("(s) decontaminate forms: items split over turns, in tool calls and results, behind invisible characters; "
     "blank items, paths with = and :, odd records", reliability_decontaminate_forms),
    ("(t) tool names and argument values that collide with the template's own text", reliability_tool_names),
]
ALL_SECTIONS = "abcd" + "".join(title[1] for title, _ in FAMILIES)


class Sections:
    """Prints each section's title, and its time once the next one starts: where the harness's
    minutes go (its reduced run is part of CI's budget). `seconds` keeps them for the JSON."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._title, self._started = None, 0.0

    def __call__(self, title: str) -> None:
        self.end()
        print(title, flush=True)
        self._title, self._started = title, time.perf_counter()

    def end(self) -> None:
        if self._title is not None:
            seconds = round(time.perf_counter() - self._started, 1)
            self.seconds[self._title.split(")")[0] + ")"] = seconds
            print(f"  ({seconds:.0f} s)", flush=True)
            self._title = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true", help="the CI run: fewer trials, a smaller subset")
    parser.add_argument("--trials", type=int, default=None, help="kill trials per command (default 5; reduced 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sections", default=ALL_SECTIONS, metavar="LETTERS",
                        help="the sections to run, by letter (default: all, %(default)s); (b) and (d) damage "
                             "and rerun what (a) builds, so they need it. The slow tests run two halves side by side")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here (default for full runs: "
                                                                "benchmarks/results/reliability.json)")
    args = parser.parse_args()
    if not (SHARED_DATA / "chinese-poetry.jsonl.zst").exists():
        sys.exit(f"{SHARED_DATA} has no chinese-poetry.jsonl.zst: the harness needs the shared corpus")
    sections = set(args.sections)
    if sections - set(ALL_SECTIONS) or not sections or sections & set("bd") and "a" not in sections:
        sys.exit(f"--sections {args.sections}: letters of {ALL_SECTIONS}, with a wherever b or d is")
    full = not args.reduced
    trials = args.trials or (5 if full else 1)
    examples = 200 if full else 40
    rng = random.Random(args.seed)
    started = time.perf_counter()
    section = Sections()
    work = Path(tempfile.mkdtemp(prefix="fuelline-reliability-"))
    os.environ["FUELLINE_CACHE_DIR"] = str(work / "fuelline-cache")
    tallies: list[Tally] = []
    try:
        if "a" in sections or "c" in sections:
            raw = poem_subset(work, 60_000 if full else 12_000)
        if "a" in sections:
            section(f"(a) kill -9 at a random moment, then resume ({trials} per command)")
            jobs = pipeline_jobs(work, raw, full)
            tallies += kill_scenarios(work, jobs, trials, rng)
        if "b" in sections:
            section(f"(b) fuzzed readers ({examples} cases each)")
            tallies += shown([fuzz_token_dataset(work, work / "ref-pack" / "o", examples, args.seed),
                              *fuzz_jsonl_index(work, work / "in-clean", examples, args.seed),
                              *reliability_cache.scenarios(work, full=full, seed=args.seed)])
        if "c" in sections:
            section("(c) bad corpora through clean --on-error skip|raise")
            tallies += bad_corpus_scenarios(work, raw, full)
        if "d" in sections:
            section("(d) disk full")
            if can_mount(work):
                by_name = {job.name: job for job in jobs}
                tallies += disk_full_scenarios(work, [by_name["clean"], by_name["pack"]],
                                               (0.3, 0.7) if full else (0.5,))
            else:
                print("  skipped: no tmpfs can be mounted here (it needs root and a container that allows it)",
                      flush=True)
        for title, family in FAMILIES:
            if title[1] in sections:
                section(title)
                tallies += shown(family.scenarios(work, full=full, seed=args.seed))
        section.end()
    finally:
        for server in SERVERS:
            server.kill()
        subprocess.run(["umount", "-l", *map(str, work.glob("disk-*"))], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    rows = [t.row() for t in tallies]
    print(table(rows))
    result = {"reduced": args.reduced, "sections": args.sections, "seed": args.seed, "kill_trials": trials, "fuzz_examples": examples,
              "seconds": round(time.perf_counter() - started, 1), "section_seconds": section.seconds, "scenarios": rows,
              "totals": {o: sum(r[o] for r in rows) for o in OUTCOMES}}
    print(f"totals: {result['totals']} in {result['seconds']} s")
    if args.json:
        args.json.write_text(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    elif full and sections == set(ALL_SECTIONS):  # benchmarks/results holds whole runs only
        print(f"wrote {write_result('reliability', result)}")


if __name__ == "__main__":
    main()
