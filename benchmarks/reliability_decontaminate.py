"""Reliability family (n), issue 40: `fuelline decontaminate` with bad evaluation sets, odd values
and an evaluation set edited between a run and its rerun.

- bad evaluation sets: a missing file, a directory, an empty file, invalid JSON, a truncated
  .zst, a record that lacks the field, a field that holds a number or a list of numbers, a dotted
  path that leads nowhere, a file of no known layout without FIELD, a JSON array of strings. Each
  must be refused in one line naming the file (exit 2): clear_error; exit 0 is silent_wrong (the
  run went on against a set it could not read), a traceback a crash.
- odd values: the extremes of each numeric option that are possible (ngram 1, threshold 1,
  min_ngrams and common at their least and huge): exit 0 with the planted verbatim item found and
  the clean record kept is ok (a threshold of 1 and a verbatim copy: the item is found whatever
  the rule), anything else a finding.
- edited: the set gains an item after a finished run; the rerun must be refused naming the
  change (clear_error), never answer with the old output (silent_wrong); with --restart it must
  find the new item (ok).

Runs in this process through click's runner, each trial forked (`trials.isolated`). Called by
benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import zstandard

from trials import Tally, failure_outcome, isolated

QUESTION = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
OTHER = "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?"
BAD_SETS = {
    "empty": (".jsonl", b""),
    "invalid JSON": (".jsonl", b'{"question": "one?"\n'),
    "truncated zst": (".jsonl.zst", zstandard.ZstdCompressor().compress(orjson.dumps({"question": QUESTION}) * 50)[:20]),
    "field missing in line 2": (".jsonl", orjson.dumps({"question": QUESTION}) + b"\n" + b'{"prompt": "x"}\n'),
    "field holds a number": (".jsonl:question", b'{"question": 42}\n'),
    "field holds numbers": (".jsonl:turns", b'{"turns": [1, 2]}\n'),
    "dotted path leads nowhere": (".jsonl:doc.query", orjson.dumps({"doc": {"text": QUESTION}}) + b"\n"),
    "no known layout": (".jsonl", b'{"query": "q", "gold": "a"}\n'),
    "array of strings": (".json", orjson.dumps([QUESTION, OTHER])),
}
ODD_VALUES = [["--ngram", "1"], ["--ngram", "40"], ["--threshold", "1"], ["--threshold", "0.01"],
              ["--min-ngrams", "1"], ["--min-ngrams", "99999999"], ["--common", "1"], ["--common", "99999999"]]


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    work = work / "decontaminate"
    work.mkdir(parents=True, exist_ok=True)
    train = work / "train.jsonl"
    train.write_bytes(orjson.dumps({"id": "planted", "text": f"Please solve: {QUESTION} Thanks."}) + b"\n"
                      + orjson.dumps({"id": "clean", "text": "An unrelated record about the weather in spring."})
                      + b"\n")
    good = work / "gsm8k.jsonl"
    good.write_bytes(orjson.dumps({"question": QUESTION}) + b"\n")
    return [_bad_sets(work, train), _odd_values(work, train, good), _edited(work, train)]


def _invoke(args: list) -> tuple[int, str]:
    from click.testing import CliRunner

    from fuelline.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.stderr + (repr(result.exception) if result.exit_code not in (0, 2) else "")


def _kept(out: Path) -> set[str]:
    from fuelline.io import read_records

    return {r["id"] for r in read_records(out)}


def _bad_sets(work: Path, train: Path) -> Tally:
    tally = Tally("decontaminate against a bad evaluation set")
    specs = {"missing file": str(work / "missing.jsonl"), "a directory": str(work)}
    for k, (name, (suffix, content)) in enumerate(BAD_SETS.items()):
        file_suffix, _, field = suffix.partition(":")
        path = work / f"bad-{k}{file_suffix}"
        path.write_bytes(content)
        specs[name] = f"{path}:{field}" if field else str(path)
    for k, (name, spec) in enumerate(specs.items()):
        named = spec.split(":")[0]

        def trial() -> str:
            code, stderr = _invoke(["decontaminate", "-i", train, "-o", work / f"bad-out-{k}", "--against", spec, "-q"])
            return "silent_wrong" if code == 0 else failure_outcome(code, stderr, named)

        outcome, note = isolated(trial)
        tally.add(outcome, f"{name}: {note}")
    return tally


def _odd_values(work: Path, train: Path, good: Path) -> Tally:
    tally = Tally("decontaminate with odd values of its options")
    for k, words in enumerate(ODD_VALUES):
        out = work / f"odd-{k}"

        def trial() -> str:
            code, stderr = _invoke(["decontaminate", "-i", train, "-o", out, "--against", good, *words, "-q"])
            if code != 0:
                return failure_outcome(code, stderr, words[0])
            if words == ["--ngram", "40"]:  # longer than the item: nothing can be found, and that is said
                stats = orjson.loads((out / "stats.json").read_bytes())
                return "ok" if stats["decontaminate"]["sets"]["gsm8k"]["parts_too_short"] == 1 else "silent_wrong"
            return "ok" if _kept(out) == {"clean"} else "silent_wrong"

        outcome, note = isolated(trial)
        tally.add(outcome, f"{words}: {note}")
    return tally


def _edited(work: Path, train: Path) -> Tally:
    tally = Tally("decontaminate rerun after its evaluation set was edited")
    against, out = work / "edited.jsonl", work / "edited-out"
    against.write_bytes(orjson.dumps({"question": OTHER}) + b"\n")
    args = ["decontaminate", "-i", train, "-o", out, "--against", against, "-q"]

    def trial() -> str:
        code, stderr = _invoke(args)
        if code != 0 or _kept(out) != {"planted", "clean"}:
            return failure_outcome(code, stderr, str(against)) if code else "silent_wrong"
        against.write_bytes(against.read_bytes() + orjson.dumps({"question": QUESTION}) + b"\n")
        code, stderr = _invoke(args)
        if code == 0:
            return "silent_wrong"  # the old output taken for one against the edited set
        outcome = failure_outcome(code, stderr, "--restart")
        code, stderr = _invoke([*args, "--restart"])
        return outcome if code == 0 and _kept(out) == {"clean"} else "silent_wrong"

    outcome, note = isolated(trial)
    tally.add("ok" if outcome == "clear_error" else outcome, note)
    return tally
