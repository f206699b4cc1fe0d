"""The tokenizer as a pipeline step: train on the documents of the step before."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from fuelline.io.atomic import write_bytes_atomic
from fuelline.pipeline.stage import StageConfig
from fuelline.pipeline.task import Task
from fuelline.tokenizer.train import PRETOKENIZE, train_tokenizer


@dataclass
class TokenizerConfig(StageConfig):
    vocab_size: int = field(default=4096, metadata={"help": "tokens in the vocabulary"})
    pretokenize: str = field(default="han-chars", metadata={"help": "how text is cut before BPE",
                                                             "choices": list(PRETOKENIZE)})
    min_frequency: int = field(default=2, metadata={"help": "rarest pair that may be merged"})


class TokenizerTask(Task):
    name = "tokenizer"
    description = "Train a byte-level BPE tokenizer on document text."
    Config = TokenizerConfig

    def run(self, inputs, output: Path, *, workers, steps, restart, progress) -> dict:
        if not restart and (done := self.finished(output, inputs)):
            return done
        if output.exists():
            shutil.rmtree(output)
        started = time.perf_counter()
        cfg = self.config
        report = train_tokenizer(inputs, output, vocab_size=cfg.vocab_size, pretokenize=cfg.pretokenize,
                                 min_frequency=cfg.min_frequency)
        stats = {"stage": self.name, "identity": self.identity(inputs), "records_in": report["documents"],
                 "records_out": report["documents"], "dropped": {}, "counters": {},
                 "tokenizer": {k: report[k] for k in ("vocab_size", "pretokenize", "tokens_per_char",
                                                       "isolated_share", "train_seconds", "warnings")},
                 "wall_seconds": round(time.perf_counter() - started, 3)}
        write_bytes_atomic(output / "stats.json", orjson.dumps(stats, option=orjson.OPT_INDENT_2) + b"\n")
        return stats
