"""Conversations to token ids and an assistant-only loss mask, from one rendering each.

Each conversation is rendered once (`templates.render` records the character spans to train
on while it renders), a batch's texts are encoded together with `add_special_tokens=False` (the
ids `apply_chat_template(tokenize=True)` gives) by `FastEncoder` (`fuelline.tokenizer.fast`),
on the encoder's threads while the caller's thread renders the next RENDER_BATCH. A token is
supervised iff its character offsets overlap a supervised span (one `searchsorted` per batch, no
loop over tokens): transformers' rule for `return_assistant_tokens_mask`, so the two masks agree
token for token. The offsets are positions in the Python string (code points): a token holding
part of a multi-byte character carries the whole character's span, so a CJK character or an
emoji split over two tokens is seen whole, and a token that straddles a span's edge (a header's
"\n" merged with a content that starts with "\n") is supervised, as in transformers.
`qwen-deepspec` masks by DeepSpec's rule instead (`_Encoder._prefix_rule_mask`).

`max_length`: with overflow="truncate" a conversation is cut before a user or system turn that
follows an assistant turn (never inside a tool round), keeping the longest prefix of whole
exchanges. The cut is chosen from the token offsets of the full encoding at the turn ends; the
kept turns are then rendered, encoded and checked on their own, cutting one exchange more while
they do not fit (Qwen3's empty think block moves to the new last turn: 4 tokens more), so the
ids are exactly the encoding of the shortened conversation. A first exchange that does not fit
drops the conversation as too long, as overflow="drop" does.

An assistant turn that spells one of the tokenizer's control tokens (its special added tokens,
the template's end of turn; docs/chat.md shows why) drops the conversation as
`special_token_text` (`special_text="refuse"`), or is kept and counted (`"keep"`). A conversation
that breaks the chat record contract, or that the template cannot render (`unrenderable`), stops
the batch with a `ConversationError` naming its index (`on_error="raise"`), or is a `Drop`.

Cost (benchmarks/bench_chat.py has the measured table): the 7,473 GSM8K exchanges (~190 tokens
each, Qwen vocabulary) on 2 cores take ~0.7 s, tiktoken's encoding most of it, where a loop of
transformers' `apply_chat_template(..., return_assistant_tokens_mask=True)` takes ~5.9 s for the
same ids and masks.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import tokenizers

from fuelline.chat.templates import (ON_ERROR, REASONING, SPECIAL_TEXT, TRAIN_TURNS, ChatTemplate, Rendering,
                                     conversation_tools, conversation_turns, get_template, render_checked)
from fuelline.formats import chat_record
from fuelline.formats.chat_record import ChatRecordError
from fuelline.pipeline.options import check_number
from fuelline.records import Drop
from fuelline.tokenizer.fast import fast_encoder

TOO_LONG, TOO_FEW_LOSS_TOKENS = "too_long", "too_few_loss_tokens"
SPECIAL_TOKEN_TEXT = "special_token_text"
UNRENDERABLE = "unrenderable"  # with on_error="skip", as is the record contract's reason of a conversation
DROP_REASONS = (TOO_LONG, TOO_FEW_LOSS_TOKENS, SPECIAL_TOKEN_TEXT, UNRENDERABLE, *chat_record.REASONS)
OVERFLOW = ("truncate", "drop")
RENDER_BATCH = 256  # conversations rendered on the caller's thread while the previous ones encode
# The keys transformers gives a Jinja chat template as variables (its special tokens map).
TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


@dataclass(frozen=True, eq=False)  # arrays have no single truth value to compare by
class EncodedChat:
    """One conversation's ids (int32) and loss mask (bool, True = trained on); `truncated`: turns were cut;
    `special_text`: control tokens spelled in its assistant turns, kept (special_text="keep")."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    truncated: bool = False
    special_text: int = 0


class ConversationError(ValueError):
    """A conversation of a batch that breaks the record contract or that the template cannot render: `index`
    in the batch (the caller names its file, line and id), `message` what is wrong, `reason` its drop reason."""

    def __init__(self, index: int, message: str, reason: str):
        super().__init__(f"conversation {index}: {message}")
        self.index, self.message, self.reason = index, message, reason

    def __reduce__(self):  # travels intact from a worker process to the parent
        return type(self), (self.index, self.message, self.reason)


