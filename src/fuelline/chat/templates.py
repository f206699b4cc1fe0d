"""Chat templates: a conversation rendered to text once, with the character spans to train on.

A template is the handful of strings a chat format is made of: role headers, the end-of-turn
string and what follows it, an optional text at the very start, an optional prefix after the
assistant header. `render` appends a conversation's pieces one after the other and records,
while appending, where each assistant content and its end-of-turn string start and end. The
loss mask is derived from these spans and the token offsets of one encoding of the text
(`fuelline.chat.encode`), never from re-tokenized prefixes or a search in the rendered text.
Worked example, `chatml`, one exchange ("Hi", "Hello!"):

    <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n
    supervised span [52, 68) = "Hello!<|im_end|>"; turns end at 30 and 69

Built-in templates, thinking models in their non-thinking mode:

- `chatml` (alias `qwen`): `<|im_start|>ROLE\\n…<|im_end|>\\n`.
- `qwen3`: ChatML, and the last message, when it is an assistant turn, opens with the empty
  block `<think>\\n\\n</think>\\n\\n`, as Qwen3's Jinja template renders it (its
  `enable_thinking=False` only changes the generation prompt, which gets the same block;
  earlier assistant turns are plain ChatML there too). The block is never supervised.
  Tools, tool calls, tool results and reasoning as Qwen3's published template writes them:
  the schemas (`tojson`, one a line) in `<tools></tools>` at the end of the system turn; each
  call `<tool_call>\\n{"name": N, "arguments": JSON}\\n</tool_call>` after the content, a
  newline before each but a first one with empty content; consecutive tool results in one user
  turn, each `\\n<tool_response>\\n…\\n</tool_response>`; a non-empty reasoning as
  `<think>\\n` + reasoning stripped of newlines + `\\n</think>\\n\\n` in place of the empty
  block. Supervised: the reasoning block (unless empty), content, calls and `<|im_end|>`.
- `qwen-deepspec`: DeepSpec's `qwen` preprocessing: ChatML led by the system turn "You are a
  helpful assistant." unless there is one; a span runs from the content to the `\\n` after
  `<|im_end|>`, and trains the tokens len(encode(text[:start])) to len(encode(text[:end])), so
  a token merging the header's `\\n` with a content's leading newline is not trained on.
- `llama3`: `<|begin_of_text|>` once, `<|start_header_id|>ROLE<|end_header_id|>\\n\\n…<|eot_id|>`.
- `gemma4`: `<bos>` once, `<|turn>ROLE\\n…<turn|>\\n` with the roles system, user and model;
  the last assistant turn and the generation prompt open with the non-thinking prefix
  `<|channel>thought\\n<channel|>`, as Gemma 4's template prefills it; never supervised.
- `auto`: the tokenizer's own Jinja chat template (see `fuelline.chat.encode`).

Reasoning (`reasoning_content`) is kept on every assistant turn (`keep`), removed before
rendering (`drop`: the non-thinking rendering), or kept only on the assistant turns after the
last user turn (`last`, the default: Qwen3's own rule for history, which keeps the reasoning
of the tool-calling steps of the final round too); templates without a reasoning syntax refuse
a turn with one unless it is dropped, and so do those without a tool syntax (all but `qwen3`)
tools, tool calls and tool turns. `train_turns="last"` supervises only the last span. An
assistant turn with `"weight": 0` (OpenAI fine-tuning's per-message weight, 0 or 1) is rendered
but never supervised, under every template; with `train_turns="last"` a weight-0 last turn
leaves nothing supervised. A Jinja template whose `{% generation %}` blocks are not one per
assistant turn cannot say which block is the weight-0 turn's, and such a conversation is refused.

Contents are rendered verbatim. Qwen3's Jinja template also rewrites some contents (it strips
leading newlines from the final answer and splits a content at `</think>`), so it matches
`qwen3` for contents without either; the chat data in ../shared/data has neither, and under
that Jinja template a conversation with either is refused (see below).

Jinja templates (`auto`, or a template with a `jinja` source) are rendered in jinja2's
immutable sandbox, set up as transformers sets it up (trim_blocks, lstrip_blocks, loop
controls, `tojson` without HTML escaping, `raise_exception`, `strftime_now`), so the text is
`apply_chat_template`'s. The spans are the template's `{% generation %}` blocks when it has
them: each block wraps its output in two Unicode noncharacters, U+FDD0 and U+FDD1, which are
removed after rendering. Otherwise the conversation is rendered a second time with each
assistant content between two marks that name its turn (noncharacters too; a content holding
any of U+FDD0-U+FDEF is refused), and a content's span is where its marks are, extended over
an end-of-turn token that immediately follows it (the template's `end_of_turn`, else the
tokenizer's eos token or one of END_OF_TURN_TOKENS). Never a text search: "a" is also in the
next "assistant" header. The marks locate a content exactly only when the marked text, marks
removed, is the plain text, and each content is between its own two marks once, verbatim, in
order; otherwise the conversation is refused, naming the turn, since its span would be a
guess. This refuses a content that a template changes by stripping, splitting or slicing it
(Qwen3's strips leading newlines from the final answer and splits a content at `</think>`),
renders twice, leaves out or puts out of order. The second rendering costs about as much as the first (GSM8K, Qwen3's template:
~100 µs more per conversation, on top of ~100 µs). Tool calls and reasoning are rendered
outside the content, where no mark can locate their text, so without generation blocks an
assistant turn with either is refused, naming template and turn (tool results and schemas
are never supervised, so they pass). Templates get `tools=` and the turns as transformers
gives them: `tool_calls` with `function.arguments` a dict, `tool` turns, `reasoning_content`
(also as `thinking`); with generation blocks, ids and mask equal `apply_chat_template(messages,
tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tomllib
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Callable, Mapping

from fuelline.formats import chat_record
from fuelline.formats.chat_record import ChatRecordError

PREFIX_TURNS = ("all", "last")
REASONING = ("keep", "drop", "last")
TRAIN_TURNS = ("all", "last")
SPECIAL_TEXT = ("refuse", "keep")
ON_ERROR = ("raise", "skip")
TOOL_SYNTAXES = ("", "qwen")
LOSS_MASKS = ("overlap", "deepspec")
# Tried, after the tokenizer's eos token, as the end-of-turn token of a Jinja template.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<turn|>", "<end_of_turn>", "<|end|>")
# Unicode noncharacters, reserved for a program's internal use: the marks of generation blocks,
# and those of assistant contents, each followed by the turn's number in 16 digits of their own.
_OPEN, _CLOSE = "\ufdd0", "\ufdd1"
_MARKS = re.compile(f"[{_OPEN}{_CLOSE}]")
_CONTENT_OPEN, _CONTENT_CLOSE = "\ufdd2", "\ufdd3"
_DIGITS = "".join(map(chr, range(0xFDD4, 0xFDE4)))
_CONTENT_MARK = re.compile(f"([{_CONTENT_OPEN}{_CONTENT_CLOSE}])([{_DIGITS}]+)")
_RESERVED = re.compile("[\ufdd0-\ufdef]")
_GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")


@dataclass(frozen=True)
class ChatTemplate:
    """What a chat format is made of; `render` puts a conversation together from it.

    A turn is `HEADER + content + end_of_turn + after_turn`; `content + end_of_turn` of an
    assistant turn is supervised. `assistant_prefix` follows the assistant header on every
    assistant turn (`assistant_prefix_on="all"`) or only when the turn is the conversation's
    last message (`"last"`), and always in the generation prompt; it is never supervised.
    `default_system` is rendered as a system turn when the conversation does not start with
    one (None: no system turn). An assistant turn's reasoning is rendered as `reasoning_open +
    reasoning + reasoning_close` in place of the prefix (empty strings: the format has none, and
    a turn with reasoning is refused unless it is dropped). `tool_syntax` names how tools, tool
    calls and tool results are written ("qwen"; empty: refused). `loss_mask` is "overlap" (a
    token is trained on iff it overlaps a span) or "deepspec" (spans also cover `after_turn`, and
    a span [s, e) trains tokens len(encode(text[:s])) to len(encode(text[:e])), DeepSpec's rule).
    `jinja` replaces all of this with a Jinja chat template; the empty string stands for the
    tokenizer's own one (`auto`).
    """

    name: str
    system_header: str = ""
    user_header: str = ""
    assistant_header: str = ""
    end_of_turn: str = ""
    after_turn: str = ""
    bos: str = ""
    default_system: str | None = None
    assistant_prefix: str = ""
    assistant_prefix_on: str = "all"
    jinja: str | None = None
    reasoning_open: str = ""
    reasoning_close: str = ""
    tool_syntax: str = ""
    loss_mask: str = "overlap"

    def __post_init__(self):
        for key, allowed in (("assistant_prefix_on", PREFIX_TURNS), ("tool_syntax", TOOL_SYNTAXES),
                             ("loss_mask", LOSS_MASKS)):
            if getattr(self, key) not in allowed:
                raise ValueError(f"chat template {self.name!r}: {key} must be one of "
                                 f"{', '.join(map(repr, allowed)) if '' in allowed else ', '.join(allowed)}, "
                                 f"not {getattr(self, key)!r}")

    @property
    def generation_prompt(self) -> str:
        return self.assistant_header + self.assistant_prefix


@dataclass(frozen=True)
class Rendering:
    """A rendered conversation: the text, the character spans to supervise, where turns end.

    `turn_ends[i]` is where turn i's text ends, so `text[:turn_ends[i]]` is the rendering of
    the first i+1 turns for a template that only appends. For a Jinja template it is where the
    span of the last assistant turn up to turn i ends (0 before the first; with generation
    blocks, the end of the k-th block for the k-th assistant turn when there is one block per
    assistant turn, else 0): an estimate used to pick a cut, which is then rendered and checked.
    """

    text: str
    spans: tuple[tuple[int, int], ...]
    turn_ends: tuple[int, ...]


def _chatml(name: str, prefix: str = "", prefix_on: str = "all", **fields) -> ChatTemplate:
    return ChatTemplate(name, system_header="<|im_start|>system\n", user_header="<|im_start|>user\n",
                        assistant_header="<|im_start|>assistant\n", end_of_turn="<|im_end|>", after_turn="\n",
                        assistant_prefix=prefix, assistant_prefix_on=prefix_on, **fields)


def _llama3_header(role: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n"


BUILTIN = (
    (_chatml("chatml"), ("qwen",)),
    (_chatml("qwen3", "<think>\n\n</think>\n\n", "last", reasoning_open="<think>\n",
             reasoning_close="\n</think>\n\n", tool_syntax="qwen"), ()),
    (_chatml("qwen-deepspec", default_system="You are a helpful assistant.", loss_mask="deepspec"), ()),
    (ChatTemplate("llama3", bos="<|begin_of_text|>", system_header=_llama3_header("system"),
                  user_header=_llama3_header("user"), assistant_header=_llama3_header("assistant"),
                  end_of_turn="<|eot_id|>"), ()),
    (ChatTemplate("gemma4", bos="<bos>", system_header="<|turn>system\n", user_header="<|turn>user\n",
                  assistant_header="<|turn>model\n", end_of_turn="<turn|>", after_turn="\n",
                  assistant_prefix="<|channel>thought\n<channel|>", assistant_prefix_on="last"), ()),
    (ChatTemplate("auto", jinja=""), ()),
)
_REGISTRY: dict[str, ChatTemplate] = {name: template for template, aliases in BUILTIN
                                      for name in (template.name, *aliases)}


def get_template(name: str) -> ChatTemplate:
    """A registered template, or one of a TOML file: `FILE.toml` (its only template) or `FILE.toml:NAME`."""
    path, _, table = name.partition(".toml")
    if _ == ".toml" and (not table or table.startswith(":")):
        loaded = {t.name: t for t in load_templates(path + ".toml")}
        if table:
            name = table[1:]
        elif len(loaded) == 1:
            name = next(iter(loaded))
        else:
            raise ValueError(f"{path}.toml holds {len(loaded)} templates ({', '.join(loaded)}); "
                             f"name one as {path}.toml:NAME")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown chat template {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def register_template(template: ChatTemplate, *aliases: str) -> None:
    """Make `template` known under its name and `aliases`; a name taken by another template is refused."""
    names = (template.name, *aliases)
    for name in names:
        known = _REGISTRY.get(name)
        if known is not None and known != template:
            raise ValueError(f"a different chat template is already registered as {name!r}")
    for name in names:
        _REGISTRY[name] = template


_FIELDS = {f.name: f for f in dataclasses.fields(ChatTemplate) if f.name != "name"}


def load_templates(path: str | os.PathLike) -> list[ChatTemplate]:
    """Read and register the templates of a TOML file: one table per template, named by it.

    Keys are `ChatTemplate`'s fields, every value a string (leave `default_system` out for no
    system turn), e.g. `[mine]` / `user_header = "### User:\\n"` / `assistant_header = ...`.
    """
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e})") from None
    templates = [_template_from_table(path, name, table) for name, table in data.items()]
    for template in templates:
        register_template(template)
    return templates


def _template_from_table(path, name: str, table: Any) -> ChatTemplate:
    where = f"{path}: [{name}]"
    if not isinstance(table, dict):
        raise ValueError(f"{path}: {name!r} must be a table of template fields, found {type(table).__name__}")
    for key, value in table.items():
        if key not in _FIELDS:
            raise ValueError(f"{where}: unknown key {key!r}; expected some of {', '.join(_FIELDS)}")
        if not isinstance(value, str):
            raise ValueError(f"{where}: {key} must be a string, found {type(value).__name__} {value!r}")
    try:
        return ChatTemplate(name, **table)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def conversation_turns(conversation: Any) -> list[dict]:
    """The turns of a conversation (or of a chat record's `conversations`), their shape checked by the
    record contract (`fuelline.formats.chat_record`; a `ChatRecordError` names the turn and the rule)."""
    if isinstance(conversation, dict):
        if not isinstance(conversation.get("conversations"), list):
            raise ChatRecordError("not_a_chat_record", "a chat record needs a 'conversations' list of "
                                                       "{'role', 'content'} turns")
        conversation = conversation["conversations"]
    chat_record.require_turns(conversation)
    return list(conversation)


def conversation_tools(conversation: Any, tools: Any = None) -> list[dict] | None:
    """The tool schemas of a conversation, checked: a chat record's `tools`, or `tools` given for it."""
    own = conversation.get("tools") if isinstance(conversation, dict) else None
    if own is not None and tools is not None:
        raise ChatRecordError("bad_tools", "tools are given twice: the chat record has its own 'tools', and tools= "
                                           "is set too")
    tools = own if own is not None else tools
    chat_record.require_tools(tools)
    return tools


def render(conversation: Any, template: str | ChatTemplate, add_generation_prompt: bool = False, *,
           variables: Mapping[str, Any] | None = None, tools: list[dict] | None = None, reasoning: str = "last",
           train_turns: str = "all") -> Rendering:
    """Render a conversation; `variables` (bos_token, eos_token, …) are given to a Jinja template.

    `tools` are the conversation's tool schemas when it is not a chat record carrying its own.
    `reasoning`: keep every assistant turn's `reasoning_content`, drop it, or keep it only after
    the last user turn (`last`, Qwen3's rule for history). `train_turns`: supervise every
    assistant turn, or only the last one (its span, or the template's last generation block).
    """
    return render_checked(conversation_turns(conversation), conversation_tools(conversation, tools), template,
                          add_generation_prompt, variables=variables, reasoning=reasoning, train_turns=train_turns)


def render_checked(turns: list[dict], tools: list[dict] | None, template: str | ChatTemplate,
                   add_generation_prompt: bool = False, *, variables: Mapping[str, Any] | None = None,
                   reasoning: str = "last", train_turns: str = "all") -> Rendering:
    """`render` of turns and tools that `conversation_turns` and `conversation_tools` have checked
    (`encode_chats` checks each conversation once, before it renders it, maybe several times)."""
    if reasoning not in REASONING or train_turns not in TRAIN_TURNS:
        key, value, allowed = (("reasoning", reasoning, REASONING) if reasoning not in REASONING else
                               ("train_turns", train_turns, TRAIN_TURNS))
        raise ValueError(f"{key} must be one of {', '.join(allowed)}, not {value!r}")
    if reasoning != "keep" and any(len(turn) > 2 and "reasoning_content" in turn for turn in turns):
        turns = _reasoning_kept(turns, reasoning)
    if isinstance(template, str):
        template = get_template(template)
    if template.jinja is None:
        rendering = _render_fields(turns, tools, template, add_generation_prompt)
    elif not template.jinja:
        raise ValueError(f"chat template {template.name!r} renders with a tokenizer's own Jinja template; "
                         f"encode_chat finds it, or pass the Jinja source as ChatTemplate(jinja=...)")
    else:
        rendering = _render_jinja(turns, tools, template, add_generation_prompt, variables or {})
    spans = _supervised_spans(rendering.spans, turns, template, train_turns)
    return rendering if spans == rendering.spans else dataclasses.replace(rendering, spans=spans)


def _supervised_spans(spans: tuple[tuple[int, int], ...], turns: list[dict], t: ChatTemplate,
                      train_turns: str) -> tuple[tuple[int, int], ...]:
    """The spans left by `train_turns` and the turns' weights (a weight-0 assistant turn's span goes)."""
    weights = [turn.get("weight", 1) for turn in turns if turn["role"] == "assistant"]
    if 0 not in weights:
        return spans[-1:] if train_turns == "last" else spans
    if len(spans) != len(weights):
        raise ValueError(f"turn {next(i for i, turn in enumerate(turns) if turn.get('weight') == 0)}: weight 0, but "
                         f"the Jinja chat template of {t.name!r} has {len(spans)} {{% generation %}} block(s) for "
                         f"{len(weights)} assistant turn(s), so which tokens are this turn's is unknown")
    if train_turns == "last":
        spans, weights = spans[-1:], weights[-1:]
    return tuple(span for span, weight in zip(spans, weights) if weight)


def _reasoning_kept(turns: list[dict], reasoning: str) -> list[dict]:
    """The turns without the `reasoning_content` that `reasoning` (drop or last) leaves out."""
    last_user = max((i for i, turn in enumerate(turns) if turn["role"] == "user"), default=-1)
    return [{k: v for k, v in turn.items() if k != "reasoning_content"}
            if "reasoning_content" in turn and (reasoning == "drop" or i < last_user) else turn
            for i, turn in enumerate(turns)]


def _render_fields(turns: list[dict], tools: list[dict] | None, t: ChatTemplate,
                   add_generation_prompt: bool) -> Rendering:
    headers = {"system": t.system_header, "user": t.user_header, "assistant": t.assistant_header}
    parts, skip = [t.bos], 0
    system = turns[0]["content"] if turns[0]["role"] == "system" else t.default_system
    if tools:  # Qwen's way: the tool schemas join the system turn's content
        _need_tool_syntax(t, "the conversation has tools")
        parts.append(t.system_header + ("" if system is None else system + "\n\n") + _qwen_tools(tools)
                     + t.end_of_turn + t.after_turn)
        skip = turns[0]["role"] == "system"
    elif t.default_system is not None and turns[0]["role"] != "system":
        parts.append(t.system_header + t.default_system + t.end_of_turn + t.after_turn)
    pos = sum(map(len, parts))
    spans, ends, last = [], [], len(turns) - 1
    after = t.after_turn if t.loss_mask == "overlap" else ""  # deepspec's spans run over it
    for i, turn in enumerate(turns):
        role = turn["role"]
        if i < skip:
            head = body = tail = ""
        elif role == "assistant":
            head, body = _assistant(i, turn, t, i == last)
            tail = t.after_turn
            spans.append((pos + len(head), pos + len(head) + len(body) + len(t.after_turn) - len(after)))
        elif role == "tool":
            _need_tool_syntax(t, f"turn {i} is a tool turn")
            head = ("" if i and turns[i - 1]["role"] == "tool" else "<|im_start|>user") + "\n<tool_response>\n"
            body = turn["content"]
            tail = "\n</tool_response>" + ("" if i < last and turns[i + 1]["role"] == "tool" else
                                             t.end_of_turn + t.after_turn)
        else:
            head, body, tail = headers[role], turn["content"] + t.end_of_turn, t.after_turn
        parts += (head, body, tail)
        pos += len(head) + len(body) + len(tail)
        ends.append(pos)
    if add_generation_prompt:
        parts.append(t.generation_prompt)
    return Rendering("".join(parts), tuple(spans), tuple(ends))


def _assistant(i: int, turn: dict, t: ChatTemplate, is_last: bool) -> tuple[str, str]:
    """An assistant turn's unsupervised head and supervised body (reasoning, content, tool calls, end of turn).

    A non-empty reasoning is rendered stripped of newlines at both ends, as Qwen3's template does;
    it is supervised unless nothing is left. Without one, the prefix is rendered, unsupervised.
    """
    head, body = t.assistant_header, turn["content"]
    reasoning = turn.get("reasoning_content")
    if reasoning:
        if not (t.reasoning_open or t.reasoning_close):
            raise ValueError(f"turn {i}: chat template {t.name!r} has no syntax for reasoning_content; "
                             f"use reasoning='drop', or a template that has one (qwen3)")
        thought = t.reasoning_open + reasoning.strip("\n") + t.reasoning_close
        head, body = (head, thought + body) if reasoning.strip("\n") else (head + thought, body)
    elif t.assistant_prefix_on == "all" or is_last:
        head += t.assistant_prefix
    calls = turn.get("tool_calls")
    if calls:
        _need_tool_syntax(t, f"turn {i} has tool_calls")
        body += "".join(("\n" if j or turn["content"] else "") + '<tool_call>\n{"name": "' + call["function"]["name"]
                        + '", "arguments": ' + _tojson(call["function"]["arguments"]) + "}\n</tool_call>"
                        for j, call in enumerate(calls))
    return head, body + t.end_of_turn


_QWEN_TOOLS = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
               "with function signatures within <tools></tools> XML tags:\n<tools>",
               "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>")


def _qwen_tools(tools: list[dict]) -> str:
    return _QWEN_TOOLS[0] + "".join("\n" + _tojson(tool) for tool in tools) + _QWEN_TOOLS[1]


def _need_tool_syntax(t: ChatTemplate, what: str) -> None:
    if not t.tool_syntax:
        raise ValueError(f"{what}, but chat template {t.name!r} has no syntax for tools; use one that has "
                         f"({', '.join(n for n, k in sorted(_REGISTRY.items()) if k.tool_syntax)}) or the "
                         f"tokenizer's own (auto)")


def _tojson(value: Any) -> str:
    """JSON as the `tojson` filter of transformers' chat templates writes it (", " and ": ", not ASCII-escaped)."""
    return json.dumps(value, ensure_ascii=False)


def _render_jinja(turns: list[dict], tools: list[dict] | None, t: ChatTemplate, add_generation_prompt: bool,
                  variables: Mapping[str, Any]) -> Rendering:
    fields = [(f"turn {i}: {key}", value) for i, turn in enumerate(turns)
              for key, value in (turn.items() if len(turn) > 2 else [("content", turn["content"])])]
    for where, value in [*fields, ("tools", tools or "")]:
        if (reserved := _RESERVED.search(value if isinstance(value, str) else _tojson(value))) is not None:
            raise ValueError(f"{where} holds U+{ord(reserved.group()):04X}, one of the Unicode noncharacters "
                             f"U+FDD0-U+FDEF that mark spans while a Jinja template renders")
    assistant = [i for i, turn in enumerate(turns) if turn["role"] == "assistant"]
    messages = _template_messages(turns)
    text, blocks = _remove_generation_marks(_run_jinja(t, messages, tools, add_generation_prompt, variables))
    if _has_generation_blocks(t.jinja):
        # one block per assistant turn: a turn ends with its block; else 0, a lower bound for every turn
        ends = [end for _, end in blocks] if len(blocks) == len(assistant) else [0] * len(assistant)
        return Rendering(text, tuple(blocks), _turn_ends(turns, ends))
    for i in assistant:
        for key, what in (("tool_calls", "tool calls"), ("reasoning_content", "reasoning")):
            if turns[i].get(key):
                raise ValueError(f"turn {i}: the Jinja chat template of {t.name!r} has no {{% generation %}} blocks, "
                                 f"and this turn's {what} would be rendered outside its content, where no mark can "
                                 f"locate it; put {{% generation %}}…{{% endgeneration %}} around what the template "
                                 f"renders of an assistant turn, or use a named template (qwen3)"
                                 + (", or reasoning='drop'" if key == "reasoning_content" else ""))
    eot = (t.end_of_turn,) if t.end_of_turn else (variables.get("eos_token") or "", *END_OF_TURN_TOKENS)
    spans = []
    for start, end in _content_spans(turns, assistant, t, text,
                                     lambda marked: _run_jinja(t, _template_messages(marked), tools,
                                                               add_generation_prompt, variables)):
        spans.append((start, end + len(next((e for e in eot if e and text.startswith(e, end)), ""))))
    return Rendering(text, tuple(spans), _turn_ends(turns, [end for _, end in spans]))


def _template_messages(turns: list[dict]) -> list[dict]:
    """The messages as transformers gives them to a template: reasoning also under `thinking` (gpt-oss reads
    that); `weight` is ours to apply (to the mask), so no template sees it."""
    messages = [{k: v for k, v in turn.items() if k != "weight"} if "weight" in turn else turn for turn in turns]
    return [{"thinking": turn["reasoning_content"], **turn} if "reasoning_content" in turn else turn
            for turn in messages]


def _run_jinja(t: ChatTemplate, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
               variables: Mapping[str, Any]) -> str:
    compiled = _compile_jinja(t.jinja)
    import jinja2  # installed: _compile_jinja has imported it

    try:
        return compiled.render(messages=messages, tools=tools, documents=None,
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as e:
        raise ValueError(f"the Jinja chat template of {t.name!r} failed: {e}") from None


def _turn_ends(turns: list[dict], assistant_ends: list[int]) -> tuple[int, ...]:
    """Each turn's end: its assistant span's end, or that of the last assistant turn before it (0 if none)."""
    ends, found, end = [], iter(assistant_ends), 0
    for turn in turns:
        if turn["role"] == "assistant":
            end = next(found)
        ends.append(end)
    return tuple(ends)


def _content_spans(turns: list[dict], assistant: list[int], t: ChatTemplate, text: str,
                   render_marked: Callable[[list[dict]], str]) -> list[tuple[int, int]]:
    """Where each assistant content is in `text`: its marks in a rendering with the contents marked.

    One extra rendering marks all contents at once. Only when their marks do not give the
    spans, and do not tell which turn is at fault, is each content marked alone in turn, to
    name the first one that cannot be located.
    """
    if not assistant:
        return []
    found = _spans_from_marks(render_marked(_marked(turns, assistant)), text, turns, assistant)
    if isinstance(found, list):
        return found
    turn, problem = found
    if turn is None:
        alone = (_spans_from_marks(render_marked(_marked(turns, [i])), text, turns, [i]) for i in assistant)
        turn = next((i for i, spans in zip(assistant, alone) if not isinstance(spans, list)), assistant[0])
    raise ValueError(f"turn {turn}: the Jinja chat template of {t.name!r} {problem}, so its loss span is "
                     f"unknown; use a named template ({', '.join(n for n in sorted(_REGISTRY) if n != 'auto')}) "
                     f"or put {{% generation %}}…{{% endgeneration %}} around the assistant content in the template")


def _marked(turns: list[dict], which: list[int]) -> list[dict]:
    """The turns with the contents of turns `which` between an opening and a closing mark naming the turn."""
    return [{**turn, "content": f"{_CONTENT_OPEN}{_digits(i)}{turn['content']}{_CONTENT_CLOSE}{_digits(i)}"}
            if i in which else turn for i, turn in enumerate(turns)]


def _digits(number: int) -> str:
    return "".join(_DIGITS[int(d, 16)] for d in f"{number:x}")


def _spans_from_marks(raw: str, text: str, turns: list[dict],
                      which: list[int]) -> list[tuple[int, int]] | tuple[int | None, str]:
    """The spans in `text` of the contents marked in `raw`, or (the turn, if known; what is wrong)."""
    if _CONTENT_MARK.sub("", raw) != text:
        return None, "transforms this assistant content (it strips, splits, slices or tests it)"
    marks: dict[int, dict[str, list[int]]] = {i: {_CONTENT_OPEN: [], _CONTENT_CLOSE: []} for i in which}
    removed = 0
    for mark in _CONTENT_MARK.finditer(raw):
        turn = int("".join(f"{_DIGITS.index(d):x}" for d in mark.group(2)), 16)
        if turn in marks:  # a number no content was given (the template cut its digits): that content lacks it
            marks[turn][mark.group(1)].append(mark.start() - removed)
        removed += len(mark.group())
    spans = []
    for i in which:
        opens, closes = marks[i][_CONTENT_OPEN], marks[i][_CONTENT_CLOSE]
        if not opens and not closes:
            return i, "does not render this assistant content"
        if len(opens) == len(closes) > 1:
            return i, f"renders this assistant content {len(opens)} times"
        if len(opens) != 1 or len(closes) != 1 or text[opens[0]:closes[0]] != turns[i]["content"]:
            return i, "does not render this assistant content verbatim"
        spans.append((opens[0], closes[0]))
    for i, before, after in zip(which[1:], spans, spans[1:]):
        if after[0] < before[1]:
            return i, "renders the assistant contents out of their order"
    return spans


def _remove_generation_marks(raw: str) -> tuple[str, list[tuple[int, int]]]:
    """The text without the marks of `{% generation %}` blocks, and the blocks' spans in it."""
    spans, start = [], None
    for k, mark in enumerate(_MARKS.finditer(raw)):
        at = mark.start() - k  # k marks before this one are removed
        if (mark.group() == _OPEN) != (start is None):
            raise ValueError("{% generation %} blocks in a chat template must not be nested")
        if start is None:
            start = at
        else:
            spans.append((start, at))
            start = None
    return _MARKS.sub("", raw), spans


@lru_cache(maxsize=16)
def _has_generation_blocks(source: str) -> bool:
    return _GENERATION_TAG.search(source) is not None


@lru_cache(maxsize=16)
def _compile_jinja(source: str):
    try:
        import jinja2
        from jinja2.ext import Extension
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ImportError("Jinja chat templates need jinja2 (pip install 'jinja2>=3.1.6')") from None

    class Generation(Extension):
        """`{% generation %}…{% endgeneration %}`: the block's output, between the two marks."""

        tags = {"generation"}

        def parse(self, parser):
            line = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(line)

        def _mark(self, caller) -> str:
            return _OPEN + caller() + _CLOSE

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat template is not valid Jinja: line {e.lineno}: {e.message}") from None
