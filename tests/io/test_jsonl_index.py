import os
import pickle
import struct
import subprocess
import sys
import textwrap
import warnings

import orjson
import pytest
import zstandard

from fuelline.io import JsonlIndex, jsonl_index, read_records
from fuelline.io.jsonl_index import IndexCacheWarning

from ..conftest import shared_file


@pytest.fixture(scope="module")
def gsm8k_plain(tmp_path_factory):
    """A decompressed copy of the real gsm8k file (JsonlIndex needs plain bytes)."""
    source = shared_file("chat/gsm8k-train.jsonl.zst")
    target = tmp_path_factory.mktemp("gsm8k") / "gsm8k-train.jsonl"
    with open(source, "rb") as f, open(target, "wb") as out:
        zstandard.ZstdDecompressor().copy_stream(f, out)
    return target


def test_every_record_matches_a_sequential_read(gsm8k_plain):
    sequential = list(read_records(gsm8k_plain))
    index = JsonlIndex(gsm8k_plain)
    assert len(index) == len(sequential) == 7_473
    for k, record in enumerate(sequential):
        assert index[k] == record
    assert index[-1] == sequential[-1]
    with pytest.raises(IndexError):
        index[len(sequential)]


def test_pickled_index_reopens_lazily(gsm8k_plain):
    index = JsonlIndex(gsm8k_plain)
    first = index[0]  # opens the mmap, which must not travel in the pickle
    clone = pickle.loads(pickle.dumps(index))
    assert clone._handles == [None]
    assert clone[0] == first and clone[4321] == index[4321]


def test_cache_is_reused_and_rebuilt_when_the_file_changes(tmp_path, monkeypatch):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"k": 0}\n{"k": 1}\n')
    scans = []
    real_scan = jsonl_index.scan_line_offsets
    monkeypatch.setattr(jsonl_index, "scan_line_offsets", lambda p: scans.append(p) or real_scan(p))
    assert len(JsonlIndex(path)) == 2
    assert len(JsonlIndex(path)) == 2
    assert len(scans) == 1  # the second open read the cache
    with open(path, "ab") as f:
        f.write(b'{"k": 2}\n')
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    index = JsonlIndex(path)
    assert len(scans) == 2
    assert [index[k]["k"] for k in range(len(index))] == [0, 1, 2]


def test_a_file_changed_after_indexing_is_refused_not_misread(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"k": 0}\n')
    index = pickle.loads(pickle.dumps(JsonlIndex(path)))
    path.write_bytes(b'{"k": 0}\n{"k": 1}\n')
    with pytest.raises(RuntimeError, match="file changed since it was indexed"):
        index[0]


def test_blank_lines_are_not_records_and_files_are_concatenated_in_order(tmp_path):
    a, b, empty = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "empty.jsonl"
    a.write_bytes(b'\n{"k": 0}\r\n  \n\n{"k": 1}')  # leading blank, CRLF, whitespace line, no final newline
    empty.write_bytes(b"")
    b.write_bytes(b'{"k": 2}\n\t\n')
    index = JsonlIndex([a, empty, b])
    assert [index[k]["k"] for k in range(len(index))] == [0, 1, 2]
    assert len(JsonlIndex(empty)) == 0


def test_blank_detection_across_scan_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl_index, "SCAN_BLOCK", 16)
    records = [{"k": i, "pad": "x" * (i % 23)} for i in range(200)]
    lines = []
    for i, r in enumerate(records):
        lines.append(orjson.dumps(r))
        if i % 7 == 0:
            lines.append(b" " * (i % 19))  # blank lines of many lengths, some crossing blocks
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    index = JsonlIndex(path)
    assert [index[k] for k in range(len(index))] == records


def test_compressed_files_get_a_clear_error(tmp_path):
    path = tmp_path / "d.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"k": 0}\n'))
    with pytest.raises(ValueError, match=r"needs a plain \.jsonl file.*zstd -d"):
        JsonlIndex(path)


def _records(n: int) -> bytes:
    return b"".join(orjson.dumps({"k": k, "text": "x" * (k % 97)}) + b"\n" for k in range(n))


@pytest.mark.parametrize("when", ["after the first read", "before the first read"])
def test_a_file_truncated_after_indexing_is_a_clear_error_not_sigbus(tmp_path, when):
    """In a subprocess: a SIGBUS (an mmap read past the new end) would kill it, not pytest."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(_records(2_000))  # ~130 KB: the last record is many pages past the cut
    script = textwrap.dedent(f"""
        import os
        from fuelline.io import JsonlIndex
        index = JsonlIndex({str(path)!r}, cache_dir={str(tmp_path / "cache")!r})
        if {when == "after the first read"!r}:
            assert index[0] == {{"k": 0, "text": ""}}
        os.truncate({str(path)!r}, 100)
        try:
            index[len(index) - 1]
        except RuntimeError as e:
            print("refused:", e)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, f"exit {result.returncode} (-7 is SIGBUS): {result.stderr}"
    size = len(_records(2_000))
    assert f"refused: {path}: file changed since it was indexed (size 100, was {size:,}): re-open the JsonlIndex " \
           "to re-index it" in result.stdout


