"""Export to Megatron-LM's indexed dataset, read back with Megatron's own IndexedDataset."""

import subprocess
import sys
import warnings

import numpy as np
import pytest

from fuelline.formats import megatron
from fuelline.formats.megatron import export_megatron
from fuelline.formats.tokens import TokenDatasetWriter, TokenFiles, TokenFormatError

VOCAB = {"uint16": 50_000, "uint32": 151_000}


@pytest.fixture(scope="module")
def IndexedDataset():
    with warnings.catch_warnings():  # megatron-core warns on import that Transformer Engine/Apex are absent
        warnings.simplefilter("ignore")
        module = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    return module.IndexedDataset


def write_dataset(directory, dtype, *, with_mask=False, seed=0):
    """Random documents: an empty one first, a long one in the middle, short ones around them."""
    rng = np.random.default_rng(seed)
    vocab = VOCAB[dtype]
    lengths = [0, *rng.integers(1, 300, 40), 100_000, *rng.integers(0, 50, 30)]
    writer = TokenDatasetWriter(directory, dtype=dtype, vocab_size=vocab, bos_id=None, eos_id=0,
                                tokenizer={}, with_mask=with_mask)
    for part in np.array_split(np.array(lengths), 3):  # several add_documents calls
        ids = rng.integers(0, vocab, int(part.sum()))
        if dtype == "uint32":
            ids[:5] = vocab - 1  # ids above 65,535 must survive
        mask = rng.random(len(ids)) < 0.5 if with_mask else None
        writer.add_documents(ids, part, mask)
    writer.close()
    return TokenFiles(directory)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
@pytest.mark.parametrize("small_blocks", [False, True])
def test_megatron_reads_every_document(tmp_path, monkeypatch, IndexedDataset, dtype, small_blocks):
    if small_blocks:  # exercise the block loops: many documents and bytes per block boundary
        monkeypatch.setattr(megatron, "DOC_BLOCK", 7)
        monkeypatch.setattr(megatron, "COPY_BLOCK", 1000)
    ours = write_dataset(tmp_path / "tokens", dtype)
    prefix = tmp_path / "new" / "dir" / "corpus"  # missing directories are created
    bin_path, idx_path = export_megatron(tmp_path / "tokens", prefix)
    assert (bin_path, idx_path) == (tmp_path / "new/dir/corpus.bin", tmp_path / "new/dir/corpus.idx")

    n = ours.num_documents
    dataset = IndexedDataset(str(prefix))  # mmap
    assert len(dataset) == n
    assert dataset.index.dtype == {"uint16": np.uint16, "uint32": np.int32}[dtype]  # Megatron has no uint32
    lengths = np.diff(ours.offsets.astype(np.int64))
    assert np.array_equal(dataset.sequence_lengths, lengths)
    assert np.array_equal(dataset.document_indices, np.arange(n + 1))
    assert lengths[0] == 0 and lengths.max() == 100_000
    for k in range(n):
        tokens, _ = ours.document(k)
        assert np.array_equal(dataset[k].astype(np.int64), tokens.astype(np.int64)), k
        assert np.array_equal(dataset.get(k), dataset[k])
    assert idx_path.stat().st_size == 42 + 20 * n
    assert bin_path.read_bytes() == (tmp_path / "tokens" / "tokens.bin").read_bytes()
    assert not [p for p in bin_path.parent.iterdir() if p.name.startswith(".")]  # no temp files left


def test_reexport_replaces_both_files(tmp_path, IndexedDataset):
    write_dataset(tmp_path / "a", "uint16", seed=1)
    write_dataset(tmp_path / "b", "uint32", seed=2)
    export_megatron(tmp_path / "a", tmp_path / "out")
    export_megatron(tmp_path / "b", tmp_path / "out")
    dataset = IndexedDataset(str(tmp_path / "out"))
    assert dataset.index.dtype == np.int32
    assert np.array_equal(dataset[3], TokenFiles(tmp_path / "b").document(3)[0])


def test_refusals_name_the_problem(tmp_path, monkeypatch):
    write_dataset(tmp_path / "tokens", "uint16")
    with pytest.raises(ValueError, match="without .bin or .idx"):
        export_megatron(tmp_path / "tokens", tmp_path / "out.bin")
    with pytest.raises(ValueError, match="file of the token dataset itself"):
        export_megatron(tmp_path / "tokens", tmp_path / "tokens" / "docs")
    monkeypatch.setattr(megatron, "MAX_LENGTH", 50_000)  # stands in for int32's limit
    with pytest.raises(ValueError, match="document 41 has 100,000 tokens"):
        export_megatron(tmp_path / "tokens", tmp_path / "out")
    assert not list(tmp_path.glob("out*"))  # checked before anything is written

    empty = TokenDatasetWriter(tmp_path / "empty", dtype="uint16", vocab_size=100, bos_id=None, eos_id=None,
                               tokenizer={}, with_mask=False)
    empty.close()
    with pytest.raises(TokenFormatError, match="holds no tokens"):
        export_megatron(tmp_path / "empty", tmp_path / "out")


def test_a_damaged_token_dataset_is_refused_not_copied(tmp_path):
    """Issue 36 class 4: every reader of a token dataset checks it (a changed id below vocab_size passes
    the opening checks)."""
    write_dataset(tmp_path / "tokens", "uint16")
    tokens = bytearray((tmp_path / "tokens" / "tokens.bin").read_bytes())
    tokens[100] ^= 1
    (tmp_path / "tokens" / "tokens.bin").write_bytes(bytes(tokens))
    with pytest.raises(TokenFormatError, match=r"tokens\.bin: checksum mismatch"):
        export_megatron(tmp_path / "tokens", tmp_path / "out")
    assert not list(tmp_path.glob("out*"))
    export_megatron(tmp_path / "tokens", tmp_path / "out", verify=False)  # when the caller has checked it


def fuelline(*args):
    return subprocess.run([sys.executable, "-m", "fuelline.cli", *args], capture_output=True, text=True)


def test_cli_exports_and_says_the_mask_is_dropped(tmp_path, IndexedDataset):
    ours = write_dataset(tmp_path / "tokens", "uint32", with_mask=True)
    result = fuelline("export", "megatron", str(tmp_path / "tokens"), "--output", str(tmp_path / "mg" / "train"))
    assert result.returncode == 0, result.stderr
    assert f"{ours.num_documents:,} documents" in result.stdout
    assert "loss mask was not exported" in result.stdout
    dataset = IndexedDataset(str(tmp_path / "mg" / "train"))
    assert np.array_equal(dataset[41], ours.document(41)[0])

    (tmp_path / "not_tokens").mkdir()
    failed = fuelline("export", "megatron", str(tmp_path / "not_tokens"), "-o", str(tmp_path / "x"))
    assert failed.returncode == 2
    assert "error:" in failed.stderr and "no manifest.json" in failed.stderr
    assert "Traceback" not in failed.stderr
