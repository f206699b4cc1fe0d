"""Reliability family (g), issue 36: the command line as a new user meets it.

- odd values: every numeric option of the commands that run stages, on the command line and as a
  pipeline file's key, given zero, a negative, a huge number, NaN, infinity or the wrong type; and
  the options whose values are names (`--store-reasoning`, `--regenerate-turns`, `--chat-template`,
  `--train-turns`), for which every such value is impossible.
  An impossible value must be refused in one line (`error: …`, exit 2) that names the option; a
  huge but possible one may run. Accepted and run on (exit 0, or an error about something else,
  such as the missing tokenizer the trial gives on purpose) is silent_wrong: the value reached
  the step.
- wrong record types: chat records to the commands that read documents and documents to those
  that read chat records. Each must exit 2 naming the file; exit 0 is silent_wrong (the old
  `tokenizer train` on chat records trained on 0 documents).
- stopped and rerun: `fuelline run` (clean → dedup) SIGKILLed at a random moment, then run again;
  its outputs must equal an uninterrupted run's, and neither a `.NAME.lock` nor a temp file may
  be left once the rerun ends (leftover otherwise). An uninterrupted run is checked the same way.

The command-line trials run in a forked child of this process through click's runner (a crash or
hang is an outcome, a trial costs milliseconds, not an interpreter start); the kills are real
processes. Called by benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import orjson

from trials import Tally, cli, free_port, isolated, kill_after, run

CHAT = {"id": "c1", "conversations": [{"role": "user", "content": "床前明月光？"},
                                      {"role": "assistant", "content": "疑是地上霜。"}]}
POEM = {"title": "静夜思", "author": "李白", "paragraphs": ["床前明月光，疑是地上霜。", "举头望明月，低头思故乡。"]}
IMPOSSIBLE = ("0", "-1", "-5.5", "nan", "-inf", "two")
POSSIBLE = ("1e300", "99999999999999999999")
REGENERATE = ["--server", "127.0.0.1:9", "--model", "m", "--attempts", "1", "--all-down-timeout", "1"]  # nothing there
# command words, the option, whether 0 is possible, and what the command needs besides --input/--output
OPTIONS = [
    (["clean"], "--workers", False, []), (["clean"], "--shard-size", False, []),
    (["clean"], "--max-han", False, []),
    (["dedup"], "--ngram", False, []), (["dedup"], "--num-perm", False, []), (["dedup"], "--threshold", False, []),
    (["pack"], "--workers", False, ["--tokenizer", "{empty}"]), (["pack"], "--shard-size", False, ["--tokenizer", "{empty}"]),
    (["pack"], "--val-fraction", True, ["--tokenizer", "{empty}"]),
    (["pack"], "--metadata-dropout", True, ["--tokenizer", "{empty}"]),
    (["tokenizer", "train"], "--vocab-size", False, []), (["tokenizer", "train"], "--min-frequency", False, []),
    (["chat", "prepare"], "--test-size", True, []),
    (["chat", "regenerate"], "--max-tokens", False, REGENERATE),
    (["chat", "regenerate"], "--concurrency", False, REGENERATE),
    (["chat", "regenerate"], "--top-p", True, REGENERATE),
    (["chat", "regenerate"], "--request-timeout", False, REGENERATE),
    (["cache", "build"], "--max-length", False, ["--model", "{empty}", "--layers", "1"]),
    (["cache", "build"], "--batch-tokens", False, ["--model", "{empty}", "--layers", "1"]),
    (["cache", "build"], "--max-shard-bytes", False, ["--model", "{empty}", "--layers", "1"]),
]
# options whose values are names: every odd value is impossible, and refused naming the option
NAMED = [(["chat", "regenerate"], "--store-reasoning", REGENERATE),
         (["chat", "regenerate"], "--regenerate-turns", REGENERATE),
         (["cache", "build"], "--chat-template", ["--model", "{empty}", "--layers", "1"]),
         (["pack"], "--train-turns", ["--tokenizer", "{empty}"])]
# pipeline key, its stage (None: [defaults]), whether 0 is possible
KEYS = [("workers", None, False), ("shard_size", "clean", False), ("max_han", "clean", False),
        ("num_perm", "dedup", False), ("val_fraction", "pack", True), ("vocab_size", "tokenizer", False),
        ("max_tokens", "regenerate", False), ("concurrency", "regenerate", False), ("temperature", "regenerate", True),
        ("min_shards", "cache", False), ("store_reasoning", "regenerate", False),
        ("regenerate_turns", "regenerate", False)]
TOML_VALUES = {"0": "0", "-1": "-1", "-5.5": "-5.5", "nan": "nan", "-inf": "-inf", "two": '"two"', "1e300": "1e300"}


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    work = work / "cli"
    work.mkdir(parents=True, exist_ok=True)
    raw, docs, chats, empty = work / "poems.jsonl", work / "docs.jsonl", work / "chats.jsonl", work / "empty-dir"
    count = 40 if full else 8
    raw.write_bytes(b"".join(orjson.dumps({**POEM, "title": f"静夜思 {i}"}) + b"\n" for i in range(count)))
    docs.write_bytes(b"".join(orjson.dumps({"id": f"d{i}", "text": f"{POEM['paragraphs'][0]} {i}", "meta": {}}) + b"\n"
                              for i in range(count)))
    chats.write_bytes(orjson.dumps(CHAT) + b"\n")
    empty.mkdir(exist_ok=True)
    rng = random.Random(seed)
    tallies = [odd_values_on_the_cli(work, docs, empty, full), odd_values_in_pipeline_files(work, docs, full),
               wrong_record_types(work, docs, chats), stopped_and_rerun(work, raw, 3 if full else 1, rng)]
    return tallies


def invoke(args: list[str]) -> tuple[int, str]:
    """`fuelline ARGS` in this process: (exit code, stderr); a traceback is left in stderr."""
    from click.testing import CliRunner

    from fuelline.cli import main

    result = CliRunner().invoke(main, args)
    text = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        text += "".join(traceback.format_exception(result.exception))
    return result.exit_code, text


def judge(code: int, stderr: str, names: str, impossible: bool) -> tuple[str, str]:
    """clear_error: exit 2, one `error:` line naming `names`; ok: a possible value that ran or was
    refused for it; silent_wrong: an impossible value that got past the options; else crash."""
    lines = stderr.strip().splitlines()
    if "Traceback" in stderr:
        return "crash", stderr[-600:]
    # ours is one `error:` line; click's own (a value of the wrong type) ends with an `Error:` line
    refused_for_it = code == 2 and bool(lines) and names in lines[-1] and lines[-1].lower().startswith("error:")
    if impossible:
        if refused_for_it:
            return "clear_error", ""
        return "silent_wrong", f"exit {code}: {stderr[-300:]}"
    return ("ok", "") if code in (0, 2) else ("crash", f"exit {code}: {stderr[-300:]}")


def odd_values_on_the_cli(work: Path, docs: Path, empty: Path, full: bool) -> Tally:
    tally = Tally("odd values of numeric options: command line")
    options = OPTIONS if full else OPTIONS[::2]
    for k, (words, flag, zero_ok, extra) in enumerate(options):
        for value in IMPOSSIBLE + POSSIBLE:
            impossible = value in IMPOSSIBLE and not (value == "0" and zero_ok)
            out = work / f"cli-out-{k}-{IMPOSSIBLE.index(value) if value in IMPOSSIBLE else value}"
            args = [*words, "-i", str(docs), *_output(words, out), *[a.format(empty=empty) for a in extra],
                    flag, value]
            outcome, note = _isolated_judged(args, flag, impossible)
            tally.add(outcome, f"{' '.join(words)} {flag} {value}: {note}")
    for k, (words, flag, extra) in enumerate(NAMED if full else NAMED[::2]):
        for value in IMPOSSIBLE + POSSIBLE:
            out = work / f"cli-named-{k}-{(IMPOSSIBLE + POSSIBLE).index(value)}"
            args = [*words, "-i", str(docs), *_output(words, out), *[a.format(empty=empty) for a in extra], flag, value]
            outcome, note = _isolated_judged(args, flag, True)
            tally.add(outcome, f"{' '.join(words)} {flag} {value}: {note}")
    return tally


def _judged(args: list[str], names: str, impossible: bool) -> str:
    outcome, note = judge(*invoke(args), names, impossible)
    if note:
        raise AssertionError(note) if outcome == "crash" else _Finding(outcome, note)
    return outcome


class _Finding(Exception):
    """A trial's finding with its note, through `isolated` (which reports an exception as a crash)."""

    def __init__(self, outcome: str, note: str):
        super().__init__(note)
        self.outcome = outcome