@dataclass(frozen=True)
class ChatTokenizer:
    """A `tokenizers.Tokenizer` with what a Jinja chat template needs: its source, the special tokens."""

    tokenizer: tokenizers.Tokenizer
    chat_template: str | None = None
    special_tokens: Mapping[str, str] = field(default_factory=dict)


def load_tokenizer(tokenizer: Any) -> ChatTokenizer:
    """A `tokenizers.Tokenizer`, a transformers fast tokenizer, or a tokenizer directory or tokenizer.json."""
    if isinstance(tokenizer, ChatTokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        return _from_path(Path(tokenizer))
    if isinstance(tokenizer, tokenizers.Tokenizer):
        return ChatTokenizer(_whole(tokenizer))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, tokenizers.Tokenizer):
        template = _pick_template(getattr(tokenizer, "chat_template", None), type(tokenizer).__name__)
        special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        return ChatTokenizer(_whole(backend), template, special)
    raise TypeError(f"expected a tokenizers.Tokenizer, a transformers fast tokenizer or the path of a "
                    f"tokenizer directory or tokenizer.json, found {type(tokenizer).__name__}")


def _whole(tokenizer: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    for setting in ("truncation", "padding"):
        if getattr(tokenizer, setting) is not None:
            raise ValueError(f"the tokenizer has {setting} enabled ({getattr(tokenizer, setting)}), which would "
                             f"change conversations silently; call .no_{setting}() on it (for a transformers "
                             f"tokenizer, on .backend_tokenizer) or pass the tokenizer's path")
    return tokenizer


_loaded: dict[tuple, ChatTokenizer] = {}


def _from_path(path: Path) -> ChatTokenizer:
    """The tokenizer of a directory or tokenizer.json, with the chat template and special tokens of its
    directory; loaded once while the file stays the same."""
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no tokenizer.json there")
    stat = file.stat()
    key = (os.fspath(file.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _loaded:
        return _loaded[key]
    config = _read_json(file.parent / "tokenizer_config.json")
    special_map = _read_json(file.parent / "special_tokens_map.json")
    jinja_file = file.parent / "chat_template.jinja"
    template = jinja_file.read_text(encoding="utf-8") if jinja_file.is_file() else \
        _pick_template(config.get("chat_template"), file.parent / "tokenizer_config.json")
    special = {}
    for name in TOKEN_KEYS:
        value = config.get(name, special_map.get(name))
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            special[name] = value
    _loaded[key] = ChatTokenizer(tokenizers.Tokenizer.from_file(str(file)), template, special)
    return _loaded[key]


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _pick_template(value: Any, where: Any) -> str | None:
    """A chat template setting: a string, or named templates (a dict or a list of {name, template})."""
    if value is None or isinstance(value, str):
        return value
    named = value if isinstance(value, dict) else {t.get("name"): t.get("template") for t in value
                                                    if isinstance(t, dict)}
    if not isinstance(named.get("default"), str):
        raise ValueError(f"{where}: chat_template has named templates ({', '.join(map(str, named))}) but no "
                         f"'default' one; pick a named fuelline template or save the one you want as chat_template")
    return named["default"]


def resolve_template(template: str | ChatTemplate, tokenizer: ChatTokenizer) -> ChatTemplate:
    """The template to render with; `auto` becomes the tokenizer's own Jinja chat template."""
    if isinstance(template, str):
        template = get_template(template)
    if not isinstance(template, ChatTemplate):
        raise TypeError(f"template must be a name or a ChatTemplate, found {type(template).__name__}")
    if template.jinja == "":
        if tokenizer.chat_template is None:
            raise ValueError(f"template {template.name!r} renders with the tokenizer's own Jinja chat template, but "
                             f"this tokenizer has none (no chat_template in tokenizer_config.json, no "
                             f"chat_template.jinja); pass a tokenizer that has one, or pick a named template "
                             f"(--chat-template chatml for a tokenizer of `fuelline tokenizer train`)")
        template = replace(template, jinja=tokenizer.chat_template)
    return template


def supervised_tokens(offsets: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """True for each token (row of `offsets`: start, end) that overlaps a span (start, end) of `spans`.

    Spans are in order and disjoint; the first span ending after a token's start is the only
    one it can overlap, and it does iff the token ends after that span starts.
    """
    if len(spans) == 0:
        return np.zeros(len(offsets), dtype=bool)
    first = np.searchsorted(spans[:, 1], offsets[:, 0], side="right")
    inside = first < len(spans)
    return inside & (offsets[:, 1] > spans[np.minimum(first, len(spans) - 1), 0])


@dataclass(frozen=True)
class _Options:
    """`encode_chats`' options, checked before any conversation is encoded."""

    max_length: int | None
    overflow: str
    min_loss_tokens: int
    tools: list[dict] | None
    reasoning: str
    train_turns: str
    special_text: str
    on_error: str

    def __post_init__(self):
        check_number("max_length", self.max_length, min=1, optional=True)  # as ChatEncoding declares them
        check_number("min_loss_tokens", self.min_loss_tokens, min=0)
        for key, allowed in (("overflow", OVERFLOW), ("reasoning", REASONING), ("train_turns", TRAIN_TURNS),
                             ("special_text", SPECIAL_TEXT), ("on_error", ON_ERROR)):
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} must be one of {', '.join(allowed)}, not {getattr(self, key)!r}")


def encode_chats(conversations: Sequence[Any], tokenizer: Any, template: str | ChatTemplate,
                 max_length: int | None = None, *, overflow: str = "truncate", min_loss_tokens: int = 1,
                 tools: list[dict] | None = None, reasoning: str = "last", train_turns: str = "all",
                 special_text: str = "refuse", on_error: str = "raise") -> list[EncodedChat | Drop]:
    """Encode a batch of conversations (or chat records); a `Drop` (reason in DROP_REASONS) for those left out.

    `tools`, `reasoning` and `train_turns` are `templates.render`'s, for every conversation
    (`tools` for those that are not records carrying their own); `special_text` and `on_error`
    are described in the module docstring (a `ConversationError` names the first bad conversation).
    """
    options = _Options(max_length, overflow, min_loss_tokens, tools, reasoning, train_turns, special_text, on_error)
    return _encode(conversations, tokenizer, template, options)


def encode_chat(conversation: Any, tokenizer: Any, template: str | ChatTemplate, max_length: int | None = None,
                *, overflow: str = "truncate", min_loss_tokens: int = 1, tools: list[dict] | None = None,
                reasoning: str = "last", train_turns: str = "all", special_text: str = "refuse") -> EncodedChat | Drop:
    """`encode_chats` for one conversation; a ValueError says what is wrong with it."""
    try:
        return encode_chats([conversation], tokenizer, template, max_length, overflow=overflow,
                            min_loss_tokens=min_loss_tokens, tools=tools, reasoning=reasoning,
                            train_turns=train_turns, special_text=special_text)[0]
    except ConversationError as e:
        raise ValueError(e.message) from None


class _Encoder:
    """Renders and encodes lists of turns with one template and tokenizer."""

    def __init__(self, tokenizer: ChatTokenizer, template: ChatTemplate, options: _Options):
        self.tokenizer, self.template, self.options = tokenizer, template, options
        self.failed: dict[int, Drop] = {}  # on_error="skip": the conversations that did not render, by index
        controls = {t.content for t in tokenizer.tokenizer.get_added_tokens_decoder().values() if t.special}
        controls |= {template.end_of_turn} if template.end_of_turn else set()
        self.controls = re.compile("|".join(map(re.escape, sorted(controls, key=len, reverse=True)))) if controls \
            else None

    def __call__(self, items: list[tuple[int, list[dict], list[dict] | None]]):
        """(rendering, ids, mask, supervised tokens, offsets) for each (conversation index, turns, tools).

        The whole batch is encoded and masked at once: the supervised spans are moved to where
        their text starts in the joined texts, so one `supervised_tokens` call covers them all.
        """
        encoder = fast_encoder(self.tokenizer.tokenizer)
        for renderings, batch in encoder.encode_batches(self._rendered(items), offsets=True):
            ends = np.cumsum(batch.counts)
            offsets = batch.offsets_in_texts()
            if self.template.loss_mask == "deepspec":
                mask = self._prefix_rule_mask(renderings, batch, offsets, ends)
            else:
                spans = [edge + start for r, start in zip(renderings, batch.text_starts.tolist())
                         for span in r.spans for edge in span]
                mask = supervised_tokens(batch.offsets, np.array(spans, dtype=np.int64).reshape(-1, 2))
            supervised_before = np.concatenate([[0], np.cumsum(mask)])
            supervised = (supervised_before[ends] - supervised_before[ends - batch.counts]).tolist()
            for rendering, start, end, count in zip(renderings, (ends - batch.counts).tolist(), ends.tolist(),
                                                    supervised):
                yield rendering, batch.ids[start:end], mask[start:end], count, offsets[start:end]

    def _rendered(self, items):
        """(renderings, texts) per RENDER_BATCH items: rendered while the encoder encodes the previous ones."""
        for i in range(0, len(items), RENDER_BATCH):
            renderings = [self._render(k, turns, tools) for k, turns, tools in items[i:i + RENDER_BATCH]]
            yield renderings, [r.text for r in renderings]

    def _prefix_rule_mask(self, renderings, batch, offsets_in_texts, ends) -> np.ndarray:
        """DeepSpec's mask: a span [s, e) trains tokens len(encode(text[:s])) to len(encode(text[:e])).

        An added token splits an encoding (the text on either side is encoded on its own), so
        `encode(text[:x])` is the full encoding's tokens up to the last added token that ends at
        or before x, then the encoding of the text from there to x (for ChatML "assistant\\n"
        or "\\n"): only those short pieces are encoded, each distinct one once.
        """
        tokenizer = self.tokenizer.tokenizer
        added = np.fromiter(tokenizer.get_added_tokens_decoder(), np.int64)
        mask, pieces = np.zeros(len(batch.ids), dtype=bool), {}
        bounds = []  # (conversation's first token, tokens before the piece, piece) per span edge
        for rendering, first, end in zip(renderings, ends - batch.counts, ends):
            offsets = offsets_in_texts[first:end]
            at = np.flatnonzero(np.isin(batch.ids[first:end], added))
            for x in np.array(rendering.spans, dtype=np.int64).reshape(-1):
                k = np.searchsorted(offsets[at, 1], x, side="right")  # added tokens ending at or before x
                split = int(offsets[at[k - 1], 1]) if k else 0
                piece = rendering.text[split:x]
                pieces.setdefault(piece, None)
                bounds.append((first, int(at[k - 1]) + 1 if k else 0, piece))
        lengths = {p: len(e.ids) for p, e in zip(pieces, tokenizer.encode_batch(list(pieces), add_special_tokens=False))}
        for (first, before, piece), (_, before_end, piece_end) in zip(bounds[0::2], bounds[1::2]):
            mask[first + before + lengths[piece]:first + before_end + lengths[piece_end]] = True
        return mask

    def conversation(self, k: int, conversation: Any) -> tuple[list[dict], list[dict] | None]:
        try:
            return conversation_turns(conversation), conversation_tools(conversation, self.options.tools)
        except ChatRecordError as e:
            raise ConversationError(k, str(e), e.reason) from None

    def special_text(self, turns: list[dict]) -> tuple[int, str]:
        """(occurrences, the first one in words) of control-token text in the assistant turns."""
        if self.controls is None:
            return 0, ""
        count, first = 0, ""
        for i, turn in enumerate(turns):
            if turn["role"] != "assistant":
                continue
            texts = [("content", turn["content"])]
            if len(turn) > 2:
                texts += [("reasoning_content", turn.get("reasoning_content") or ""),
                          *((f"tool_calls[{j}]", json.dumps(call["function"], ensure_ascii=False))
                            for j, call in enumerate(turn.get("tool_calls") or ()))]
            for key, text in texts:
                found = self.controls.findall(text)
                if found and not first:
                    first = (f"turn {i}: {key} spells {found[0]!r}, a control token of the tokenizer, which would be "
                             f"encoded as that token (special_text='keep' keeps it so)")
                count += len(found)
        return count, first

    def _render(self, k: int, turns: list[dict], tools: list[dict] | None):
        try:
            return render_checked(turns, tools, self.template, variables=self.tokenizer.special_tokens,
                                  reasoning=self.options.reasoning, train_turns=self.options.train_turns)
        except ValueError as e:
            if self.options.on_error == "raise":
                raise ConversationError(k, str(e), UNRENDERABLE) from None
            self.failed[k] = Drop(UNRENDERABLE, str(e))
            return Rendering("", (), ())  # encodes to no tokens; its result is the Drop


def _encode(conversations, tokenizer, template, options: _Options) -> list[EncodedChat | Drop]:
    tok = load_tokenizer(tokenizer)
    encoder = _Encoder(tok, resolve_template(template, tok), options)
    results: list[EncodedChat | Drop | None] = [None] * len(conversations)
    parsed: dict[int, tuple[list[dict], list[dict] | None]] = {}
    special: dict[int, int] = {}
    for k, conversation in enumerate(conversations):
        try:
            turns, tools = encoder.conversation(k, conversation)
        except ConversationError as e:
            if options.on_error == "raise":
                raise
            results[k] = Drop(e.reason, e.message)
            continue
        count, first = encoder.special_text(turns)
        if count and options.special_text == "refuse":
            results[k] = Drop(SPECIAL_TOKEN_TEXT, first)
            continue
        parsed[k], special[k] = (turns, tools), count
    cuts: dict[int, list[int]] = {}
    items = [(k, *p) for k, p in parsed.items()]
    for (k, turns, _), (rendering, ids, mask, supervised, offsets) in zip(items, encoder(items)):
        if (failed := encoder.failed.pop(k, None)) is not None:
            results[k] = failed
        elif options.max_length is None or len(ids) <= options.max_length:
            results[k] = _keep(ids, mask, supervised, False, options, special[k])
        elif options.overflow == "drop":
            results[k] = Drop(TOO_LONG, f"{len(ids):,} tokens, max_length {options.max_length:,}")
        else:
            fitting = _cuts_that_may_fit(turns, rendering.turn_ends, offsets, options.max_length)
            if fitting:
                cuts[k] = fitting
            else:
                results[k] = Drop(TOO_LONG, f"{len(ids):,} tokens, and the first exchange alone exceeds "
                                            f"max_length {options.max_length:,}")
    _truncate(encoder, parsed, cuts, results, options, special)
    return results


def _keep(ids: np.ndarray, mask: np.ndarray, supervised: int, truncated: bool, options: _Options,
          special_text: int) -> EncodedChat | Drop:
    if supervised < options.min_loss_tokens:
        return Drop(TOO_FEW_LOSS_TOKENS, f"{supervised} of {len(ids)} tokens supervised, "
                                         f"min_loss_tokens {options.min_loss_tokens}")
    return EncodedChat(ids, mask, truncated, special_text)


def _cuts_that_may_fit(turns: list[dict], turn_ends: tuple[int, ...], offsets: np.ndarray,
                       max_length: int) -> list[int]:
    """Turn counts ending a whole exchange whose tokens in the full encoding fit, longest first."""
    cuts = [c for c in range(1, len(turns))
            if turns[c - 1]["role"] == "assistant" and turns[c]["role"] not in ("assistant", "tool")]
    if not cuts:
        return []
    tokens_before = np.searchsorted(offsets[:, 0], [turn_ends[c - 1] for c in cuts], side="left")
    return [c for c, n in zip(cuts, tokens_before) if n <= max_length][::-1]


def _truncate(encoder: _Encoder, parsed, cuts: dict[int, list[int]], results: list, options: _Options,
              special: dict[int, int]) -> None:
    """Fill in `results` for the conversations in `cuts`: each encoded at its longest cut that fits."""
    while cuts:
        todo = list(cuts)
        for k, (_, ids, mask, supervised, _) in zip(todo, encoder([(k, parsed[k][0][:cuts[k][0]], parsed[k][1])
                                                                    for k in todo])):
            if (failed := encoder.failed.pop(k, None)) is not None:
                results[k] = failed
                del cuts[k]
            elif len(ids) <= options.max_length:
                results[k] = _keep(ids, mask, supervised, True, options, special[k])
                del cuts[k]
            else:
                cuts[k].pop(0)
                if not cuts[k]:
                    results[k] = Drop(TOO_LONG, f"the first exchange alone is {len(ids):,} tokens, "
                                                f"max_length {options.max_length:,}")
                    del cuts[k]
