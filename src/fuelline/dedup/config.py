"""The dedup stage's options, apart from the stage so that its phases can take them too.

`fuelline.dedup.stage` hashes with them and `fuelline.dedup.phases` decides with them; both
import this module, neither imports the other's.
"""

from __future__ import annotations

from dataclasses import dataclass

from fuelline.dedup.lsh import choose_bands
from fuelline.dedup.normalize import Normalizer
from fuelline.pipeline.options import option
from fuelline.pipeline.stage import StageConfig


@dataclass
class DedupConfig(StageConfig):
    threshold: float = option(0.85, "Jaccard similarity at which documents are duplicates (between 0 and 1, "
                              "both excluded)")
    method: str = option("minhash", "how near-duplicate candidates are found (both verified by Jaccard): MinHash + "
                         "LSH bands, or 64-bit SimHash within a Hamming distance", choices=["minhash", "simhash"])
    hamming: int | None = option(None, "simhash: most bits a candidate pair may differ in (default: from the "
                                 "threshold, 10 at 0.85)", min=0, max=63)
    blocks: int = option(0, "simhash: blocks of the search tables (0: the fastest for the corpus size); changes time, "
                         "not results", min=0, max=64)
    shingle: str = option("auto", "char n-grams, word n-grams, or auto: char for mostly-CJK documents",
                          choices=["auto", "char", "word"])
    ngram: int = option(5, "shingle length (characters or words)", min=1)
    num_perm: int = option(128, "MinHash permutations", min=1)
    bands: int = option(0, "LSH bands (0: chosen from the threshold)", min=0)
    rows: int = option(0, "LSH rows per band (0: chosen from the threshold)", min=0)
    keep: str = option("first", "which document of a cluster stays", choices=["first", "longest"])
    verify: bool = option(True, "check every candidate pair's true Jaccard similarity")
    seed: int = option(1, "seed of the MinHash hash family")
    compare: str = option("text", "what is compared: the text of document records, or the user turns of chat "
                          "records (regenerated answers are only as varied as the prompts)",
                          choices=["text", "user_turns"])
    lowercase: bool = option(True, "normalization: ignore case")
    ignore_punctuation: bool = option(True, "normalization: ignore punctuation and spaces")

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 < self.threshold < 1.0:  # both ends excluded: beyond what `option(min=, max=)` says
            raise ValueError(f"threshold must be between 0 and 1, not {self.threshold}")
        if (self.bands == 0) != (self.rows == 0):
            raise ValueError("give both bands and rows, or neither")
        if self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands × rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        if self.blocks and not self.max_hamming() < self.blocks <= 64:
            raise ValueError(f"blocks must be more than hamming ({self.max_hamming()}) and at most 64, not {self.blocks}")

    def band_layout(self) -> tuple[int, int]:
        return (self.bands, self.rows) if self.bands else choose_bands(self.threshold, self.num_perm)

    def max_hamming(self) -> int:
        if self.hamming is not None:
            return self.hamming
        from fuelline.dedup.simhash import choose_hamming  # imports numba: ~0.3 s on every CLI start
        return choose_hamming(self.threshold)

    def normalizer(self) -> Normalizer:
        return Normalizer(lowercase=self.lowercase, punctuation=self.ignore_punctuation)
