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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fuelline.records import unit_interval

DYNASTY_NAMES = {"tang": "唐", "song": "宋", "yuan": "元", "wudai": "五代", "qing": "清", "han": "汉",
                 "zhanguo": "战国", "zhou": "周", "ming": "明"}


@dataclass
class Rendered:
    """A batch of documents back to back: ids, per-document lengths, loss mask, dropout flags."""

    ids: np.ndarray
    lengths: np.ndarray
    mask: np.ndarray
    dropped_metadata: np.ndarray


class Template:
    name = ""

    def __init__(self, tokenizer, *, metadata_dropout: float = 0.0, seed: int = 42):
        self.tokenizer, self.metadata_dropout, self.seed = tokenizer, metadata_dropout, seed
        self.special = {t: tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<|title|>", "<|author|>",
                                                               "<|dynasty|>", "<|content|>")}
        missing = [t for t, i in self.special.items() if i is None and t in self.needs]
        if missing:
            raise ValueError(f"the tokenizer has no single-id token for {', '.join(missing)}")

    needs: tuple[str, ...] = ("<s>", "</s>")

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def encode_repeated(self, values: list[str]) -> list[list[int]]:
        """`encode` for fields with few distinct values (authors, dynasties): each encoded once."""
        distinct = list(dict.fromkeys(values))
        encoded = dict(zip(distinct, self.encode(distinct)))
        return [encoded[v] for v in values]

    def render(self, records: list[dict]) -> Rendered:
        raise NotImplementedError


def _assemble(pieces: list[list[tuple[list[int], int]]], dropped: list[bool]) -> Rendered:
    """Documents given as lists of (ids, mask value) pieces, flattened."""
    ids: list[int] = []
    mask: list[int] = []
    lengths = np.empty(len(pieces), dtype=np.int64)
    for d, document in enumerate(pieces):
        start = len(ids)
        for piece, value in document:
            ids.extend(piece)
            mask.extend([value] * len(piece))
        lengths[d] = len(ids) - start
    return Rendered(np.array(ids, dtype=np.int64), lengths, np.array(mask, dtype=bool), np.array(dropped, dtype=bool))


class PlainTemplate(Template):
    name = "plain"

    def render(self, records: list[dict]) -> Rendered:
        bos, eos = [self.special["<s>"]], [self.special["</s>"]]
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
        documents = []
        for k in range(len(records)):
            if dropped[k]:
                prefix = [s["<s>"], s["<|content|>"]]
            else:
                prefix = ([s["<s>"], s["<|title|>"], *titles[k], s["<|author|>"], *authors[k],
                           s["<|dynasty|>"], *dynasties[k], s["<|content|>"]])
            documents.append([(prefix, 0), (poems[k], 1), ([s["</s>"]], 1)])
        return _assemble(documents, dropped)


TEMPLATES = {"poetry": PoetryTemplate, "plain": PlainTemplate}
