"""The ingest stage: any corpus file into document records `{"id", "text", "meta"}`.

This is where a raw corpus enters the pipeline: field names are mapped (`text_key`, `id_key`),
a text given as a list of strings (poem lines, paragraphs) is joined with newlines, and every
other field is kept in `meta` unless `meta_keys` selects some.
"""

from __future__ import annotations

from dataclasses import dataclass

from fuelline.pipeline.options import option
from fuelline.pipeline.stage import Stage, StageConfig
from fuelline.records import Drop, Location, document_from_raw


@dataclass
class IngestConfig(StageConfig):
    text_key: str = option("text", "field holding the text (a string or a list of strings)")
    id_key: str = option("id", "field holding the upstream id; missing: hash of file name and line")
    meta_keys: list[str] = option(help="fields kept in meta (default: all others)", factory=list)
    min_chars: int = option(1, "drop texts shorter than this, after stripping whitespace", min=0)


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