def _output(words: list[str], out: Path) -> list[str]:
    if words == ["chat", "prepare"]:
        return ["--train-output", str(out / "train"), "--eval-output", str(out / "eval")]
    if words == ["chat", "regenerate"]:
        return ["-o", str(out / "out.jsonl")]
    return ["-o", str(out)]


def odd_values_in_pipeline_files(work: Path, docs: Path, full: bool) -> Tally:
    tally = Tally("odd values of numeric options: pipeline files")
    for key, stage, zero_ok in KEYS if full else KEYS[::2]:
        for value in IMPOSSIBLE + POSSIBLE[:1]:
            impossible = value in IMPOSSIBLE and not (value == "0" and zero_ok)
            pipeline = work / f"p-{key}-{list(TOML_VALUES).index(value)}.toml"
            table = f"{key} = {TOML_VALUES[value]}\n"
            model = f'model = "{work}"\nlayers = [1]\n' if stage == "cache" else ""
            pipeline.write_text(f"[defaults]\n{table}[[step]]\nuse = \"clean\"\n" if stage is None else
                                f"[[step]]\nuse = \"{stage}\"\n{model}{table}")
            args = ["run", str(pipeline), "--run-dir", str(work / f"run-{pipeline.stem}"), "-i", str(docs), "-q"]
            outcome, note = _isolated_judged(args, repr(key), impossible)
            tally.add(outcome, f"{key} = {value}: {note}")
    return tally


