"""Decontamination on real chat data: how the defaults were chosen, and the speed against the 13-gram rule.

The data: the three chat files of shared/data (GSM8K train questions, GPTeacher codegen
instructions, ShareGPT-zh conversations), each cut in two. A held-apart slice of each is an
evaluation set (GSM8K `question`, codegen `instruction`, ShareGPT-zh's first human turn); the
rest of all three are the training records (chat records, user turns checked). Nothing of the
repository's tests is used, and no public evaluation set: the rule is not tuned to one.

- Planted items: items of the evaluation slices put into training records as edited copies, one
  kind of edit each, in turn: verbatim; case, spacing and punctuation changed; embedded in a
  longer prompt (another record's prompt before and after); with an answer appended; cut to its
  first half; every tenth word left out. Recall = planted records in which their own item is found.
- False positives: training records (not planted) in which an item is found. Each flagged pair is
  judged by difflib: when the record holds less than 80% of the item's tokens in order, it is a
  false positive (codegen's templated prompts: "Write a shell script that takes a directory path
  as an argument and …" two different tasks); otherwise it is a real repeat of the item in the data
  (GSM8K and codegen hold some), counted apart.
- Grid: n-gram length x threshold, each row recall per edit and false positives; the defaults
  (ngram 8, threshold 0.5) are the row documented in docs/decontaminate.md.
- Speed: the matching of the same training texts (all of them, planted records included) by
  fuelline's index and by a literal implementation of the 13-gram rule (GPT-3's, lm-evaluation-
  harness's, NeMo Curator's: lower case, punctuation to spaces, split on whitespace, a record is
  contaminated when one of its word 13-grams is one of an evaluation item's), both in one process
  on one core, best of 5; and recall of both on the planted English items. datatrove is not run:
  its index builder loads evaluation sets only through lighteval's task registry, and its English
  word tokenizer needs spaCy; neither is in benchmarks/.venv.
- Memory: the index's bytes; and the stage end to end (2 workers, chat records, shards of 5,000)
  over the training records and over four copies of them: the workers' peak memory stays the same.

    .venv/bin/python benchmarks/bench_decontaminate.py [--smoke]
"""

from __future__ import annotations

import argparse
import difflib
import random
import re
import string
import time
from pathlib import Path

from common import SHARED_DATA, MemoryPeaks, best_of, parse_args, smoke, write_result

from fuelline.decontaminate.evalsets import EvalItem, EvalSet
from fuelline.decontaminate.index import Rule, build_index
from fuelline.decontaminate.ngrams import tokens
from fuelline.io import read_records

CHAT = SHARED_DATA / "chat"
EDITS = ("verbatim", "case_spacing_punctuation", "embedded", "answer_appended", "first_half", "every_tenth_word_dropped")
GRID = [(n, t) for n in (5, 6, 8, 10, 13) for t in (0.3, 0.5, 0.7)]
DEFAULT = (8, 0.5)
MIN_NGRAMS, COMMON = 5, 10
LITERAL_N = 13
PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}]")


def load_sources(limit: int | None) -> dict[str, list[tuple[str, str]]]:
    """Per source, (prompt, answer) pairs in file order."""
    def take(records, prompt, answer):
        pairs = []
        for record in records:
            p, a = prompt(record), answer(record)
            if p and p.strip():
                pairs.append((p, a or ""))
                if limit and len(pairs) == limit:
                    break
        return pairs

    def first(record, role):
        return next((t["value"] for t in record.get("conversations", []) if t.get("from") == role), None)

    return {
        "gsm8k": take(read_records(CHAT / "gsm8k-train.jsonl.zst"), lambda r: r["question"], lambda r: r["answer"]),
        "codegen": take(read_records(CHAT / "codegen-instruct.json.zst"),
                        lambda r: (r["instruction"] + ("\n" + r["input"] if r.get("input") else "")),
                        lambda r: r["response"]),
        "sharegpt_zh": take(read_records(CHAT / "sharegpt_zh_1K.jsonl.zst"), lambda r: first(r, "human"),
                            lambda r: first(r, "gpt")),
    }


def respell(text: str, rng: random.Random) -> str:
    """Case, spacing and punctuation changed: what copying through a web page or a chat UI does."""
    text = text.upper() if rng.random() < 0.5 else text.lower()
    text = re.sub(r"\s+", lambda m: rng.choice(["  ", "\n", " \t "]), text)
    return text.replace(",", " ;").replace(".", "!").replace("?", " ??").replace("，", ",").replace("。", ".")


