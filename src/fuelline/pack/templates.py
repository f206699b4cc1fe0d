"""Templates: documents to token ids and loss mask, computed together, never re-derived.

Every piece is tokenized on its own and the pieces are concatenated, so the mask is exact by
construction: no prefix is re-tokenized to find where it ends. (Special tokens split the text
before BPE anyway, so encoding the pieces separately gives the same ids as encoding the joined
string.)

- poetry: `<s><|title|>T<|author|>A<|dynasty|>D<|content|>POEM</s>`; everything up to and
  including `<|content|>` is context (mask 0), the poem and `</s>` are trained on (mask 1).
  With metadata dropout a document is `<s><|content|>POEM</s>`, so the model also learns to
  write without being told title, author and dynasty.
- plain: `<s>TEXT</s>`, every token trained on.
- chat: a chat record `{"id", "conversations"}` rendered by a chat template
  (`fuelline.chat.templates`); the mask is `encode_chats`' assistant-only mask (assistant
  contents and their end-of-turn token). Conversations over `max_length` are cut at a turn
  boundary, and those left with fewer than `min_loss_tokens` supervised tokens are dropped,
  each counted under its reason.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from fuelline.tokenizer.fast import fast_encoder

from fuelline.records import unit_interval

DYNASTY_NAMES = {"tang": "唐", "song": "宋", "yuan": "元", "wudai": "五代", "qing": "清", "han": "汉",
                 "zhanguo": "战国", "zhou": "周", "ming": "明"}


@dataclass
class Rendered:
    """A batch of documents back to back: ids, per-document lengths, loss mask, dropout flags.

    `kept` flags the input records that became documents (None: all of them); `drops` counts
    the others by reason; `truncated` counts documents cut to fit.
    """

    ids: np.ndarray
    lengths: np.ndarray
    mask: np.ndarray
    dropped_metadata: np.ndarray
    kept: np.ndarray | None = None
    drops: Counter = field(default_factory=Counter)
    truncated: int = 0


class Template:
    name = ""

    def __init__(self, tokenizer, *, metadata_dropout: float = 0.0, seed: int = 42, **_chat_options):
        self.tokenizer, self.metadata_dropout, self.seed = tokenizer, metadata_dropout, seed
        self.special = {t: tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<|title|>", "<|author|>",
                                                               "<|dynasty|>", "<|content|>")}
        missing = [t for t, i in self.special.items() if i is None and t in self.needs]
        if missing:
            raise ValueError(f"the tokenizer has no single-id token for {', '.join(missing)}")

    needs: tuple[str, ...] = ("<s>", "</s>")

    def record_problem(self, record: dict) -> str | None:
        """What makes `record` unfit for this template, or None."""
        if not isinstance(record.get("text"), str) or not isinstance(record.get("id"), str):
            return 'expected a document record with string "id" and "text"'
        return None

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's ids, through tiktoken when it gives this tokenizer's exact ids (checked)."""
        return fast_encoder(self.tokenizer).encode(texts)

    @property
    def encoder(self) -> str:
        """Which engine encodes, and why (stats.json reports it)."""
        return fast_encoder(self.tokenizer).reason

    def encode_repeated(self, values: list[str]) -> list[np.ndarray]:
        """`encode` for fields with few distinct values (authors, dynasties): each encoded once."""
        distinct = list(dict.fromkeys(values))
        encoded = dict(zip(distinct, self.encode(distinct)))
        return [encoded[v] for v in values]

    def render(self, records: list[dict]) -> Rendered:
        raise NotImplementedError


def _assemble(pieces: list[list[tuple[np.ndarray, int]]], dropped: list[bool]) -> Rendered:
    """Documents given as lists of (ids, mask value) pieces, flattened (one concatenation, one repeat)."""
    arrays = [ids for document in pieces for ids, _ in document]
    sizes = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
    values = np.fromiter((value for document in pieces for _, value in document), dtype=bool, count=len(arrays))
    per_document = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    ends = np.cumsum(per_document)
    piece_ends = np.concatenate([[0], np.cumsum(sizes)])
    lengths = piece_ends[ends] - piece_ends[ends - per_document]
    ids = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
    return Rendered(ids, lengths, np.repeat(values, sizes), np.array(dropped, dtype=bool))


