"""Reliability family (s): the forms an evaluation item takes in training data that
`fuelline decontaminate` must see through, and the forms of its inputs it must read as meant.

Items are real prompts of the shared chat files (GSM8K questions, codegen instructions with their
input, ShareGPT-zh first turns), each the evaluation set's item and planted in training records:

- split over turns: the item cut at a random word (Chinese: character) into two user turns with a
  real answer between them, under `--turns user` and `--turns all`; under `all` also cut between
  a user turn and the assistant turn after it, and between two assistant turns;
- in tool calls' arguments (a string value, nested in lists and objects, a string holding JSON,
  one of parallel calls) and in tool results (plain, JSON with escaped newlines and non-ASCII);
- hidden by invisible characters: each kind (soft hyphen, zero-width space, non-joiner and joiner,
  word joiner, BOM, bidi marks, variation selectors, combining grapheme joiner, a tag, a Hangul
  filler) put at random positions, in document records and in user turns.
Each planted record is a trial: found is ok, missed silent_wrong (a clean record dropped too).

- blank items: an evaluation set with items empty, spaces, invisible characters only, an empty
  list, a list of blank turns; the report must count them as blank and the real item be found
  (ok); a set of only blank items must be refused in one line (clear_error).
- evaluation paths holding `=` and `:`: the file the user named is checked (ok); where two
  readings name existing files, or none, a refusal naming them (clear_error); checking another
  file and exiting 0 is silent_wrong.
- odd records: no text, a mistyped text, an OpenAI `messages` record, ShareGPT's raw form, an
  empty conversation, a turn that is not an object, a tool call whose arguments are a string, an
  orphan tool result, a JSON array line, malformed JSON: under `--on-error skip` each must be in
  `_rejects/` under a reason with its line and the rest checked (ok, per record; a run that stops
  is a crash); under `raise` one error line naming FILE:LINE (clear_error).
- resumed with other options: a finished `--turns user` output rerun with `--turns all` is refused
  naming the option (clear_error), and with `--restart` finds what only `all` finds (ok).
- resumed over a damaged index: an interrupted run's evaluation index cut short or with a byte
  flipped at a random place, or its items file cut; the rerun must write what an undamaged run
  writes (ok).

Runs in this process through click's runner, each run forked (`trials.isolated`). Called by
benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from pathlib import Path

import orjson
from common import SHARED_DATA
from reliability_decontaminate import _invoke
from trials import Tally, damage_file, failure_outcome, isolated

from fuelline.decontaminate.ngrams import tokens
from fuelline.io import read_records

CHAT = SHARED_DATA / "chat"
INVISIBLE = {"soft hyphen": "\u00ad", "zero-width space": "\u200b", "zero-width non-joiner": "\u200c",
             "zero-width joiner": "\u200d", "word joiner": "\u2060", "byte order mark": "\ufeff",
             "left-to-right mark": "\u200e", "right-to-left override": "\u202e", "variation selector 16": "\ufe0f",
             "variation selector 1": "\ufe00", "combining grapheme joiner": "\u034f", "tag letter": "\U000e0061",
             "Mongolian variation selector": "\u180b", "Hangul filler": "\u3164", "invisible times": "\u2062"}
CLEAN = ["An unrelated note about the weather in spring and the garden.", "今天的天气很好，我们去公园散步吧。"]


def _items(per_source: int) -> list[str]:
    """Real prompts of each shared chat file, long enough (12 tokens) to be checked."""
    sources = [(r["question"] for r in read_records(CHAT / "gsm8k-train.jsonl.zst")),
               (r["instruction"] + "\n" + r["input"] for r in read_records(CHAT / "codegen-instruct.json.zst")),
               (r["conversations"][0]["value"] for r in read_records(CHAT / "sharegpt_zh_1K.jsonl.zst"))]
    return [t for source in sources for t in itertools.islice((t for t in source if len(tokens(t)) >= 12), per_source)]


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    work = work / "decontaminate_forms"
    work.mkdir(parents=True, exist_ok=True)
    items = _items(30 if full else 8)
    against = _jsonl(work / "eval.jsonl", [{"question": t} for t in items])
    rng = random.Random(seed)
    return [_split(work, against, items, rng), _tools(work, against, items, rng),
            _hidden(work, against, items, rng, full), _blank(work, items, full), _paths(work, items, full), _odd_records(work, against, items, full),
            _resumed(work, against, items), _damaged_index(work, against, items, rng, full)]


def _jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def _chat(id: str, *turns: tuple[str, str]) -> dict:
    return {"id": id, "conversations": [{"role": role, "content": content} for role, content in turns]}


def _cut(text: str, rng: random.Random) -> tuple[str, str]:
    """`text` cut at a random word boundary of its middle half (a Chinese text: at any character)."""
    n = len(text)
    spaces = [m.start() for m in re.finditer(r"\s", text) if n // 4 <= m.start() <= 3 * n // 4]
    cut = rng.choice(spaces) if spaces else rng.randint(n // 4, 3 * n // 4)
    return text[:cut], text[cut:]


def _planted_run(tally: Tally, work: Path, name: str, against: Path, planted: list[dict], args: list) -> None:
    """One run over the planted records and two clean ones: a trial per planted record (found: ok)
    and one for the clean records (kept: ok)."""
    train = _jsonl(work / f"{name}.jsonl", [*planted, *({"id": f"clean-{k}", "text": t} for k, t in enumerate(CLEAN))])
    out = work / f"{name}-out"

    def trial() -> str:
        code, stderr = _invoke(["decontaminate", "-i", train, "-o", out, "--against", against, "-q", *args])
        return "ok" if code == 0 else failure_outcome(code, stderr, str(train))

    outcome, note = isolated(trial)
    if outcome != "ok":  # every record of a run that failed is a finding: none of these inputs is wrong
        for _ in range(len(planted) + 1):
            tally.add("crash" if outcome == "clear_error" else outcome, f"{name}: {note}")
        return
    left = [p.name for p in out.rglob("*") if ".tmp-" in p.name or p.name.endswith(".lock")]
    if left:
        tally.add("leftover", f"{name}: left {left[:5]}")
    answer = {r["id"] for r in read_records(out)}
    for record in planted:
        tally.add("silent_wrong" if record["id"] in answer else "ok", f"{name}: {record['id']} missed")
    tally.add("ok" if {f"clean-{k}" for k in range(len(CLEAN))} <= answer else "silent_wrong",
              f"{name}: a clean record dropped")


def _split(work: Path, against: Path, items: list[str], rng: random.Random) -> Tally:
    tally = Tally("decontaminate items split over turns")
    answer = "Here is my answer to that, worked through step by step."
    for turns in ("user", "all"):
        planted = []
        for k, item in enumerate(items):
            first, second = _cut(item, rng)
            planted.append(_chat(f"user-user-{k}", ("user", first), ("assistant", answer), ("user", second),
                                 ("assistant", answer)))
            if turns == "all":
                planted.append(_chat(f"user-assistant-{k}", ("user", first), ("assistant", second)))
                planted.append(_chat(f"assistant-assistant-{k}", ("user", "Tell me."), ("assistant", first),
                                     ("user", "Go on."), ("assistant", second)))
        _planted_run(tally, work, f"split-{turns}", against, planted, ["--turns", turns])
    return tally


def _tools(work: Path, against: Path, items: list[str], rng: random.Random) -> Tally:
    tally = Tally("decontaminate items in tool arguments and tool results")
    forms = [
        lambda t: ({"code": t}, "done"),
        lambda t: ({"request": {"messages": [{"role": "user", "text": t}], "n": 1}, "tags": ["a", "b"]}, "done"),
        lambda t: ({"payload": json.dumps({"query": t}, ensure_ascii=True)}, "done"),
        lambda t: ({"q": "x"}, t),
        lambda t: ({"q": "x"}, json.dumps({"output": {"lines": t.splitlines()}, "ok": True}, ensure_ascii=True)),
        lambda t: ({"q": "x"}, json.dumps([{"text": t}], ensure_ascii=False, indent=2)),
    ]
    planted = []
    for k, item in enumerate(items):
        arguments, result = forms[k % len(forms)](item)
        calls = [{"type": "function", "function": {"name": "other", "arguments": {"x": 1}}},
                 {"id": "c2", "type": "function", "function": {"name": "tool", "arguments": arguments}}]
        rng.shuffle(calls)
        planted.append({"id": f"tool-{k}", "conversations": [
            {"role": "user", "content": "Please look this up."},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "ok"}, {"role": "tool", "content": result},
            {"role": "assistant", "content": "Here it is."}]})
    _planted_run(tally, work, "tools", against, planted, ["--turns", "all"])
    return tally


def _hidden(work: Path, against: Path, items: list[str], rng: random.Random, full: bool) -> Tally:
    tally = Tally("decontaminate items hidden by invisible characters")
    kinds = list(INVISIBLE.items()) + [("all kinds mixed", "".join(INVISIBLE.values()))]
    planted = []
    for kind, chars in kinds:
        for k, item in enumerate(items if full else items[::2]):
            share = rng.choice((0.05, 0.3, 1.0))
            hidden = "".join(c + (rng.choice(chars) if rng.random() < share else "") for c in item)
            planted.append({"id": f"{kind}-doc-{k}", "text": hidden} if k % 2 else
                           _chat(f"{kind}-chat-{k}", ("user", hidden), ("assistant", "Sure.")))
    _planted_run(tally, work, "hidden", against, planted, [])
    return tally


def _blank(work: Path, items: list[str], full: bool) -> Tally:
    tally = Tally("decontaminate with blank evaluation items")
    blanks = ["", " ", "\n\t ", "\u200b\u00ad", [], ["", " "], [{"content": ""}], [{"content": "\ufeff"}]]
    blanks = blanks if full else blanks[3::3]
    train = _jsonl(work / "blank-train.jsonl", [{"id": "copy", "text": items[0]}, {"id": "clean", "text": CLEAN[0]}])
    for k, blank in enumerate(blanks):
        against = _jsonl(work / f"blank-{k}.jsonl", [{"turns": [items[0]]}, {"turns": blank}, {"turns": [items[1]]}])
        only = _jsonl(work / f"only-blank-{k}.jsonl", [{"turns": blank}, {"turns": blank}])

        def counted() -> str:
            out = work / f"blank-out-{k}"
            code, stderr = _invoke(["decontaminate", "-i", train, "-o", out, "--against", against, "-q"])
            if code != 0:
                return failure_outcome(code, stderr, str(against))
            report = orjson.loads((out / "stats.json").read_bytes())["decontaminate"]["sets"][against.stem]
            return "ok" if (report["items"], report["items_found"], report.get("items_blank")) == (3, 1, 1) \
                else "silent_wrong"

        def refused() -> str:
            code, stderr = _invoke(["decontaminate", "-i", train, "-o", work / f"only-out-{k}", "--against", only,
                                    "-q"])
            return "silent_wrong" if code == 0 else failure_outcome(code, stderr, str(only))

        for trial in (counted, refused):
            outcome, note = isolated(trial)
            tally.add(outcome, f"blank {blank!r}: {note}")
    return tally


def _paths(work: Path, items: list[str], full: bool) -> Tally:
    """Each case: the files that exist (path: holds the item, or another), the spec, and the file meant
    (None: the spec must be refused)."""
    tally = Tally("decontaminate against evaluation paths holding an equals sign or a colon")
    meant, other = [{"question": items[0]}], [{"question": items[1]}]
    cases = [
        ({"split=test/eval.jsonl": meant}, "split=test/eval.jsonl:question", "split=test/eval.jsonl"),
        ({"split=test/eval.jsonl": meant}, "split=test/eval.jsonl", "split=test/eval.jsonl"),
        ({"split=test/eval.jsonl": meant, "test/eval.jsonl": other}, "split=test/eval.jsonl:question", None),
        ({"split=test/eval.jsonl": other, "test/eval.jsonl": meant}, "split=./test/eval.jsonl:question",
         "test/eval.jsonl"),
        ({"split=test/eval.jsonl": meant, "test/eval.jsonl": other}, "name=split=test/eval.jsonl:question",
         "split=test/eval.jsonl"),
        ({"v2:dev/eval.jsonl": meant}, "v2:dev/eval.jsonl:gsm8k", "v2:dev/eval.jsonl"),
        ({"v2:dev/eval.jsonl": meant}, "v2:dev/eval.jsonl", "v2:dev/eval.jsonl"),
        ({"a=b:c/eval.jsonl": meant}, "set=a=b:c/eval.jsonl:question", "a=b:c/eval.jsonl"),
        ({"eval.jsonl:question": meant, "eval.jsonl": other}, "eval.jsonl:question", None),
        ({}, "missing=nowhere/eval.jsonl:question", None),
    ]
    train = _jsonl(work / "paths-train.jsonl", [{"id": "copy", "text": items[0]}, {"id": "clean", "text": CLEAN[0]}])
    for k, (files, spec, target) in enumerate(cases if full else [cases[i] for i in (0, 2, 3, 7, 8, 9)]):
        base = work / f"paths-{k}"
        base.mkdir(parents=True, exist_ok=True)
        for name, records in files.items():
            _jsonl(base / name, records)

        def trial() -> str:
            import os

            os.chdir(base)  # forked: the harness's own directory is left alone
            code, stderr = _invoke(["decontaminate", "-i", train, "-o", "out", "--against", spec, "-q"])
            if target is None:
                return "silent_wrong" if code == 0 else failure_outcome(code, stderr, spec.split("=")[-1].split(":")[0])
            if code != 0:
                return failure_outcome(code, stderr, spec)
            report = orjson.loads(Path("out/stats.json").read_bytes())["decontaminate"]["sets"]
            checked = {Path(s["file"]).resolve() for s in report.values()}
            found = {r["id"] for r in read_records("out")} == {"clean"}
            return "ok" if checked == {Path(target).resolve()} and found else "silent_wrong"

        outcome, note = isolated(trial)
        tally.add(outcome, f"{spec} with {sorted(files)}: {note}")
    return tally


ODD = {
    "no text": {"id": "x", "body": "no text here"},
    "text null": {"id": "x", "text": None},
    "text a number": {"id": "x", "text": 42},
    "OpenAI messages": {"id": "x", "messages": [{"role": "user", "content": "hello"}]},
    "ShareGPT raw": {"id": "x", "conversations": [{"from": "human", "value": "hello"}]},
    "empty conversation": {"id": "x", "conversations": []},
    "turn not an object": {"id": "x", "conversations": ["hello"]},
    "arguments a string": {"id": "x", "conversations": [{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1}"}}]}]},
    "orphan tool result": {"id": "x", "conversations": [{"role": "user", "content": "hi"},
                                                        {"role": "tool", "content": "result"}]},
    "JSON array line": [1, 2, 3],
    "malformed JSON": b'{"id": "x", "text": ',
}


def _odd_records(work: Path, against: Path, items: list[str], full: bool) -> Tally:
    tally = Tally("decontaminate odd records under --on-error skip and raise")
    for k, (name, odd) in enumerate(ODD.items() if full else list(ODD.items())[::3]):
        line = odd if isinstance(odd, bytes) else orjson.dumps(odd)
        train = work / f"odd-{k}.jsonl"
        train.write_bytes(orjson.dumps({"id": "copy", "text": items[0]}) + b"\n" + line + b"\n"
                          + orjson.dumps({"id": "clean", "text": CLEAN[0]}) + b"\n")

        def skip() -> str:
            out = work / f"odd-skip-{k}"
            code, stderr = _invoke(["decontaminate", "-i", train, "-o", out, "--against", against, "--on-error",
                                    "skip", "-q"])
            if code != 0:  # a stop where skipping was asked for is no clear error: the run was meant to go on
                return "crash"
            rejected = {(r["reason"], r["line"]) for r in read_records(out / "_rejects")}
            kept = {r["id"] for r in read_records(out)}
            return "ok" if kept == {"clean"} and len(rejected) == 2 and ("contaminated", 1) in rejected \
                and any(line == 2 for _, line in rejected) else "silent_wrong"

        def refuse() -> str:
            code, stderr = _invoke(["decontaminate", "-i", train, "-o", work / f"odd-raise-{k}", "--against", against,
                                    "-q"])
            return "silent_wrong" if code == 0 else failure_outcome(code, stderr, f"{train}:2: ")

        for mode, trial in (("skip", skip), ("raise", refuse)):
            outcome, note = isolated(trial)
            tally.add(outcome, f"{name} under {mode}: {note}")
    return tally


def _resumed(work: Path, against: Path, items: list[str]) -> Tally:
    tally = Tally("decontaminate resumed with another --turns")
    planted = [_chat("in-answer", ("user", "Give me a problem."), ("assistant", items[0]))]
    train = _jsonl(work / "resumed.jsonl", [*planted, {"id": "clean", "text": CLEAN[0]}])
    out = work / "resumed-out"

    def trial() -> str:
        args = ["decontaminate", "-i", train, "-o", out, "--against", against, "-q"]
        code, stderr = _invoke([*args, "--turns", "user"])
        if code != 0 or {r["id"] for r in read_records(out)} != {"in-answer", "clean"}:
            return failure_outcome(code, stderr, str(train)) if code else "silent_wrong"
        code, stderr = _invoke([*args, "--turns", "all"])
        if code == 0:
            return "silent_wrong"  # the output of --turns user taken for one of --turns all
        return failure_outcome(code, stderr, "turns")

    def restarted() -> str:
        code, stderr = _invoke(["decontaminate", "-i", train, "-o", out, "--against", against, "-q", "--turns", "all",
                                "--restart"])
        if code != 0:
            return failure_outcome(code, stderr, str(train))
        return "ok" if {r["id"] for r in read_records(out)} == {"clean"} else "silent_wrong"

    for step in (trial, restarted):
        outcome, note = isolated(step)
        tally.add(outcome, note)
    return tally


def _damaged_index(work: Path, against: Path, items: list[str], rng: random.Random, full: bool) -> Tally:
    tally = Tally("decontaminate resumed over a damaged evaluation index")
    train = _jsonl(work / "index-train.jsonl", [{"id": f"copy-{k}", "text": t} for k, t in enumerate(items)]
                   + [{"id": f"clean-{k}", "text": t} for k, t in enumerate(CLEAN)])
    args = ["decontaminate", "-i", train, "--against", against, "-q", "--report-only", "--shard-size", "4"]
    damages = [("ngrams.npz", "truncate"), ("ngrams.npz", "flip"), ("items.json", "truncate")] * (4 if full else 1)
    for k, (name, kind) in enumerate(damages):
        out = work / f"index-out-{k}"
        where, value = rng.random(), rng.randint(1, 255)

        def trial() -> str:
            code, stderr = _invoke([*args, "-o", out])
            if code != 0:
                return failure_outcome(code, stderr, str(train))
            reference = sorted(p.read_bytes() for p in out.glob("part-*"))
            for left in ("stats.json", "_done/part-00001.json", "_prepare/found/part-00001.json"):
                (out / left).unlink()
            damage_file(out / "_prepare" / "index" / name, kind, where, value)
            code, stderr = _invoke([*args, "-o", out])
            if code != 0:
                return failure_outcome(code, stderr, str(out))
            return "ok" if sorted(p.read_bytes() for p in out.glob("part-*")) == reference else "silent_wrong"

        outcome, note = isolated(trial)
        tally.add(outcome, f"{name} {kind} at {where:.2f}: {note}")
    return tally
