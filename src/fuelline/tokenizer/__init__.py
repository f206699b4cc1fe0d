"""Tokenizers: BPE training on content text, and conversion of tiktoken vocabularies."""
