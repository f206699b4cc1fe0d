"""Templates: documents to token ids and loss mask, computed together, never re-derived.

Every piece is tokenized on its own and the pieces are concatenated, so the mask is exact by
construction: no prefix is re-tokenized to find where it ends. (Special tokens split the text
before BPE anyway, so encoding the pieces separately gives the same ids as encoding the joined
string.) The poetry and plain layouts and what each trains on: docs/tokenizer-and-pack.md; with
metadata dropout the model also learns to write a poem without being told title, author and
dynasty. chat: a chat record rendered by a chat template with its assistant-only mask
(`ChatEncoding.encode`, which cuts, drops and counts); the manifest's bos/eos are the template's
own tokens (ChatML's eos is `<|im_end|>`), not `<s>`/`</s>`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from fuelline.chat.encoding_options import ChatEncoding
from fuelline.clean.poetry import DYNASTY_NAMES
from fuelline.formats import chat_record
from fuelline.io.readers import RecordError
from fuelline.records import Drop, unit_interval
from fuelline.tokenizer.fast import EncodedBatch, fast_encoder


@dataclass
class Rendered:
    """A batch of documents back to back: ids, per-document lengths, loss mask, dropout flags.

    `kept` flags the input records that became documents (None: all of them); `drops` holds the
    others, (index in the batch, Drop); `truncated` counts documents cut to fit, `special_text`
    the control-token texts kept in them.
    """

    ids: np.ndarray
    lengths: np.ndarray
    mask: np.ndarray
    dropped_metadata: np.ndarray
    kept: np.ndarray | None = None
    drops: list[tuple[int, Drop]] = field(default_factory=list)
    truncated: int = 0
    special_text: int = 0


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

    def record_problem(self, record: dict) -> Drop | None:
        """Why `record` is unfit for this template, or None."""
        if not isinstance(record.get("text"), str) or not isinstance(record.get("id"), str):
            return Drop("not_a_document_record", 'expected a document record with string "id" and "text"')
        return None

    def refusal(self, problem: Drop, source: str | os.PathLike, line: int) -> ValueError:
        """What stops the run (on_error="raise") at a record `record_problem` found unfit."""
        return RecordError(source, line, f"{problem.detail} ({problem.reason})")

    def encode(self, texts: list[str]) -> EncodedBatch:
        """The texts' ids back to back, through tiktoken when it gives this tokenizer's exact ids (checked)."""
        return fast_encoder(self.tokenizer).encode_batch(texts)

    def encode_distinct(self, values: list[str]) -> tuple[EncodedBatch, np.ndarray]:
        """For fields with few distinct values (authors, dynasties): each encoded once, and which one each is."""
        distinct = {value: k for k, value in enumerate(dict.fromkeys(values))}
        return self.encode(list(distinct)), np.fromiter(map(distinct.__getitem__, values), np.int64, len(values))

    def boundary_ids(self) -> tuple[int | None, int | None]:
        """The manifest's (bos_id, eos_id): the ids of the tokens that open and close a document."""
        return self.tokenizer.token_to_id("<s>"), self.tokenizer.token_to_id("</s>")

    @property
    def encoder(self) -> str:
        """Which engine encodes, and why (stats.json reports it)."""
        return fast_encoder(self.tokenizer).reason

    def render(self, records: list[dict]) -> Rendered:
        raise NotImplementedError


class Pieces:
    """A batch's documents as columns of pieces cut from one pool of ids, assembled without a loop.

    Each column is one piece of every document (its title, say): where it starts in the pool,
    how many ids it has (0 leaves it out of that document) and whether it is trained on. For
    48k poems this takes ~50 ms, where a per-document list of arrays took ~0.5 s.
    """

    def __init__(self, count: int):
        self.count, self.pool, self.size = count, [], 0
        self.columns: list[tuple[np.ndarray, np.ndarray, bool]] = []

    def _add(self, ids: np.ndarray) -> int:
        self.pool.append(ids)
        self.size += len(ids)
        return self.size - len(ids)

    def token(self, token_id: int, trained: bool, present: np.ndarray | None = None) -> None:
        """The same single token in every document (or in those where `present`)."""
        start = self._add(np.array([token_id], dtype=np.int32))
        lengths = np.ones(self.count, np.int64) if present is None else present.astype(np.int64)
        self.columns.append((np.full(self.count, start, np.int64), lengths, trained))

    def texts(self, batch: EncodedBatch, trained: bool, present: np.ndarray | None = None,
              which: np.ndarray | None = None) -> None:
        """Encoded text `which[k]` of `batch` (default: text k) in document k (or in those where `present`)."""
        base = self._add(batch.ids)
        starts, lengths = base + np.cumsum(batch.counts) - batch.counts, batch.counts
        if which is not None:
            starts, lengths = starts[which], lengths[which]
        if present is not None:
            lengths = lengths * present
        self.columns.append((starts, lengths, trained))

    def assemble(self, dropped: np.ndarray) -> Rendered:
        starts, lengths = (np.stack([c[i] for c in self.columns], axis=1).ravel() for i in (0, 1))
        trained = np.tile(np.array([c[2] for c in self.columns]), self.count)
        out_starts = np.cumsum(lengths) - lengths
        pool = np.concatenate(self.pool).astype(np.int64)
        ids = pool[np.arange(int(lengths.sum())) + np.repeat(starts - out_starts, lengths)]
        return Rendered(ids, lengths.reshape(self.count, -1).sum(axis=1), np.repeat(trained, lengths), dropped)


