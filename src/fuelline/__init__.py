"""fuelline: raw text and chat corpora to training-ready binary data for LLMs."""

__version__ = "0.1.0"
