"""The tokenizer as a pipeline step: train on the documents of the step before."""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from fuelline.io.atomic import write_bytes_atomic
from fuelline.pipeline.options import option
from fuelline.pipeline.task import Task
from fuelline.tokenizer.train import PRETOKENIZE, train_tokenizer


@dataclass
class TokenizerConfig:
    """The options of `fuelline tokenizer train` and of a pipeline's tokenizer step."""

    vocab_size: int = option(4096, "tokens in the vocabulary, merges included")
    pretokenize: str = option("han-chars", "how text is cut before BPE merges: han-chars, every Han character a "
                              "token of its own (merges only inside other scripts); han-pairs, at most two Han "
                              "characters per token; bytelevel, GPT-2's rule (a whole run of Han characters may "
                              "merge)", choices=list(PRETOKENIZE))
    min_frequency: int = option(2, "a pair must occur this often to become a merge")


class TokenizerTask(Task):
    name = "tokenizer"
    description = "Train a byte-level BPE tokenizer on the text of document records (never on metadata)."
    Config = TokenizerConfig

    def run(self, inputs, output: Path, *, workers, steps, restart, progress) -> dict:
        if not restart and (done := self.finished(output, inputs)):
            return done
        if output.exists():
            shutil.rmtree(output)
        started = time.perf_counter()
        report = train_tokenizer(inputs, output, **asdict(self.config))
        stats = {"stage": self.name, "identity": self.identity(inputs), "records_in": report["documents"],
                 "records_out": report["documents"], "dropped": {}, "counters": {},
                 "tokenizer": {k: report[k] for k in ("vocab_size", "pretokenize", "tokens_per_char",
                                                       "isolated_share", "train_seconds", "warnings")},
                 "wall_seconds": round(time.perf_counter() - started, 3)}
        write_bytes_atomic(output / "stats.json", orjson.dumps(stats, option=orjson.OPT_INDENT_2) + b"\n")
        return stats
