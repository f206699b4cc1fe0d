"""A Jinja chat template run as transformers runs it, so the text is `apply_chat_template`'s.

The template runs in jinja2's immutable sandbox, set up as transformers sets it up
(trim_blocks, lstrip_blocks, loop controls, `tojson` without HTML escaping, `raise_exception`,
`strftime_now`), and gets the turns and `tools=` as transformers gives them. One addition:
each `{% generation %}` block wraps its output in the marks GENERATION_OPEN and
GENERATION_CLOSE, from which `fuelline.chat.jinja_templates` takes the spans to supervise.
This module puts the marks in the text; that one reads them, and never imports jinja2.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping

from fuelline.chat.template_registry import ChatTemplate

# Unicode noncharacters, reserved for a program's internal use, around a generation block's output.
GENERATION_OPEN, GENERATION_CLOSE = "\ufdd0", "\ufdd1"
_GENERATION_TAG = re.compile(r"{%-?\s*generation\s*-?%}")
_DICT_ATTRIBUTES = frozenset(dir(dict))  # `d.items` is the method, as in Jinja, even where d has an "items" key
_STR_FORMAT = frozenset({"format", "format_map"})  # the sandbox wraps these


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
           sort_keys: bool = False) -> str:
    """JSON as the `tojson` filter of transformers' chat templates writes it (", " and ": ", not ASCII-escaped)."""
    memo = _JSON_MEMO.get()
    if memo is None or not isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    key = (id(value), ensure_ascii, indent, None if separators is None else tuple(separators), sort_keys)
    known = memo.get(key)
    if known is None or known[0] is not value:  # the object is held, so its id is not another's while the memo lives
        known = memo[key] = (value, json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                               sort_keys=sort_keys))
    return known[1]


_JSON_MEMO: ContextVar[dict | None] = ContextVar("fuelline_json_memo", default=None)


@contextmanager
def one_conversation():
    """Within the block, each object's JSON is written once: the renderings of one conversation (about eight
    for an agent trajectory of four rounds, rendered turn by turn) write the same tool schemas and arguments
    each time, ~15% of their cost. Nothing changes the conversation while it renders."""
    token = _JSON_MEMO.set({})
    try:
        yield
    finally:
        _JSON_MEMO.reset(token)


@lru_cache(maxsize=16)
def has_generation_blocks(source: str) -> bool:
    return _GENERATION_TAG.search(source) is not None


def run_jinja(t: ChatTemplate, turns: list[dict], tools: list[dict] | None, add_generation_prompt: bool,
              variables: Mapping[str, Any]) -> str:
    """The text `t.jinja` renders for these turns, generation blocks between their marks."""
    compiled = _compile_jinja(t.jinja)
    import jinja2  # installed: _compile_jinja has imported it

    try:
        return compiled.render(messages=_template_messages(turns), tools=tools, documents=None,
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as e:
        raise ValueError(f"the Jinja chat template of {t.name!r} failed: {e}") from None
    except (TypeError, LookupError, AttributeError, ValueError) as e:  # the template's own Python, on this data
        raise ValueError(f"the Jinja chat template of {t.name!r} failed on this conversation: "
                         f"{type(e).__name__}: {e}") from None


def _template_messages(turns: list[dict]) -> list[dict]:
    """The messages as transformers gives them to a template: reasoning also under `thinking` (gpt-oss reads
    that); `weight` is ours to apply (to the mask), so no template sees it."""
    messages = [{k: v for k, v in turn.items() if k != "weight"} if "weight" in turn else turn for turn in turns]
    return [{"thinking": turn["reasoning_content"], **turn} if "reasoning_content" in turn else turn
            for turn in messages]


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
            return GENERATION_OPEN + caller() + GENERATION_CLOSE

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    plain_attributes = (jinja2.runtime.LoopContext, jinja2.utils.Namespace, str)

    class Environment(ImmutableSandboxedEnvironment):
        def getattr(self, obj, attribute):
            """What the sandbox gives, sooner, for what chat templates read most: `message.role` of a plain
            dict (its item, without the AttributeError the sandbox raises and catches first), and `loop.last`,
            `ns.calls` or `content.strip` (attributes the sandbox allows, without its checks, which are for
            internal attributes, mutating methods and str.format). Together most of a tool template's time."""
            kind = type(obj)
            if kind is dict and attribute not in _DICT_ATTRIBUTES:
                try:
                    return obj[attribute]
                except KeyError:
                    return self.undefined(obj=obj, name=attribute)
            if kind in plain_attributes and not attribute.startswith("_") and attribute not in _STR_FORMAT:
                try:
                    return getattr(obj, attribute)
                except AttributeError:
                    pass
            return super().getattr(obj, attribute)

        def make_globals(self, d):
            """The template's globals as one plain dict, not jinja2's ChainMap over the environment's: every
            rendering copies them into a new context, and iterating a ChainMap cost a fifth of a short
            conversation's rendering. Nothing changes the globals once the template is compiled."""
            return {**self.globals, **(d or {})}

    env = Environment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat template is not valid Jinja: line {e.lineno}: {e.message}") from None
