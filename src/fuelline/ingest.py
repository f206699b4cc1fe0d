"""The ingest stage: any corpus file into document records `{"id", "text", "meta"}`.

This is where a raw corpus enters the pipeline: field names are mapped (`text_key`, `id_key`),
a text given as a list of strings (poem lines, paragraphs) is joined with newlines, and every
other field is kept in `meta` unless `meta_keys` selects some.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fuelline.pipeline.stage import Drop, Location, Stage, StageConfig
from fuelline.records import document, fallback_id


@dataclass
class IngestConfig(StageConfig):
    text_key: str = field(default="text", metadata={"help": "field holding the text (a string or a list of strings)"})
    id_key: str = field(default="id", metadata={"help": "field holding the upstream id; missing: hash of file name and line"})
    meta_keys: list[str] = field(default_factory=list, metadata={"help": "fields kept in meta (default: all others)"})
    min_chars: int = field(default=1, metadata={"help": "drop texts shorter than this, after stripping whitespace"})


class IngestStage(Stage):
    name = "ingest"
    description = "Read any supported corpus into document records {id, text, meta}."
    Config = IngestConfig

    def apply(self, record: dict, location: Location) -> dict | Drop:
        cfg = self.config
        result = document_from_raw(record, location, text_key=cfg.text_key, id_key=cfg.id_key, meta_keys=cfg.meta_keys)
        if not isinstance(result, Drop) and len(result["text"].strip()) < cfg.min_chars:
            return Drop("too_short")
        return result


def document_from_raw(record: dict, location: Location, *, text_key: str = "text", id_key: str = "id",
                      meta_keys: list[str] | None = None) -> dict | Drop:
    """A document record from a raw one, or a Drop saying which field is missing or wrong."""
    if text_key not in record:
        return Drop("missing_text", f"no field {text_key!r}")
    text = record[text_key]
    if isinstance(text, list) and all(isinstance(t, str) for t in text):
        text = "\n".join(text)
    elif not isinstance(text, str):
        return Drop("bad_text_type", f"{text_key!r} is {type(text).__name__}, not a string or list of strings")
    if not text.strip():
        return Drop("empty_text")
    upstream_id = record.get(id_key)
    doc_id = str(upstream_id) if upstream_id not in (None, "") else fallback_id(location.source, location.line)
    if meta_keys:
        meta = {k: record[k] for k in meta_keys if k in record}
    else:
        meta = {k: v for k, v in record.items() if k not in (text_key, id_key)}
    return document(doc_id, text, meta)
