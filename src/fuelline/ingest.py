"""The ingest stage: any corpus file into document records `{"id", "text", "meta"}`.

This is where a raw corpus enters the pipeline: field names are mapped (`text_key`, `id_key`),
a text given as a list of strings (poem lines, paragraphs) is joined with newlines, and every
other field is kept in `meta` unless `meta_keys` selects some.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fuelline.pipeline.stage import Stage, StageConfig
from fuelline.records import Drop, Location, document_from_raw


@dataclass
class IngestConfig(StageConfig):
    text_key: str = field(default="text", metadata={"help": "field holding the text (a string or a list of strings)"})
    id_key: str = field(default="id", metadata={"help": "field holding the upstream id; missing: hash of file name and line"})
    meta_keys: list[str] = field(default_factory=list, metadata={"help": "fields kept in meta (default: all others)"})
    min_chars: int = field(default=1, metadata={"help": "drop texts shorter than this, after stripping whitespace",
                                                          "min": 0})


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

