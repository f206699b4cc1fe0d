"""A token dataset that lies or is damaged is refused with a TokenFormatError naming the file (and,
for the manifest, the field), by `verify_token_dataset` and by the loader alike; never a raw
traceback, never wrong data handed on without an error (issue 15, class 2)."""

import shutil
import tempfile
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fuelline.formats.tokens import (
    MANIFEST,
    MASK,
    OFFSETS,
    TOKENS,
    TokenDatasetWriter,
    TokenFiles,
    TokenFormatError,
    sha256_file,
    verify_token_dataset,
)

torch = pytest.importorskip("torch")
from fuelline.loader import TokenDataset

VOCAB = 1_000
SEQ_LEN = 8


def write_dataset(directory: Path, *, with_mask: bool = True, seed: int = 0, documents: int = 40) -> Path:
    """Random documents through the real writer (an empty one among them), uint16, 1,000 ids."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, documents)
    lengths[3] = 0
    ids = rng.integers(0, VOCAB, int(lengths.sum()))
    mask = rng.random(len(ids)) < 0.7 if with_mask else None
    writer = TokenDatasetWriter(directory, dtype="uint16", vocab_size=VOCAB, bos_id=0, eos_id=1,
                                tokenizer={"fingerprint": "synthetic"}, with_mask=with_mask)
    half = int(lengths[:20].sum())
    writer.add_documents(ids[:half], lengths[:20], None if mask is None else mask[:half])
    writer.add_documents(ids[half:], lengths[20:], None if mask is None else mask[half:])
    writer.close()
    return directory


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("tokens") / "ok")


@pytest.fixture
def copy(original, tmp_path) -> Path:
    return Path(shutil.copytree(original, tmp_path / "copy"))


def read_manifest_json(directory: Path):
    return orjson.loads((directory / MANIFEST).read_bytes())


def write_manifest_json(directory: Path, manifest) -> None:
    (directory / MANIFEST).write_bytes(orjson.dumps(manifest))


def refresh_checksum(directory: Path, name: str) -> None:
    """Record a damaged file's new sha256, so that only the check under test can catch it."""
    manifest = read_manifest_json(directory)
    manifest["files"][name]["sha256"] = sha256_file(directory / name)
    write_manifest_json(directory, manifest)


def every_reader_refuses(directory: Path, match: str) -> None:
    """verify, TokenFiles and TokenDataset (plain and compact) all raise TokenFormatError matching."""
    with pytest.raises(TokenFormatError, match=match):
        verify_token_dataset(directory)
    with pytest.raises(TokenFormatError, match=match):
        TokenFiles(directory)
    for compact in (False, True):
        with pytest.raises(TokenFormatError, match=match):
            TokenDataset(directory, SEQ_LEN, compact=compact)


def test_the_undamaged_dataset_passes(original):
    assert verify_token_dataset(original)["num_documents"] == 40
    dataset = TokenDataset(original, SEQ_LEN, document_aware=True)
    batch = dataset.__getitems__(list(range(len(dataset))))
    assert int(batch["input_ids"].max()) < VOCAB


def test_a_null_mask_with_mask_bin_listed_is_refused(copy):
    """The lie of issue 15: verify said ok and the loader trained on every masked token."""
    manifest = read_manifest_json(copy)
    manifest["mask"] = None
    write_manifest_json(copy, manifest)
    every_reader_refuses(copy, r"manifest\.json: field mask: expected an object describing mask\.bin, "
                               r"which field files lists, found null")


def test_a_mask_bin_the_manifest_does_not_describe_is_refused(copy):
    manifest = read_manifest_json(copy)
    manifest["mask"] = None
    del manifest["files"][MASK]
    write_manifest_json(copy, manifest)
    every_reader_refuses(copy, r"mask\.bin: present, but the field mask of manifest\.json is null")


def test_rewriting_without_a_mask_removes_the_stale_mask_bin(copy):
    write_dataset(copy, with_mask=False, seed=1)
    assert not (copy / MASK).exists()
    assert verify_token_dataset(copy)["mask"] is None
    assert TokenDataset(copy, SEQ_LEN)[0]["labels"].min() >= 0  # nothing masked


def _set(path: str, value):
    """A change setting the field at "a/b/c" (file names hold dots)."""
    def change(manifest):
        *parents, last = path.split("/")
        target = manifest
        for key in parents:
            target = target[key]
        target[last] = value
        return manifest
    return change