class PlainTemplate(Template):
    name = "plain"

    def render(self, records: list[dict]) -> Rendered:
        pieces = Pieces(len(records))
        pieces.token(self.special["<s>"], True)
        pieces.texts(self.encode([r["text"] for r in records]), True)
        pieces.token(self.special["</s>"], True)
        return pieces.assemble(np.zeros(len(records), dtype=bool))


class PoetryTemplate(Template):
    name = "poetry"
    needs = ("<s>", "</s>", "<|title|>", "<|author|>", "<|dynasty|>", "<|content|>")

    def render(self, records: list[dict]) -> Rendered:
        s = self.special
        metas = [r.get("meta") or {} for r in records]
        dropped = np.array([unit_interval(self.seed, "dropout", r["id"]) < self.metadata_dropout for r in records],
                           dtype=bool)
        shown = ~dropped
        authors = self.encode_distinct([str(m.get("author") or "") for m in metas])
        dynasties = self.encode_distinct([DYNASTY_NAMES.get(m.get("dynasty"), str(m.get("dynasty") or ""))
                                          for m in metas])
        pieces = Pieces(len(records))
        pieces.token(s["<s>"], False)
        pieces.token(s["<|title|>"], False, shown)
        pieces.texts(self.encode([str(m.get("title") or "") for m in metas]), False, shown)
        pieces.token(s["<|author|>"], False, shown)
        pieces.texts(authors[0], False, shown, which=authors[1])
        pieces.token(s["<|dynasty|>"], False, shown)
        pieces.texts(dynasties[0], False, shown, which=dynasties[1])
        pieces.token(s["<|content|>"], False)
        pieces.texts(self.encode([r["text"] for r in records]), True)
        pieces.token(s["</s>"], True)
        return pieces.assemble(dropped)


class ChatPackTemplate(Template):
    """Chat records through a chat template, for supervised fine-tuning (`pack --template chat`)."""

    name = "chat"
    needs = ()

    def __init__(self, tokenizer, *, encoding: ChatEncoding, on_error: str = "raise", tokenizer_dir: str | None = None,
                 **options):
        super().__init__(tokenizer, **options)
        from fuelline.chat.encode import load_tokenizer, resolve_template

        self.chat_tokenizer = load_tokenizer(tokenizer_dir if tokenizer_dir else tokenizer)
        self.chat_template = resolve_template(encoding.chat_template, self.chat_tokenizer)
        end = self.chat_template.end_of_turn
        if end and tokenizer.token_to_id(end) is None:
            raise ValueError(f"the tokenizer has no single-id token for {end!r}, the end of turn of chat template "
                             f"{self.chat_template.name!r}; use the target model's tokenizer, or one trained by "
                             f"`fuelline tokenizer train` (it reserves ChatML's markers)")
        self.encoding, self.on_error = encoding, on_error

    def boundary_ids(self) -> tuple[int | None, int | None]:
        """A named template's own bos and end of turn, a Jinja template's the tokenizer's bos and eos token
        (the ones transformers gives it), where the tokenizer has them as added tokens; else None."""
        added = {t.content: i for i, t in self.tokenizer.get_added_tokens_decoder().items()}
        template, special = self.chat_template, self.chat_tokenizer.special_tokens
        if template.jinja is None:
            return added.get(template.bos), added.get(template.end_of_turn)
        return added.get(special.get("bos_token")), added.get(template.end_of_turn or special.get("eos_token"))

    def record_problem(self, record: dict) -> Drop | None:
        """The chat record contract (`fuelline.formats.chat_record`), as chat prepare and regenerate check it."""
        return chat_record.check(record)

    def refusal(self, problem: Drop, source: str | os.PathLike, line: int) -> ValueError:
        """The contract's own error, as every other step raises it for the same record."""
        return chat_record.ChatRecordError(problem.reason, problem.detail, f"{os.fspath(source)}:{line}")

    def render(self, records: list[dict]) -> Rendered:
        results = self.encoding.encode(records, self.chat_tokenizer, self.chat_template,  # whole: with their tools
                                       on_error=self.on_error)
        kept = np.array([not isinstance(r, Drop) for r in results], dtype=bool)
        encoded = [r for r in results if not isinstance(r, Drop)]
        drops = [(k, r) for k, r in enumerate(results) if isinstance(r, Drop)]
        return Rendered(
            np.concatenate([r.input_ids for r in encoded]).astype(np.int64) if encoded else np.zeros(0, np.int64),
            np.array([len(r.input_ids) for r in encoded], dtype=np.int64),
            np.concatenate([r.loss_mask for r in encoded]).astype(bool) if encoded else np.zeros(0, bool),
            np.zeros(len(encoded), dtype=bool), kept, drops, sum(r.truncated for r in encoded),
            sum(r.special_text for r in encoded))


TEMPLATES = {"poetry": PoetryTemplate, "plain": PlainTemplate, "chat": ChatPackTemplate}
