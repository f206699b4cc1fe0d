"""The dedup stage's options, apart from the stage so that its phases can take them too.

`fuelline.dedup.stage` hashes with them and `fuelline.dedup.phases` decides with them; both
import this module, neither imports the other's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fuelline.dedup.lsh import choose_bands
from fuelline.dedup.normalize import Normalizer
from fuelline.pipeline.stage import StageConfig


@dataclass
class DedupConfig(StageConfig):
    threshold: float = field(default=0.85, metadata={"help": "Jaccard similarity at which documents are duplicates"})
    method: str = field(default="minhash", metadata={
        "help": "how near-duplicate candidates are found (both verified by Jaccard): MinHash + LSH bands, or "
                "64-bit SimHash within a Hamming distance", "choices": ["minhash", "simhash"]})
    hamming: int | None = field(default=None, metadata={
        "help": "simhash: most bits a candidate pair may differ in (default: from the threshold, 10 at 0.85)",
        "min": 0, "max": 63})
    blocks: int = field(default=0, metadata={
        "help": "simhash: blocks of the search tables (0: the fastest for the corpus size); changes time, not results", "min": 0, "max": 64})
    shingle: str = field(default="auto", metadata={
        "help": "char n-grams, word n-grams, or auto: char for mostly-CJK documents", "choices": ["auto", "char", "word"]})
    ngram: int = field(default=5, metadata={"help": "shingle length (characters or words)", "min": 1})
    num_perm: int = field(default=128, metadata={"help": "MinHash permutations", "min": 1})
    bands: int = field(default=0, metadata={"help": "LSH bands (0: chosen from the threshold)", "min": 0})
    rows: int = field(default=0, metadata={"help": "LSH rows per band (0: chosen from the threshold)", "min": 0})
    keep: str = field(default="first", metadata={"help": "which document of a cluster stays", "choices": ["first", "longest"]})
    verify: bool = field(default=True, metadata={"help": "check every candidate pair's true Jaccard similarity"})
    seed: int = field(default=1, metadata={"help": "seed of the MinHash hash family"})
    compare: str = field(default="text", metadata={
        "help": "what is compared: the text of document records, or the user turns of chat records "
                "(regenerated answers are only as varied as the prompts)", "choices": ["text", "user_turns"]})
    lowercase: bool = field(default=True, metadata={"help": "normalization: ignore case"})
    ignore_punctuation: bool = field(default=True, metadata={"help": "normalization: ignore punctuation and spaces"})

    def __post_init__(self):
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be between 0 and 1, not {self.threshold}")
        if (self.bands == 0) != (self.rows == 0):
            raise ValueError("give both bands and rows, or neither")
        if self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands × rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        if self.shingle not in ("auto", "char", "word") or self.keep not in ("first", "longest"):
            raise ValueError("shingle must be auto, char or word; keep must be first or longest")
        if self.compare not in ("text", "user_turns"):
            raise ValueError(f"compare must be text or user_turns, not {self.compare!r}")
        if self.method not in ("minhash", "simhash"):
            raise ValueError(f"method must be minhash or simhash, not {self.method!r}")
        if self.hamming is not None and not 0 <= self.hamming < 64:
            raise ValueError(f"hamming must be between 0 and 63, not {self.hamming}")
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