def _delete(path: str):
    def change(manifest):
        *parents, last = path.split("/")
        target = manifest
        for key in parents:
            target = target[key]
        del target[last]
        return manifest
    return change


MANIFEST_DAMAGE = {
    "null manifest": (lambda m: None, r"expected a JSON object at the top level, found null"),
    "a list manifest": (lambda m: [m], r"expected a JSON object at the top level, found a list"),
    "missing mask": (_delete("mask"), r"field mask: expected null or an object, found nothing \(the field is missing\)"),
    "missing files": (_delete("files"), r"field files: expected an object, found nothing"),
    "missing num_documents": (_delete("num_documents"), (r"field num_documents: expected an integer of at least 0, "
                                                        r"found nothing")),
    "string count": (_set("num_tokens", "1234"), (r"field num_tokens: expected an integer of at least 0, found the "
                                                 r"string '1234'")),
    "float count": (_set("num_documents", 40.0), (r"field num_documents: expected an integer of at least 0, found "
                                                 r"the number 40\.0")),
    "boolean count": (_set("num_documents", True), r"field num_documents: .* found the boolean true"),
    "negative count": (_set("num_tokens", -8), (r"field num_tokens: expected an integer of at least 0, found the "
                                               r"integer -8")),
    "list dtype": (_set("dtype", ["uint16"]), r"field dtype: expected 'uint16' or 'uint32', found a list of 1 items"),
    "unknown dtype": (_set("dtype", "int8"), r"field dtype: expected 'uint16' or 'uint32', found the string 'int8'"),
    "wrong format": (_set("format", "other"), r"field format: expected 'fuelline.tokens', found the string 'other'"),
    "future version": (_set("version", 2), r"field version: expected 1, found the integer 2"),
    "float version": (_set("version", 1.0), r"field version: expected 1, found the number 1\.0"),
    "vocabulary too large for the dtype": (_set("vocab_size", 70_000), (r"field vocab_size: expected an integer from "
                                                                        r"1 to 65,536, found the integer 70000")),
    "string vocabulary": (_set("vocab_size", "1000"), r"field vocab_size: .* found the string '1000'"),
    "bos outside the vocabulary": (_set("bos_id", 1_000), (r"field bos_id: expected null or an integer from 0 to "
                                                           r"999, found the integer 1000")),
    "tokenizer not an object": (_set("tokenizer", "x"), r"field tokenizer: expected an object"),
    "missing config": (_delete("config"), r"field config: expected an object, found nothing"),
    "mask of another kind": (_set("mask/kind", "bytes"), r"field mask\.kind: expected 'bits'"),
    "more supervised tokens than tokens": (_set("mask/supervised_tokens", 10**9),
                                           r"field mask\.supervised_tokens: expected an integer from 0 to"),
    "num_tokens disagreeing with the sizes": (lambda m: m.update(num_tokens=m["num_tokens"] + 1) or m,
                                              (r"field files\.tokens\.bin\.size: expected [\d,]+ \(num_tokens × 2 "
                                              r"bytes\), found the integer")),
    "a size as a string": (lambda m: m["files"][OFFSETS].update(size=str(m["files"][OFFSETS]["size"])) or m,
                           r"field files\.docs\.idx\.size: expected 328 .* found the string '328'"),
    "missing tokens.bin entry": (_delete(f"files/{TOKENS}"), (r"field files\.tokens\.bin: expected an object, found "
                                                             r"nothing")),
    "a checksum that is not one": (_set(f"files/{TOKENS}/sha256", 5), (r"field files\.tokens\.bin\.sha256: expected "
                                                                      r"64 lowercase hex digits, found the integer 5")),
    "an upper-case checksum": (lambda m: m["files"][MASK].update(sha256=m["files"][MASK]["sha256"].upper()) or m,
                               r"field files\.mask\.bin\.sha256: expected 64 lowercase hex digits"),
    "an unknown file": (lambda m: m["files"].update({"../etc/passwd": {"size": 1, "sha256": "0" * 64}}) or m,
                        r"field files\.\.\./etc/passwd: not a file of this dataset"),
}


@pytest.mark.parametrize("damage", list(MANIFEST_DAMAGE))
def test_a_damaged_manifest_is_a_format_error_naming_the_field(copy, damage):
    change, message = MANIFEST_DAMAGE[damage]
    manifest = read_manifest_json(copy)
    write_manifest_json(copy, change(manifest))
    every_reader_refuses(copy, rf"manifest\.json: {message}")


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"null\n", b"42"])
def test_an_unreadable_manifest_is_a_format_error(copy, content):
    (copy / MANIFEST).write_bytes(content)
    every_reader_refuses(copy, r"manifest\.json: ")


