import os
import pickle

import orjson
import pytest
import zstandard

from fuelline.io import JsonlIndex, read_records
from fuelline.io import jsonl_index

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
    assert clone._maps == [None]
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