def test_a_file_modified_in_place_after_indexing_is_refused(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"k": 0}\n{"k": 1}\n')
    index = JsonlIndex(path, cache_dir=tmp_path / "cache")
    path.write_bytes(b'{"k": 7}\n{"k": 8}\n')  # same size
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    with pytest.raises(jsonl_index.FileChangedError, match=r"file changed since it was indexed \(same size, "
                                                            r"modified since\)"):
        index[1]


def _corrupt(cache, how: str) -> None:
    data = bytearray(cache.read_bytes())
    if how == "a flipped offset byte":
        data[jsonl_index.CACHE_HEADER.size + 37] ^= 0x10
    elif how == "a flipped count byte":
        data[24] ^= 0x01  # n - 1 or n + 1 records: once silently a shorter index
    elif how == "a flipped checksum byte":
        data[40] ^= 0xFF
    elif how == "truncated":
        data = data[:-16]
    elif how == "truncated and the count lowered to match":
        n = int.from_bytes(data[24:32], "little")
        data[24:32] = (n - 1).to_bytes(8, "little")
        data = data[:-16]
    elif how == "only a header":
        data = data[:jsonl_index.CACHE_HEADER.size]
    elif how == "short header":
        data = data[:20]
    elif how == "empty":
        data = bytearray()
    elif how == "the old format":
        data = bytearray(struct.pack("<8sQqQ", b"FLJSIDX1", *struct.unpack("<QqQ", data[8:32]))) + \
            data[jsonl_index.CACHE_HEADER.size:]
    if how == "a directory":
        cache.unlink()
        cache.mkdir()
        (cache / "something").write_bytes(b"x")
    else:
        cache.write_bytes(bytes(data))


CACHE_DAMAGE = ["a flipped offset byte", "a flipped count byte", "a flipped checksum byte", "truncated",
                "truncated and the count lowered to match", "only a header", "short header", "empty",
                "the old format", "a directory"]


@pytest.mark.parametrize("how", CACHE_DAMAGE)
def test_a_damaged_cache_falls_back_to_a_full_index(tmp_path, monkeypatch, how):
    path, cache_dir = tmp_path / "d.jsonl", tmp_path / "cache"
    path.write_bytes(_records(300))
    expected = list(read_records(path))
    scans = []
    real_scan = jsonl_index.scan_line_offsets
    monkeypatch.setattr(jsonl_index, "scan_line_offsets", lambda p: scans.append(p) or real_scan(p))
    assert len(JsonlIndex(path, cache_dir=cache_dir)) == 300
    cache = jsonl_index._cache_path(path, cache_dir)
    _corrupt(cache, how)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        index = JsonlIndex(path, cache_dir=cache_dir)
    assert len(scans) == 2  # the damaged cache was not used
    if how == "a directory":  # the fallback is silent, but a cache that cannot be written again is said
        assert [w.category for w in caught] == [jsonl_index.IndexCacheWarning]
        assert str(caught[0].message).startswith(f"{cache}: cannot cache a JSONL line index here (its path is taken")
    else:
        assert not caught, [str(w.message) for w in caught]  # the fallback is silent
    assert len(index) == 300 and [index[k] for k in range(300)] == expected
    assert [p.name for p in cache_dir.iterdir()] == [cache.name]  # no temp file left behind
    if how == "a directory":
        assert cache.is_dir()  # left alone: not cached, not crashed
    else:
        assert len(JsonlIndex(path, cache_dir=cache_dir)) == 300 and len(scans) == 2  # replaced with a good cache


def test_an_unusable_cache_directory_only_costs_a_rescan(tmp_path):
    path, not_a_directory = tmp_path / "d.jsonl", tmp_path / "cache"
    path.write_bytes(_records(10))
    not_a_directory.write_bytes(b"a file where the cache directory should be")
    for cache_dir in (not_a_directory, not_a_directory / "sub"):
        with pytest.warns(IndexCacheWarning, match="cannot cache a JSONL line index here"):
            assert [JsonlIndex(path, cache_dir=cache_dir)[k]["k"] for k in range(10)] == list(range(10))


def test_a_cache_that_cannot_be_written_is_said_once_with_its_reason(tmp_path):
    path, not_a_directory = tmp_path / "d.jsonl", tmp_path / "cache"
    path.write_bytes(_records(10))
    not_a_directory.write_bytes(b"a file where the cache directory should be")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        indexes = [JsonlIndex(path, cache_dir=not_a_directory) for _ in range(3)]
    assert all([index[k]["k"] for k in range(10)] == list(range(10)) for index in indexes)
    (warning,) = caught  # once for the directory, not once per open
    assert warning.category is jsonl_index.IndexCacheWarning
    message = str(warning.message)
    assert message.startswith(f"{jsonl_index._cache_path(path, not_a_directory)}: cannot cache a JSONL line index")
    assert f"(File exists: {not_a_directory})" in message and "scans it again" in message