def test_a_directory_at_the_manifest_path_is_a_format_error(copy):
    (copy / MANIFEST).unlink()
    (copy / MANIFEST).mkdir()
    every_reader_refuses(copy, r"manifest\.json: cannot be read")


def test_a_directory_at_a_data_file_path_is_a_format_error(copy):
    (copy / TOKENS).unlink()
    (copy / TOKENS).mkdir()
    every_reader_refuses(copy, r"tokens\.bin: not a regular file")


@pytest.mark.parametrize("damage, message", [
    ("swap", r"docs\.idx: offsets decrease at document 9 \(from \d+ to \d+\)"),
    ("first", r"docs\.idx: the first offset is 5, expected 0"),
    ("last", r"docs\.idx: the last offset is [\d,]+, expected num_tokens [\d,]+ from manifest\.json"),
    ("beyond", r"docs\.idx: offsets decrease at document 20"),  # one offset far past num_tokens
])
def test_non_monotonic_offsets_are_refused_at_open(copy, damage, message):
    offsets = np.fromfile(copy / OFFSETS, dtype="<u8")
    if damage == "swap":
        offsets[9], offsets[10] = offsets[10], offsets[9]
    elif damage == "first":
        offsets[0] = 5
    elif damage == "last":
        offsets[-1] -= 1
    else:
        offsets[20] = 2**40
    offsets.tofile(copy / OFFSETS)
    refresh_checksum(copy, OFFSETS)  # only the open check stands between this and the model
    every_reader_refuses(copy, message)


def test_an_id_beyond_the_vocabulary_is_an_error_from_the_loader_not_data(copy):
    tokens = np.fromfile(copy / TOKENS, dtype="<u2")
    bad = 8 * 30 + 3  # window 30, position 3
    tokens[bad] = 4_321
    tokens.tofile(copy / TOKENS)
    refresh_checksum(copy, TOKENS)
    with pytest.raises(TokenFormatError, match=r"token id 4321 >= vocab_size 1000 \(from manifest\.json\)"):
        verify_token_dataset(copy)
    for compact in (False, True):
        dataset = TokenDataset(copy, SEQ_LEN, compact=compact)
        dataset.__getitems__([29, 31, 0])  # windows without the bad id are fine
        expected = (r"tokens\.bin: token id 4,321 at token 243 \(window 30, position 3\) is not below vocab_size "
                    r"1,000 \(manifest\.json\)")
        with pytest.raises(TokenFormatError, match=expected):
            dataset.__getitems__([29, 30, 31])
        with pytest.raises(TokenFormatError, match=expected):
            dataset[30]


def test_indices_past_the_end_are_index_errors_before_any_read(original):
    dataset = TokenDataset(original, SEQ_LEN)
    n = len(dataset)
    last = dataset[n - 1]["input_ids"]
    assert torch.equal(dataset.__getitems__([-1])["input_ids"][0], last)  # negative counts from the end
    assert torch.equal(dataset[-1]["input_ids"], last)
    for bad in (n, n + 1, -n - 1, 10**6, 2**40, 2**62, 2**70, -(2**70)):
        with pytest.raises(IndexError, match=rf"window {bad} out of range \({n:,} windows\)"):
            dataset.__getitems__([0, bad])
        with pytest.raises(IndexError, match=rf"window {bad} out of range"):
            dataset[bad]
    with pytest.raises(IndexError, match=rf"window {n} out of range"):
        dataset.__getitems__(np.array([0, n], dtype=np.uint64))
    with pytest.raises(IndexError, match=rf"window {2**64 - 1} out of range"):
        dataset.__getitems__(np.array([2**64 - 1], dtype=np.uint64))
    with pytest.raises(TypeError):
        dataset.__getitems__([1.5])
    with pytest.raises(TypeError):
        dataset.__getitems__([[0, 1]])
    assert dataset.__getitems__([])["input_ids"].shape == (0, SEQ_LEN)
    assert torch.equal(dataset.__getitems__(torch.tensor([n - 1]))["input_ids"][0], last)


