"""Text normalization before hashing: what two documents may differ in and still be "the same".

Each step is a C-level string operation (one regex, unicodedata, str.lower): about 3 µs for a
poem. It runs once per document and feeds both the exact key and the shingles.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

NON_WORD = re.compile(r"[\W_]+")  # punctuation, symbols and whitespace, in any script
WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Normalizer:
    unicode: bool = True  # NFKC: full-width letters, compatibility ideographs
    lowercase: bool = True
    punctuation: bool = True  # remove punctuation, symbols and whitespace
    whitespace: bool = True  # collapse whitespace to nothing (only if punctuation is kept)

    def __call__(self, text: str) -> str:
        # Removing punctuation first leaves mostly text that is already NFKC-normal (Han
        # characters are), so the cheap is_normalized check usually spares the 8 µs normalize.
        if self.punctuation:
            text = NON_WORD.sub("", text)
        elif self.whitespace:
            text = WHITESPACE.sub("", text)
        if self.unicode and not unicodedata.is_normalized("NFKC", text):
            text = unicodedata.normalize("NFKC", text)
            if self.punctuation:  # NFKC can turn a letter-like compatibility character into a symbol
                text = NON_WORD.sub("", text)
        return text.lower() if self.lowercase else text