class PlainTemplate(Template):
    name = "plain"

    def render(self, records: list[dict]) -> Rendered:
        bos, eos = np.array([self.special["<s>"]]), np.array([self.special["</s>"]])
        texts = self.encode([r["text"] for r in records])
        return _assemble([[(bos, 1), (t, 1), (eos, 1)] for t in texts], [False] * len(records))


class PoetryTemplate(Template):
    name = "poetry"
    needs = ("<s>", "</s>", "<|title|>", "<|author|>", "<|dynasty|>", "<|content|>")

    def render(self, records: list[dict]) -> Rendered:
        s = self.special
        metas = [r.get("meta") or {} for r in records]
        dropped = [unit_interval(self.seed, "dropout", r["id"]) < self.metadata_dropout for r in records]
        poems = self.encode([r["text"] for r in records])
        titles = self.encode([str(m.get("title") or "") for m in metas])
        authors = self.encode_repeated([str(m.get("author") or "") for m in metas])
        dynasties = self.encode_repeated([DYNASTY_NAMES.get(m.get("dynasty"), str(m.get("dynasty") or ""))
                                          for m in metas])
        start, content, eos = (np.array([s[t]]) for t in ("<s>", "<|content|>", "</s>"))
        title, author, dynasty = (np.array([s[t]]) for t in ("<|title|>", "<|author|>", "<|dynasty|>"))
        dropped_prefix = np.array([s["<s>"], s["<|content|>"]])
        documents = []
        for k in range(len(records)):
            if dropped[k]:
                prefix = [(dropped_prefix, 0)]
            else:
                prefix = [(start, 0), (title, 0), (titles[k], 0), (author, 0), (authors[k], 0), (dynasty, 0),
                          (dynasties[k], 0), (content, 0)]
            documents.append(prefix + [(poems[k], 1), (eos, 1)])
        return _assemble(documents, dropped)




class ChatPackTemplate(Template):
    """Chat records through a chat template, for supervised fine-tuning (`pack --template chat`)."""

    name = "chat"
    needs = ()

    def __init__(self, tokenizer, *, chat_template: str = "chatml", max_length: int = 0, min_loss_tokens: int = 1,
                 tokenizer_dir: str | None = None, **options):
        super().__init__(tokenizer, **options)
        from fuelline.chat.encode import load_tokenizer, resolve_template

        self.chat_tokenizer = load_tokenizer(tokenizer_dir if tokenizer_dir else tokenizer)
        self.chat_template = resolve_template(chat_template, self.chat_tokenizer)
        end = self.chat_template.end_of_turn
        if end and tokenizer.token_to_id(end) is None:
            raise ValueError(f"the tokenizer has no single-id token for {end!r}, the end of turn of chat template "
                             f"{self.chat_template.name!r}; use the target model's tokenizer, or one trained by "
                             f"`fuelline tokenizer train` (it reserves ChatML's markers)")
        self.max_length, self.min_loss_tokens = max_length or None, min_loss_tokens

    def record_problem(self, record: dict) -> str | None:
        if not isinstance(record.get("conversations"), list) or not isinstance(record.get("id"), str):
            return 'expected a chat record with string "id" and a "conversations" list (see `fuelline chat prepare`)'
        return None

    def render(self, records: list[dict]) -> Rendered:
        from fuelline.chat.encode import encode_chats
        from fuelline.pipeline.stage import Drop

        results = encode_chats([r["conversations"] for r in records], self.chat_tokenizer, self.chat_template,
                               self.max_length, min_loss_tokens=self.min_loss_tokens)
        kept = np.array([not isinstance(r, Drop) for r in results], dtype=bool)
        encoded = [r for r in results if not isinstance(r, Drop)]
        drops = Counter(r.reason for r in results if isinstance(r, Drop))
        return Rendered(
            np.concatenate([r.input_ids for r in encoded]).astype(np.int64) if encoded else np.zeros(0, np.int64),
            np.array([len(r.input_ids) for r in encoded], dtype=np.int64),
            np.concatenate([r.loss_mask for r in encoded]).astype(bool) if encoded else np.zeros(0, bool),
            np.zeros(len(encoded), dtype=bool), kept, drops, sum(r.truncated for r in encoded))


TEMPLATES = {"poetry": PoetryTemplate, "plain": PlainTemplate, "chat": ChatPackTemplate}