def _isolated_judged(args: list[str], names: str, impossible: bool) -> tuple[str, str]:
    def trial() -> str:
        try:
            return _judged(args, names, impossible)
        except _Finding as finding:
            return f"{finding.outcome}\0{finding}"
    outcome, note = isolated(trial, timeout=120)
    if "\0" in outcome:
        outcome, note = outcome.split("\0", 1)
    return outcome, note


def wrong_record_types(work: Path, docs: Path, chats: Path) -> Tally:
    """Records of the other pipeline to each command; a tokenizer is trained first for pack."""
    tally = Tally("wrong record type per command")
    tokenizer = work / "tokenizer"
    code, stderr = invoke(["tokenizer", "train", "-i", str(docs), "-o", str(tokenizer), "--vocab-size", "300"])
    if code != 0:
        raise SystemExit(f"setup failed: {stderr[-2000:]}")
    from fuelline.models import tiny_chat_model

    model = tiny_chat_model(work / "model", [POEM["paragraphs"][0], CHAT["conversations"][1]["content"]] * 20,
                            vocab_size=300, layers=2)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "fuelline.serve.echo", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_until_answering(f"http://127.0.0.1:{port}/v1/models", server)
        return _wrong_record_trials(work, docs, chats, tokenizer, model, port, tally)
    finally:
        server.terminate()
        server.wait()


def _wait_until_answering(url: str, server: subprocess.Popen, timeout: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the echo server at {url} did not answer")


def _wrong_record_trials(work: Path, docs: Path, chats: Path, tokenizer: Path, model: Path, port: int,
                         tally: Tally) -> Tally:
    cases = [
        (["tokenizer", "train"], chats, []),
        (["pack"], chats, ["--tokenizer", str(tokenizer)]),
        (["pack"], docs, ["--tokenizer", str(tokenizer), "--template", "chat", "--chat-template", "chatml"]),
        (["clean", "--profile", "web"], chats, []),
        (["dedup"], chats, []),
        (["chat", "prepare"], docs, []),
        (["chat", "regenerate"], docs, ["--server", f"127.0.0.1:{port}", "--model", "echo"]),
        (["cache", "build"], docs, ["--model", str(model), "--layers", "0", "--chat-template", "chatml"]),
    ]
    for k, (words, source, extra) in enumerate(cases):
        args = [*words, "-i", str(source), *_output(words[:2], work / f"wrong-{k}"), *extra]
        outcome, note = _isolated_judged(args, str(source), True)
        tally.add(outcome, f"{' '.join(words)} on {source.name}: {note}")
    return tally


def stopped_and_rerun(work: Path, docs: Path, trials: int, rng: random.Random) -> Tally:
    """`fuelline run` killed and rerun (and run whole): same outputs, no lock or temp file left."""
    tally = Tally("fuelline run stopped and rerun: locks and temp files")
    pipeline = work / "clean-dedup.toml"
    pipeline.write_text('[defaults]\nworkers = 2\nshard_size = 4\n[[step]]\nuse = "clean"\n[[step]]\nuse = "dedup"\n')
    argv = lambda root: cli("run", pipeline, "--run-dir", root / "run", "-i", docs, "-q")  # noqa: E731
    started = time.perf_counter()
    code, stderr = run(argv(work / "ref"))
    duration = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"the uninterrupted run failed: {stderr[-2000:]}")
    reference = _outputs(work / "ref")
    tally.add(*_left_or_ok(work / "ref", reference, reference))
    for trial in range(trials):
        root = work / f"stopped-{trial}"
        kill_after(argv(root), rng.uniform(0.1, 0.9) * duration)
        code, stderr = run(argv(root))
        if code != 0:
            tally.add("hang" if code is None else "crash", f"rerun failed ({code}): {stderr[-400:]}")
            continue
        tally.add(*_left_or_ok(root, _outputs(root), reference))
    return tally


def _outputs(root: Path) -> dict[str, bytes]:
    """The data files of a run (stats with their timings left out)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.jsonl.zst"))
            if "_rejects" not in p.parts}


def _left_or_ok(root: Path, got: dict[str, bytes], reference: dict[str, bytes]) -> tuple[str, str]:
    if got != reference:
        return "silent_wrong", f"outputs differ: {sorted(set(got) ^ set(reference))[:5]}"
    left = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.name.endswith(".lock") or ".tmp-" in p.name]
    return ("leftover", f"left behind: {left[:5]}") if left else ("ok", "")
