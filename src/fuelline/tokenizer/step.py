"""The tokenizer as a pipeline step: train on the documents of the step before."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from fuelline.pipeline.options import Options, option
from fuelline.pipeline.stats import StepStats
from fuelline.pipeline.step import Step
from fuelline.pipeline.workers import RunOptions
from fuelline.tokenizer.train import MIN_VOCAB_SIZE, PRETOKENIZE, TOKENIZER_FILES, TRAINING_REPORT, train_tokenizer


@dataclass
class TokenizerConfig(Options):
    """The options of `fuelline tokenizer train` and of a pipeline's tokenizer step."""

    vocab_size: int = option(4096, "tokens in the vocabulary, merges included", min=MIN_VOCAB_SIZE,
                             max=(1 << 31) - 1)
    pretokenize: str = option("han-chars", "how text is cut before BPE merges: han-chars, every Han character a "
                              "token of its own (merges only inside other scripts); han-pairs, at most two Han "
                              "characters per token; bytelevel, GPT-2's rule (a whole run of Han characters may "
                              "merge)", choices=list(PRETOKENIZE))
    min_frequency: int = option(2, "a pair must occur this often to become a merge", min=1)


class TokenizerStep(Step):
    """Train a byte-level BPE tokenizer on the text of document records (never on metadata)."""

    name, Config = "tokenizer", TokenizerConfig
    writes = (*TOKENIZER_FILES, TRAINING_REPORT)

    def run(self, inputs, output: Path, options: RunOptions, steps) -> dict:
        return self.work_dir(output, inputs).run_once(lambda: self._train(inputs, output), restart=options.restart)

    def _train(self, inputs, output: Path) -> StepStats:
        report = train_tokenizer(inputs, output, **asdict(self.config))
        return StepStats(self.name, report["documents"], report["documents"], details={"tokenizer": {
            k: report[k] for k in ("vocab_size", "pretokenize", "tokens_per_char", "isolated_share", "train_seconds",
                                   "warnings")}})
