"""The real Qwen vocabulary as `tokenizers` and as transformers load it, for the template tests."""

import pytest
import tokenizers


@pytest.fixture(scope="module")
def qwen(qwen_dir):
    return tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf(qwen_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(qwen_dir, local_files_only=True)