def test_a_worker_that_finds_the_dataset_changed_refuses_it(original, tmp_path):
    import pickle

    directory = Path(shutil.copytree(original, tmp_path / "d"))
    dataset = pickle.loads(pickle.dumps(TokenDataset(directory, SEQ_LEN)))  # as a DataLoader worker gets it
    write_dataset(directory, documents=10)  # fewer tokens: windows past the new end would be read
    with pytest.raises(TokenFormatError, match=r"changed since this dataset was opened \([\d,]+ windows then, "
                                               r"[\d,]+ now\)"):
        dataset[len(dataset) - 1]


# Fuzzing: truncations and flipped bytes of each file. Every case ends in a TokenFormatError naming
# the damaged file, or in data equal to the original. What each reader guarantees:
# - verify_token_dataset: any change to tokens.bin, docs.idx or mask.bin is an error naming that
#   file (sizes, then sha256); a manifest change is an error mentioning manifest.json unless it
#   leaves the data as it was (a tokenizer fingerprint, bos_id or config edit is not detectable:
#   the manifest has no checksum of itself).
# - the loader (no checksums, nothing read up front): truncations, any manifest damage that
#   changes the data, offsets out of order or out of range, and ids >= vocab_size are errors; an
#   id changed to another id below vocab_size, an offset moved between its neighbours or a
#   flipped mask bit are not detectable without checksums, so the loader guarantees only that
#   ids are below vocab_size and the offsets in order; `fuelline verify` catches the rest.

FUZZ = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def _load_all(directory: Path) -> dict:
    dataset = TokenDataset(directory, SEQ_LEN, document_aware=True)
    batch = dataset.__getitems__(list(range(len(dataset))))
    files = dataset.files
    mask = files.mask(0, files.num_tokens)
    return {"input_ids": batch["input_ids"].numpy(), "labels": batch["labels"].numpy(),
            "position_ids": batch["position_ids"].numpy(), "offsets": np.asarray(files.offsets).copy(),
            "mask": None if mask is None else mask.copy(), "vocab_size": dataset.vocab_size}


@pytest.fixture(scope="module")
def reference(original) -> dict:
    return _load_all(original)


def _damage(directory: Path, name: str, data: st.DataObject) -> None:
    path = directory / name
    content = bytearray(path.read_bytes())
    if data.draw(st.booleans(), label="truncate"):
        path.write_bytes(bytes(content[:data.draw(st.integers(0, len(content) - 1), label="keep")]))
    else:
        where = data.draw(st.integers(0, len(content) - 1), label="byte")
        content[where] ^= data.draw(st.integers(1, 255), label="xor")
        path.write_bytes(bytes(content))


def _names(error: TokenFormatError, name: str) -> bool:
    return name in str(error)


@pytest.mark.parametrize("name", [MANIFEST, OFFSETS, MASK, TOKENS])
@FUZZ
@given(data=st.data())
def test_fuzzed_files_give_a_format_error_or_the_original_data(original, reference, name, data):
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(shutil.copytree(original, Path(tmp) / "d"))
        _damage(directory, name, data)

        try:
            verify_token_dataset(directory)
            verified = True
        except TokenFormatError as error:
            assert _names(error, name), str(error)
            verified = False
        if name != MANIFEST:
            assert not verified, "a changed data file passed verify"

        try:
            loaded = _load_all(directory)
        except TokenFormatError as error:
            assert _names(error, name), str(error)
            event("the loader refused it")
            return
        event("the loader read it" + (", verify passed" if verified else ""))
        assert int(loaded["input_ids"].max()) < reference["vocab_size"]
        offsets = loaded["offsets"]
        assert offsets[0] == 0 and np.all(np.diff(offsets.astype(np.int64)) >= 0)
        if name == MANIFEST:  # loaded without an error: the data must be the original
            for key in ("input_ids", "labels", "position_ids", "offsets", "mask"):
                assert np.array_equal(loaded[key], reference[key]), key
        elif name == OFFSETS:  # an offset moved between its neighbours: tokens and labels as they were
            assert np.array_equal(loaded["input_ids"], reference["input_ids"])
            assert np.array_equal(loaded["labels"], reference["labels"])
        elif name == MASK:  # a flipped mask bit: the ids as they were
            assert np.array_equal(loaded["input_ids"], reference["input_ids"])
        else:  # a changed id below vocab_size: everything else as it was
            assert np.array_equal(loaded["offsets"], reference["offsets"])
            assert np.array_equal(loaded["mask"], reference["mask"])