def edit(kind: str, prompt: str, answer: str, other: str, rng: random.Random) -> str:
    if kind == "verbatim":
        return prompt
    if kind == "case_spacing_punctuation":
        return respell(prompt, rng)
    if kind == "embedded":
        half = len(other) // 2
        return f"{other[:half]}\n\nHere is the task: {prompt}\n\nThanks! {other[half:]}"
    if kind == "answer_appended":
        return f"{prompt}\n{answer}"
    if kind == "first_half":
        return prompt[: len(prompt) // 2]
    words = prompt.split(" ")
    if len(words) < 20:  # Chinese has no spaces: drop every tenth character instead
        return "".join(c for k, c in enumerate(prompt) if k % 10 != 9)
    return " ".join(w for k, w in enumerate(words) if k % 10 != 9)


def split_data(sources, held: int, planted: int, rng: random.Random):
    """Evaluation sets, training texts (planted first), and which item each planted record holds."""
    sets, train, truth = [], [], []
    for name, pairs in sources.items():
        size = min(held, len(pairs) // 3)
        sets.append(EvalSet(name, f"{name} (held apart)", "prompt",
                            tuple(EvalItem(i + 1, None, (p,)) for i, (p, _) in enumerate(pairs[:size]))))
        rest = pairs[size:]
        for k in range(min(planted, size)):
            kind = EDITS[k % len(EDITS)]
            prompt, answer = pairs[k]
            train.append(edit(kind, prompt, answer, rng.choice(rest)[0], rng))
            truth.append((len(sets) - 1, k, kind, name))
        train_rest = [p for p, _ in rest]
        sets[-1] = (sets[-1], train_rest)
    clean = [t for _, rest in sets for t in rest]
    return [s for s, _ in sets], train + clean, truth


def judged_false(item: str, record: str) -> bool:
    """Whether a flagged pair is a false positive: the record holds less than 80% of the item's tokens
    (words, CJK characters) in order, as difflib matches them."""
    a, b = tokens(item), tokens(record)
    shared = sum(block.size for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
    return shared < 0.8 * len(a)


def evaluate(sets, train, truth, rule: Rule) -> dict:
    index = build_index(sets, rule)
    parts = index.items["parts"]
    matches = []
    for start in range(0, len(train), 512):
        matches.extend(index.match(train[start:start + 512]))
    recall = {kind: [0, 0] for kind in EDITS}
    by_language = {"english": [0, 0], "chinese": [0, 0]}
    for d, (s, k, kind, name) in enumerate(truth):
        hit = any(parts[p][0] == s and parts[p][1] == k for p, _, _ in matches[d])
        recall[kind][0] += hit
        recall[kind][1] += 1
        language = by_language["chinese" if name == "sharegpt_zh" else "english"]
        language[0] += hit
        language[1] += 1
    flagged = repeats = false = 0
    examples = []
    for d in range(len(truth), len(train)):
        if not matches[d]:
            continue
        flagged += 1
        s, i, _ = parts[matches[d][0][0]]
        if judged_false(sets[s].items[i].parts[0], train[d]):
            false += 1
            if len(examples) < 3:
                examples.append({"set": sets[s].name, "item": sets[s].items[i].parts[0][:200], "record": train[d][:300]})
        else:
            repeats += 1
    clean = len(train) - len(truth)
    return {"ngram": rule.ngram, "threshold": rule.threshold,
            "recall": {k: round(h / t, 4) for k, (h, t) in recall.items() if t},
            "recall_by_language": {k: round(h / t, 4) for k, (h, t) in by_language.items() if t},
            "recall_all": round(sum(h for h, _ in recall.values()) / max(1, len(truth)), 4),
            "clean_records": clean, "flagged_clean_records": flagged, "real_repeats": repeats,
            "false_positives": false, "false_positive_rate": round(false / max(1, clean), 6),
            "false_positive_examples": examples, "index_bytes": index.nbytes}


def literal_13gram(sets, texts: list[str]) -> list[bool]:
    """The 13-gram rule as written in the papers: one shared word 13-gram contaminates a record."""
    def grams(text: str) -> list[str]:
        words = PUNCTUATION.sub(" ", text.lower()).split()
        return [" ".join(words[i:i + LITERAL_N]) for i in range(len(words) - LITERAL_N + 1)]

    index = {g for s in sets for item in s.items for part in item.parts for g in grams(part)}
    return [any(g in index for g in grams(text)) for text in texts]


def speed(sets, train, truth) -> dict:
    index = build_index(sets, Rule(*DEFAULT, MIN_NGRAMS, COMMON))

    def ours():
        return [bool(m) for start in range(0, len(train), 512) for m in index.match(train[start:start + 512])]

    ours()  # compiled and warm
    repeats = 1 if smoke() else 5
    fuelline_s, ours_found = best_of(ours, repeats)
    literal_s, literal_found = best_of(lambda: literal_13gram(sets, train), repeats)
    megabytes = sum(len(t.encode()) for t in train) / 1e6
    english = [d for d, (_, _, _, name) in enumerate(truth) if name != "sharegpt_zh"]
    issue_edits = [d for d in english if truth[d][2] in EDITS[:4]]  # the issue's edits, English (the rule's script)

    def share(found, among):
        return round(sum(found[d] for d in among) / len(among), 4)

    items = [part for s in sets for item in s.items for part in item.parts]
    literal_false = sum(1 for d in range(len(truth), len(train)) if literal_found[d]
                        and all(judged_false(item, train[d]) for item in items if _shares_13gram(item, train[d])))
    return {"records": len(train), "megabytes": round(megabytes, 2),
            "fuelline_seconds": round(fuelline_s, 3), "literal_13gram_seconds": round(literal_s, 3),
            "fuelline_mb_per_s": round(megabytes / fuelline_s, 1), "literal_13gram_mb_per_s": round(megabytes / literal_s, 2),
            "speedup": round(literal_s / fuelline_s, 1),
            "recall_issue_edits_english": {"fuelline": share(ours_found, issue_edits),
                                           "literal_13gram": share(literal_found, issue_edits)},
            "recall_planted_english": {"fuelline": share(ours_found, english), "literal_13gram": share(literal_found, english)},
            "recall_planted_all": {"fuelline": share(ours_found, range(len(truth))),
                                   "literal_13gram": share(literal_found, range(len(truth)))},
            "false_positives": {"fuelline": None, "literal_13gram": literal_false},
            "index_bytes": index.nbytes}


def _shares_13gram(item: str, record: str) -> bool:
    return bool(literal_13gram([EvalSet("", "", "", (EvalItem(1, None, (item,)),))], [record])[0])


def stage_run(sets, train, work: Path, copies: int) -> dict:
    """The stage end to end (read, check, write, rejects, report) on 2 workers, over the training
    texts as chat records repeated `copies` times: its time and its processes' peak memory, which
    should not grow with the training data."""
    import orjson

    from fuelline.decontaminate.stage import DecontaminateConfig, DecontaminateStage
    from fuelline.pipeline.executor import RunOptions, run_stage

    work.mkdir(parents=True, exist_ok=True)
    specs = []
    for s in sets:
        path = work / f"{s.name}.jsonl"
        path.write_bytes(b"".join(orjson.dumps({"prompt": item.parts[0]}) + b"\n" for item in s.items))
        specs.append(f"{path}:prompt")
    source = work / f"train-x{copies}.jsonl"
    with open(source, "wb") as f:
        for copy in range(copies):
            f.writelines(orjson.dumps({"id": f"r{copy}-{k}", "conversations": [
                {"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]}) + b"\n"
                for k, text in enumerate(train))
    started = time.perf_counter()
    with MemoryPeaks() as peaks:
        stats = run_stage(DecontaminateStage(DecontaminateConfig(against=specs)), source, work / f"out-x{copies}",
                          RunOptions(workers=2, shard_size=5_000, progress=False))
    seconds = time.perf_counter() - started
    return {"records": stats["records_in"], "dropped": stats["dropped"].get("contaminated", 0),
            "seconds": round(seconds, 2), "records_per_s": round(stats["records_in"] / seconds), **peaks.result()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, default=500, help="items held apart per source as its evaluation set")
    parser.add_argument("--planted", type=int, default=240, help="planted records per source")
    args = parse_args(parser)
    held, planted, limit = (60, 30, 600) if smoke() else (args.held, args.planted, None)
    rng = random.Random(0)
    sets, train, truth = split_data(load_sources(limit), held, planted, rng)
    print(f"{len(sets)} evaluation sets ({sum(len(s.items) for s in sets):,} items), {len(train):,} training "
          f"records ({len(truth):,} planted)", flush=True)
    grid = []
    for n, t in ([DEFAULT] if smoke() else GRID):
        started = time.perf_counter()
        row = evaluate(sets, train, truth, Rule(n, t, MIN_NGRAMS, COMMON))
        grid.append(row)
        print(f"ngram {n:>2} threshold {t}: recall {row['recall_all']:.3f} {row['recall']}, false positives "
              f"{row['false_positives']} of {row['clean_records']:,} (real repeats {row['real_repeats']}) "
              f"({time.perf_counter() - started:.1f}s)", flush=True)
    timing = speed(sets, train, truth)
    timing["false_positives"]["fuelline"] = next(row["false_positives"] for row in grid
                                                 if (row["ngram"], row["threshold"]) == DEFAULT)
    print(f"speed: fuelline {timing['fuelline_mb_per_s']} MB/s, literal 13-gram rule "
          f"{timing['literal_13gram_mb_per_s']} MB/s: {timing['speedup']}x; recall on the issue's edits of English "
          f"items {timing['recall_issue_edits_english']}, on every planted English item "
          f"{timing['recall_planted_english']}, on all {timing['recall_planted_all']}; false positives "
          f"{timing['false_positives']}", flush=True)
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        stage = [stage_run(sets, train, Path(scratch), copies) for copies in ((1,) if smoke() else (1, 4))]
    for row in stage:
        print(f"stage, 2 workers: {row['records']:,} records in {row['seconds']} s, peak worker RSS "
              f"{row['peak_worker_rss_mib']} MiB", flush=True)
    write_result("decontaminate", {"stage": stage, "data": {"sources": [str(Path(p).name) for p in sorted(CHAT.glob('*.zst'))],
                                            "held_apart_per_source": held, "planted_per_source": planted,
                                            "training_records": len(train), "min_ngrams": MIN_NGRAMS, "common": COMMON},
                                   "default": {"ngram": DEFAULT[0], "threshold": DEFAULT[1]},
                                   "grid": grid, "speed": timing})


if __name__ == "__main__":
    main()
