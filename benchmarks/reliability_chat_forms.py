"""Reliability family (g), issue 36: tool-call arguments and reasoning in every form, through
`fuelline chat prepare` and through `fuelline chat regenerate` against echo servers that answer
in those forms; the question each trial asks is whether a rounded number or a think tag can reach
the rendered, supervised text, or a field vanish unsaid.

chat prepare: one record per form, all in one input file, prepared once by the CLI, then each
record judged (the rendering is qwen3's, which renders tool calls and reasoning):
- ok: kept, its turns exactly as expected (arguments with every integer exact, reasoning read
  out of the content, weight and fields kept), no tag in a content, and every integer literal of
  the arguments rendered as written;
- clear_error: dropped with a named reason and a detail, for a form that cannot be kept exactly
  (lone surrogates, numbers a rendering would change, tags elsewhere, fields on the wrong role);
- silent_wrong: kept but wrong, kept although expected refused, a valid form refused, or a record
  in neither the output nor the rejects; crash: the command failed with a traceback.
Floats of the object form are read as doubles (as every JSON reader does); the string form's,
which is text a model wrote, must render as written or be refused.

chat regenerate: an echo server answering in one form (`--fault think-*`, `big-integer-arguments`),
with `--store-reasoning keep` and `drop`: ok when every answer is stored as chat prepare parses it
(reasoning kept or gone, never a tag) and integers stay exact; clear_error when every record is
in OUT.errors under the form's reason and nothing is written.

Called by benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import orjson
from reliability_servers import echo_servers
from trials import Tally, cli, run

TRIAL_LIMIT_S = 120
CLIENT = ("--concurrency", "2", "--request-timeout", "10", "--attempts", "2", "-q")
INTEGERS = ("123456789012345678901234567890", "-9223372036854775809", "18446744073709551616", "18446744073709551615",
            "9223372036854775807", "-9223372036854775808", "1" + "0" * 60, "-" + "9" * 40, "0", "42")
FLOATS_KEPT = ("0.1", "1e5", "-2.5e-3", "0.30000000000000004", "1.5E+300")
FLOATS_REFUSED = ("1.00000000000000000001", "1e400", "-1e400", "3.14159265358979323846", "0.10000000000000001")
STRINGS_REFUSED = ('"\\ud800"', '"\\udc00x"', '"a\\ud800\\ud800"', '{"\\udbff": 1}')
STRINGS_KEPT = ('"\\ud83d\\ude00"', '"caf\\u00e9"', '"<think>in an argument</think>"')
PLACES = ('{{"n": {}}}', '{{"a": [1, {}]}}', '{{"o": {{"p": {{"q": {}}}}}}}')


@dataclass
class Case:
    """One record: its JSONL line, and the turns prepare must write (None: it must be refused)."""

    name: str
    line: str
    expected: list[dict] | None


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    tallies = prepare_trials(work, cases(full))
    for form, reasoning in [("think-first", "keep"), ("think-r1", "keep"), ("think-first", "drop"),
                            ("think-r1", "drop"), ("think-in-middle", "keep"), ("think-twice", "keep"),
                            ("think-unclosed", "drop"), ("big-integer-arguments", "keep")][:None if full else 6]:
        name = f"chat forms: regenerate {form}"
        tally = next((t for t in tallies if t.scenario == name), None) or Tally(name)
        if tally not in tallies:
            tallies.append(tally)
        tally.add(*regenerate_trial(work, form, reasoning))
    return tallies


def cases(full: bool) -> list[Case]:
    found = []
    for place in PLACES if full else PLACES[:2]:
        for literal in (*INTEGERS, *FLOATS_KEPT):
            arguments = place.format(literal)
            found.append(_arguments_case(f"argument {literal[:24]} (string)", json.dumps(arguments), arguments))
            found.append(_arguments_case(f"argument {literal[:24]} (object)", arguments, arguments))
        for literal in FLOATS_REFUSED:
            found.append(_arguments_case(f"argument {literal} (string)", json.dumps(place.format(literal)), None))
        for text in STRINGS_REFUSED:
            found.append(_arguments_case(f"argument {text} (string)", json.dumps(place.format(text)), None))
            found.append(_arguments_case(f"argument {text} (object)", place.format(text), None))  # the reader refuses
        for text in STRINGS_KEPT:
            arguments = place.format(text)
            found.append(_arguments_case(f"argument {text} (string)", json.dumps(arguments), arguments))
    for literal in (*INTEGERS[:4], *FLOATS_KEPT[:2], *FLOATS_REFUSED[:3], *STRINGS_REFUSED[:2], *STRINGS_KEPT):
        found += [_text_call_case(form, literal, literal not in FLOATS_REFUSED + STRINGS_REFUSED)
                  for form in ("hermes", "function_call")]
    found += [_reasoning_case(*case) for case in REASONING_CASES]
    found += [Case(name, json.dumps(record), expected) for name, record, expected in FIELD_CASES]
    return found


def _arguments_case(name: str, arguments_text: str, expected_json: str | None) -> Case:
    line = ('{"messages": [{"role": "user", "content": "count"}, {"role": "assistant", "content": null, '
            '"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "count", "arguments": '
            + arguments_text + '}}]}, {"role": "tool", "content": "ok", "tool_call_id": "c1"}, '
            '{"role": "assistant", "content": "Done."}]}')
    expected = None
    if expected_json is not None:
        call = {"id": "c1", "type": "function", "function": {"name": "count", "arguments": json.loads(expected_json)}}
        expected = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": "ok", "tool_call_id": "c1"}, {"role": "assistant", "content": "Done."}]
    return Case(name, line, expected)


def _text_call_case(form: str, literal: str, kept: bool) -> Case:
    """A whole call written as JSON text: a Hermes <tool_call> block, or a ShareGPT function_call value."""
    call_text = '{"name": "count", "arguments": {"n": ' + literal + '}}'
    if form == "hermes":
        record = {"messages": [{"role": "user", "content": "count"},
                               {"role": "assistant", "content": f"<tool_call>{call_text}</tool_call>"}]}
    else:
        record = {"conversations": [{"from": "human", "value": "count"}, {"from": "function_call", "value": call_text}]}
    expected = None
    if kept:
        call = {"type": "function", "function": {"name": "count", "arguments": {"n": json.loads(literal)}}}
        expected = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    return Case(f"argument {literal[:24]} ({form})", json.dumps(record), expected)


# (content, reasoning field or None, expected (content, reasoning) or None when refused)
REASONING_CASES = [
    ("<think>r</think>a", None, ("a", "r")),
    ("  <think>\n r \n</think>\n\n a", None, ("a", "r")),
    ("r</think>\n\na", None, ("a", "r")),
    ("reasoning here</think>\n\nanswer", None, ("answer", "reasoning here")),
    ("<think></think>a", None, ("a", None)),
    ("<think>\n\n</think>\n\na", "r", ("a", "r")),
    ("<think>r</think>a", "r", ("a", "r")),
    ("a", "r", ("a", "r")),
    ("a", None, ("a", None)),
    ("Answer first. <think>hidden</think> then more.", None, None),
    ("<think>a</think>b<think>c</think>d", None, None),
    ("<think>so the answer is", None, None),
    ("a<think>", None, None),
    ("a</think>b<think>c", None, None),
    ("r</think>a</think>b", None, None),
    ("a", "r <think>x", None),
    ("a", "r</think>", None),
    ("<think>r</think>a", "other", None),
    ("<think>only</think>", None, None),  # nothing left to answer
]


def _reasoning_case(content: str, reasoning: str | None, expected: tuple | None) -> Case:
    turn = {"role": "assistant", "content": content, **({"reasoning_content": reasoning} if reasoning else {})}
    record = {"messages": [{"role": "user", "content": "q"}, turn]}
    want = None
    if expected is not None:
        answer = {"role": "assistant", "content": expected[0], **({"reasoning_content": expected[1]}
                                                                    if expected[1] else {})}
        want = [{"role": "user", "content": "q"}, answer]
    return Case(f"reasoning {content[:30]!r} field {reasoning!r}", json.dumps(record), want)


_CALL = {"type": "function", "function": {"name": "f", "arguments": {}}}
_Q, _A = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
FIELD_CASES = [
    ("tool_calls on a user turn", {"messages": [{**_Q, "tool_calls": [_CALL]}, _A]}, None),
    ("tool_calls on a system turn", {"messages": [{"role": "system", "content": "s", "tool_calls": [_CALL]}, _Q, _A]},
     None),
    ("reasoning_content on a user turn", {"messages": [{**_Q, "reasoning_content": "r"}, _A]}, None),
    ("thinking on a user turn", {"messages": [{**_Q, "thinking": "r"}, _A]}, None),
    ("weight on a user turn", {"messages": [{**_Q, "weight": 0}, _A]}, None),
    ("tool_call_id on a user turn", {"messages": [{**_Q, "tool_call_id": "c1"}, _A]}, None),
    ("tool_calls on a tool turn", {"messages": [_Q, {"role": "assistant", "content": "", "tool_calls": [
        {**_CALL, "id": "c1"}]}, {"role": "tool", "content": "r", "tool_calls": [_CALL]}, _A]}, None),
    ("weight 2", {"messages": [_Q, {**_A, "weight": 2}]}, None),
    ("weight 0.5", {"messages": [_Q, {**_A, "weight": 0.5}]}, None),
    ("weight true", {"messages": [_Q, {**_A, "weight": True}]}, None),
    ("weight '1'", {"messages": [_Q, {**_A, "weight": "1"}]}, None),
    ("weight 0", {"messages": [_Q, {**_A, "weight": 0}]}, [_Q, {**_A, "weight": 0}]),
    ("weight 1", {"messages": [_Q, {**_A, "weight": 1}]}, [_Q, {**_A, "weight": 1}]),
    ("empty tool_calls and null reasoning on a user turn",
     {"messages": [{**_Q, "tool_calls": [], "reasoning_content": None}, _A]}, [_Q, _A]),
    ("tool_calls without a content key", {"messages": [_Q, {"role": "assistant", "tool_calls": [_CALL]},
                                                       {"role": "tool", "content": "r"}, _A]},
     [_Q, {"role": "assistant", "content": "", "tool_calls": [_CALL]}, {"role": "tool", "content": "r"}, _A]),
]


def prepare_trials(work: Path, found: list[Case]) -> list[Tally]:
    source, out = work / "forms-in.jsonl", work / "forms-out"
    source.write_text("".join(f'{{"id": "case-{k}", {case.line[1:]}\n' for k, case in enumerate(found)))
    code, stderr = run(cli("chat", "prepare", "-i", source, "--train-output", out / "train", "--eval-output",
                           out / "eval", "--test-size", "0", "--on-error", "skip", "-q"), timeout=TRIAL_LIMIT_S)
    tallies = {name: Tally(f"chat forms: prepare {name}") for name in ("tool arguments", "reasoning", "fields")}
    if code != 0:
        outcome = "hang" if code is None else "crash" if code < 0 or "Traceback" in stderr else "clear_error"
        for tally in tallies.values():
            tally.add(outcome, stderr[-600:])
        return list(tallies.values())
    from fuelline.io import read_records

    kept = {r["id"]: r for r in read_records(out / "train")}
    refused = {r["record"]["id"] if isinstance(r["record"], dict) else _line_id(r): r
               for r in read_records(sorted((out / "train" / "_rejects").glob("*.jsonl.zst")))} \
        if (out / "train" / "_rejects").exists() else {}
    for k, case in enumerate(found):
        family = "tool arguments" if case.name.startswith("argument") else \
            "reasoning" if case.name.startswith("reasoning") else "fields"
        tallies[family].add(*judge_prepared(case, kept.get(f"case-{k}"), refused.get(f"case-{k}")))
    return list(tallies.values())


def _line_id(reject: dict) -> str | None:
    match = re.search(r'"id": "([^"]+)"', reject["record"]) if isinstance(reject["record"], str) else None
    return match.group(1) if match else None


def judge_prepared(case: Case, record: dict | None, reject: dict | None) -> tuple[str, str]:
    from fuelline.chat.templates import render

    if record is None and reject is None:
        return "silent_wrong", f"{case.name}: in neither the output nor the rejects"
    if record is None:
        if not (reject.get("reason") and reject.get("detail")):
            return "silent_wrong", f"{case.name}: refused without a reason"
        if case.expected is not None:
            return "silent_wrong", f"{case.name}: a valid form refused ({reject['reason']}: {reject['detail']})"
        return "clear_error", ""
    turns = record["conversations"]
    if case.expected is None:
        return "silent_wrong", f"{case.name}: kept as {turns}, expected refused"
    if json.dumps(turns) != json.dumps(case.expected):  # json.dumps: 1 and 1.0 differ
        return "silent_wrong", f"{case.name}: kept as {turns}, expected {case.expected}"
    if any("think>" in turn["content"] for turn in turns):
        return "silent_wrong", f"{case.name}: a think tag left in a content"
    text = render(record, "qwen3").text
    for call in (c for turn in turns for c in turn.get("tool_calls", [])):
        for number in _integers(call["function"]["arguments"]):
            if str(number) not in text:
                return "silent_wrong", f"{case.name}: {number} not in the rendered text"
    return "ok", ""


def _integers(value) -> list[int]:
    if isinstance(value, dict):
        return [n for inner in value.values() for n in _integers(inner)]
    if isinstance(value, list):
        return [n for inner in value for n in _integers(inner)]
    return [value] if type(value) is int else []


def regenerate_trial(work: Path, form: str, reasoning: str) -> tuple[str, str]:
    from fuelline.io import read_records
    from fuelline.serve.echo import INLINE_REASONING, echo_answer

    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    records = [{"id": f"r{i}", **({"tools": tools} if form == "big-integer-arguments" else {}), "conversations": [
        {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "old", "weight": i % 2}]}
        for i in range(3)]
    source = work / f"forms-regen-{form}-{reasoning}.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    out = source.with_name(source.stem + "-out.jsonl")
    with echo_servers([("--fault", form)]) as urls:
        code, stderr = run(cli("chat", "regenerate", "-i", source, "-o", out, "--model", "echo", "--server", urls[0],
                               "--regenerate-turns", "all", "--store-reasoning", reasoning, *CLIENT),
                           timeout=TRIAL_LIMIT_S)
    if code is None:
        return "hang", stderr
    if code < 0 or "Traceback" in stderr:
        return "crash", stderr[-600:]
    written = out.read_bytes() if out.exists() else b""
    if code == 2 and "kept none of its" in stderr and not written:
        pass  # every answer refused: the run says so (exit 2), and the errors file below must say why
    elif code != 0:
        return "crash", f"{form}: exit {code}: {stderr[-600:]}"  # every answer is a record's fate, not the run's
    if b"think>" in written:
        return "silent_wrong", f"{form}: a think tag written: {written[:300]!r}"
    errors_file = out.with_name(out.name + ".errors")
    errors = [orjson.loads(line) for line in errors_file.read_bytes().splitlines()] if errors_file.exists() else []
    if not written:
        reasons = {e.get("reason") for e in errors}
        if len(errors) == len(records) and None not in reasons and not reasons & {"empty_answer", "bad_answer"}:
            return "clear_error", ""
        return "silent_wrong", f"{form}: nothing written, errors {errors[:2]}"
    got = {r["id"]: r["conversations"][1] for r in read_records(out)}
    for record in records:
        turn, history = got.get(record["id"]), record["conversations"][:1]
        if turn is None:
            return "silent_wrong", f"{form}: {record['id']} missing"
        if turn.get("weight") != record["conversations"][1]["weight"]:
            return "silent_wrong", f"{form}: weight lost: {turn}"
        if form == "big-integer-arguments":
            if turn["tool_calls"][0]["function"]["arguments"] != {"n": 123456789012345678901234567890,
                                                                  "m": -9223372036854775809}:
                return "silent_wrong", f"{form}: arguments {turn['tool_calls']}"
        elif turn["content"] != echo_answer(history) or turn.get("reasoning_content") != (
                INLINE_REASONING if reasoning == "keep" else None):
            return "silent_wrong", f"{form} --store-reasoning {reasoning}: {turn}"
    return "ok", ""


