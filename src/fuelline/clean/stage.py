"""The clean stage: one stage, two profiles (poetry, web), optional script conversion."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

from fuelline.clean.boilerplate import BoilerplateStage
from fuelline.clean.poetry import clean_poem
from fuelline.clean.web import WebRules, clean_web_text
from fuelline.io.readers import iter_file_records
from fuelline.io.rejects import Rejects
from fuelline.pipeline.options import option
from fuelline.pipeline.shards import InputShard
from fuelline.pipeline.stage import PrepareContext, ShardContext, Stage, StageConfig
from fuelline.records import Drop, Location, document_from_raw, fallback_id

CONVERSIONS = ["none", "t2s", "s2t", "tw2s", "hk2s", "s2tw"]  # OpenCC configuration names


@dataclass
class CleanConfig(StageConfig):
    profile: str = option("poetry", "rules to apply", choices=["poetry", "web"])
    convert: str = option("none", "OpenCC script conversion of the text: t2s traditional to simplified, s2t "
                          "simplified to traditional, tw2s/hk2s Taiwan/Hong Kong traditional to simplified, s2tw "
                          "simplified to Taiwan traditional; none leaves the script as it is", choices=CONVERSIONS)
    text_key: str = option("text", "web profile: field holding the text")
    max_han: int = option(3000, "poetry profile: drop poems longer than this (Han characters)", min=1)
    min_chars: int = option(WebRules.min_chars, "web profile: shortest text kept", min=0)
    min_words: int = option(WebRules.min_words, "web profile: fewest words (CJK: characters)", min=0)
    boilerplate: bool | None = option(None, "strip boilerplate lines (default: on for web, off for poetry; see the "
                                      "boilerplate step)")


class CleanStage(Stage):
    name = "clean"
    description = "Clean raw records into documents: poetry rules and metadata, or web quality rules."
    Config = CleanConfig

    def __init__(self, config: CleanConfig | None = None):
        super().__init__(config)
        self._converter = None
        self._web_rules = WebRules(min_chars=self.config.min_chars, min_words=self.config.min_words)
        use_boilerplate = self.config.boilerplate if self.config.boilerplate is not None else self.config.profile == "web"
        self._boilerplate = BoilerplateStage() if use_boilerplate else None

    def __getstate__(self):
        return {**self.__dict__, "_converter": None}  # OpenCC objects do not pickle; rebuilt per worker

    def _convert(self, text: str) -> str:
        if self.config.convert == "none":
            return text
        if self._converter is None:
            import opencc

            self._converter = opencc.OpenCC(f"{self.config.convert}.json")
        return self._converter.convert(text)

    def prepare(self, ctx: PrepareContext) -> None:
        """With boilerplate removal on, count the lines of the cleaned texts across the corpus."""
        if self._boilerplate is not None:
            self._boilerplate.count(ctx, self._cleaned_texts)

    def _cleaned_texts(self, shard: InputShard) -> Iterator[str]:
        located = ((Location(str(shard.source), line), record) for line, record
                   in iter_file_records(shard.source, start=shard.start, stop=shard.stop, on_error="skip"))
        for _, doc in self._clean(located, ShardContext(-1, Rejects())):
            yield doc["text"]

    def process(self, records: Iterable[tuple[Location, dict]], ctx: ShardContext) -> Iterator[dict]:
        cleaned = self._clean(records, ctx)
        if self._boilerplate is not None:
            yield from self._boilerplate.process(cleaned, ctx)
        else:
            yield from (doc for _, doc in cleaned)

    def _clean(self, records: Iterable[tuple[Location, dict]], ctx: ShardContext) -> Iterator[tuple[Location, dict]]:
        for location, record in records:
            if self.config.profile == "poetry":
                result, notes = clean_poem(record, max_han=self.config.max_han)
                ctx.count("notes_removed", notes)
            else:
                result = document_from_raw(record, location, text_key=self.config.text_key)
                if not isinstance(result, Drop):
                    text, removed = clean_web_text(result["text"], self._web_rules)
                    ctx.count("lines_removed", removed)
                    result = text if isinstance(text, Drop) else {**result, "text": text}
            if isinstance(result, Drop):
                ctx.drop(record, result.reason, location, result.detail)
                continue
            if result["id"] is None:
                result["id"] = fallback_id(location.source, location.line)
            if self.config.convert != "none":
                result["text"] = self._convert(result["text"])
                for key in ("title", "author"):
                    if isinstance(result["meta"].get(key), str):
                        result["meta"][key] = self._convert(result["meta"][key])
            if "form" in result["meta"]:
                ctx.count(f"kept_{result['meta']['form']}")
            yield location, result
