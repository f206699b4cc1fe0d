"""Chat templates by name (built in, registered from Python or read from a TOML file), so the
renderers (`field_templates`, `jinja_templates`) and `templates.render` share one list.

The built-in templates (`BUILTIN`; docs/chat.md tables their renderings and what each leaves
unsupervised) render thinking models in their non-thinking mode: `qwen3`'s last assistant turn
opens with the empty block `<think>\n\n</think>\n\n` as Qwen3's Jinja template renders it (its
`enable_thinking=False` only changes the generation prompt, which gets the same block), `gemma4`'s
with the prefix `<|channel>thought\n<channel|>` Gemma 4's template prefills; neither is ever
supervised. `auto` is the tokenizer's own Jinja chat template (`fuelline.chat.jinja_templates`).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass
from typing import Any

PREFIX_TURNS = ("all", "last")
TOOL_SYNTAXES = ("", "qwen")
LOSS_MASKS = ("overlap", "deepspec")


@dataclass(frozen=True)
class ChatTemplate:
    """What a chat format is made of; `render` puts a conversation together from it.

    A turn is `HEADER + content + end_of_turn + after_turn`; `content + end_of_turn` of an
    assistant turn is supervised. `assistant_prefix` (never supervised) follows the assistant
    header on every assistant turn (`assistant_prefix_on="all"`) or only on the conversation's
    last message (`"last"`), and in the generation prompt. `default_system`: the system turn of a
    conversation without one (None: none). Reasoning is rendered as `reasoning_open + reasoning +
    reasoning_close` in place of the prefix (empty: the format has none). `tool_syntax`: how tools
    are written ("qwen"; empty: refused). `loss_mask`: "overlap" (a token is trained on iff it
    overlaps a span) or "deepspec" (spans also cover `after_turn`, masked by DeepSpec's prefix rule:
    `encode._Encoder._prefix_rule_mask`). `jinja`: a Jinja chat template instead (empty: the
    tokenizer's own, `auto`).
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
    last assistant turn up to turn i ends (0 before the first): its text, rendered turn by turn;
    else its span (with generation blocks, the k-th block for the k-th assistant turn when there is
    one block per assistant turn, else 0): an estimate used to pick a cut, which is then rendered
    and checked.
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


def registered() -> list[tuple[str, ChatTemplate]]:
    """Every known name with its template, sorted by name: what an error message offers instead."""
    return sorted(_REGISTRY.items())


def template_file(name: str) -> str:
    """The TOML file a template name reads (`FILE.toml` of `FILE.toml:NAME`), or the name itself."""
    path, found, table = name.partition(".toml")
    return path + found if found and (not table or table.startswith(":")) else name


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
