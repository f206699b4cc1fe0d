import bz2
import gzip
import lzma

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from fuelline.io import Rejects, RecordError, expand_inputs, iter_file_records, read_records
from fuelline.io.readers import count_units

from ..conftest import shared_file

RECORDS = [{"id": str(i), "text": f"第{i}行 line {i}", "n": i} for i in range(50)]


def jsonl_bytes(records, *, extra_lines=()):
    lines = [orjson.dumps(r) for r in records]
    for index, line in extra_lines:
        lines.insert(index, line)
    return b"\n".join(lines) + b"\n"


COMPRESSORS = {
    ".jsonl": lambda b: b,
    ".jsonl.gz": gzip.compress,
    ".jsonl.zst": lambda b: zstandard.ZstdCompressor().compress(b),
    ".jsonl.bz2": bz2.compress,
    ".jsonl.xz": lzma.compress,
}


@pytest.mark.parametrize("suffix", COMPRESSORS)
def test_line_formats_round_trip(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    path.write_bytes(COMPRESSORS[suffix](jsonl_bytes(RECORDS)))
    assert list(read_records(path)) == RECORDS


def test_json_array_is_streamed_and_json_lines_in_a_json_file_are_read(tmp_path):
    array = tmp_path / "array.json.zst"
    array.write_bytes(zstandard.ZstdCompressor().compress(orjson.dumps(RECORDS, option=orjson.OPT_INDENT_2)))
    lines = tmp_path / "lines.json"
    lines.write_bytes(jsonl_bytes(RECORDS))
    assert list(read_records(array)) == RECORDS
    assert list(read_records(lines)) == RECORDS


def test_json_array_element_that_is_not_an_object_is_named(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(orjson.dumps([RECORDS[0], [1, 2], RECORDS[1]]))
    with pytest.raises(RecordError, match=r"a\.json:2: array element 2 is list"):
        list(read_records(path))


def test_parquet(tmp_path):
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS), path, row_group_size=7)
    assert list(read_records(path)) == RECORDS


def test_blank_lines_crlf_and_bom_are_handled(tmp_path):
    path = tmp_path / "d.jsonl"
    body = jsonl_bytes(RECORDS[:3], extra_lines=[(1, b""), (2, b"   \r")]).replace(b"\n", b"\r\n")
    path.write_bytes(b"\xef\xbb\xbf" + body)
    assert [loc for loc, _ in iter_file_records(path)] == [1, 4, 5]
    assert list(read_records(path)) == RECORDS[:3]


def test_malformed_line_in_the_middle_of_a_zst_file_names_file_and_line(tmp_path):
    path = tmp_path / "broken.jsonl.zst"
    body = jsonl_bytes(RECORDS, extra_lines=[(25, b'{"id": "x", "text": "unterminated')])
    path.write_bytes(zstandard.ZstdCompressor().compress(body))
    with pytest.raises(RecordError) as error:
        list(read_records(path))
    assert str(error.value).startswith(f"{path}:26: invalid JSON")
    assert (error.value.source, error.value.line) == (str(path), 26)


def test_skip_mode_counts_and_keeps_rejects(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_bytes(jsonl_bytes(RECORDS, extra_lines=[(10, b"{not json"), (20, b"[1, 2]")]))
    rejects = Rejects(tmp_path / "rejects.jsonl.zst")
    records = list(read_records(path, on_error="skip", rejects=rejects))
    rejects.close()
    assert records == RECORDS
    assert rejects.counts == {"malformed_json": 1, "not_an_object": 1}
    kept = list(read_records(tmp_path / "rejects.jsonl.zst"))
    assert [(r["reason"], r["line"], r["record"]) for r in kept] == [
        ("malformed_json", 11, "{not json"), ("not_an_object", 21, "[1, 2]")]


@pytest.mark.parametrize("shard", [(0, 10), (10, 11), (45, None), (3, 3), (60, None)])
def test_line_ranges_select_the_same_records_as_slicing(tmp_path, shard):
    path = tmp_path / "d.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(jsonl_bytes(RECORDS)))
    start, stop = shard
    got = [r for _, r in iter_file_records(path, start=start, stop=stop)]
    assert got == RECORDS[start:stop]


def test_line_ranges_cross_read_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr("fuelline.io.streams.CHUNK_BYTES", 64)  # many records span two blocks
    path = tmp_path / "d.jsonl"
    path.write_bytes(jsonl_bytes(RECORDS))
    assert [r for _, r in iter_file_records(path, start=17, stop=33)] == RECORDS[17:33]
    assert list(read_records(path)) == RECORDS


def test_count_units(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"a":1}\n{"a":2}')  # no trailing newline
    (tmp_path / "b.json").write_bytes(b"[]")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert count_units(tmp_path / "a.jsonl") == 2
    assert count_units(tmp_path / "b.json") is None
    assert count_units(tmp_path / "empty.jsonl") == 0


def test_directories_and_globs_expand_in_sorted_order_skipping_hidden_and_temp_files(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ["b.jsonl", "a.jsonl.gz", "sub/c.parquet", ".hidden.jsonl", ".a.jsonl.tmp-1-ab", "notes.txt"]:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "x"}\n')  # a source of empty files only is refused
    assert [p.relative_to(tmp_path).as_posix() for p in expand_inputs(tmp_path)] == [
        "a.jsonl.gz", "b.jsonl", "sub/c.parquet"]
    assert [p.name for p in expand_inputs(str(tmp_path / "*.jsonl*"))] == ["a.jsonl.gz", "b.jsonl"]
    with pytest.raises(FileNotFoundError, match="matched no data files"):
        expand_inputs(str(tmp_path / "*.csv"))
    with pytest.raises(ValueError, match="unsupported file type"):
        expand_inputs(tmp_path / "notes.txt")


@pytest.mark.parametrize("relative, expected", [
    ("chinese-poetry.jsonl.zst", 398_631),
    ("chat/sharegpt_zh_1K.jsonl.zst", 1_000),
    ("chat/codegen-instruct.json.zst", 4_535),
    ("chat/gsm8k-train.jsonl.zst", 7_473),
])
def test_shared_data_files_are_read_completely(relative, expected):
    path = shared_file(relative)
    count = 0
    for record in read_records(path):
        assert isinstance(record, dict)
        count += 1
    assert count == expected


def test_directory_reads_skip_the_stats_files_steps_write_beside_their_data(tmp_path):
    (tmp_path / "part.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "stats.json").write_text('{"records_in": 1}')
    assert list(read_records(tmp_path)) == [{"a": 1}]
    assert list(read_records(tmp_path / "stats.json")) == [{"records_in": 1}]  # named explicitly, it is read


def _compressed(kind: str, data: bytes) -> bytes:
    return {"zst": zstandard.ZstdCompressor().compress, "gz": gzip.compress, "bz2": bz2.compress,
            "xz": lzma.compress}[kind](data)


JSONL = b"".join(b'{"n": %d, "text": "%s"}\n' % (i, b"x" * (i % 50)) for i in range(20_000))


@pytest.mark.parametrize("kind", ["zst", "gz", "bz2", "xz"])
def test_a_truncated_compressed_file_is_an_error_never_a_short_read(kind, tmp_path):
    from fuelline.io.streams import DamagedInput

    whole = _compressed(kind, JSONL)
    path = tmp_path / f"cut.jsonl.{kind}"
    path.write_bytes(whole[: len(whole) * 2 // 3])
    with pytest.raises(DamagedInput, match=rf"cut.jsonl.{kind}: ends early: truncated\?"):
        list(read_records(path))
    with pytest.raises(DamagedInput, match="ends early"):
        count_units(path)
    path.write_bytes(whole)
    assert sum(1 for _ in read_records(path)) == 20_000


def test_a_zstd_file_cut_at_a_frame_boundary_reads_its_whole_frames(tmp_path):
    frames = [zstandard.ZstdCompressor().compress(JSONL[:100_000]), zstandard.ZstdCompressor().compress(JSONL[100_000:])]
    path = tmp_path / "frames.jsonl.zst"
    path.write_bytes(b"".join(frames))
    assert b"".join(orjson.dumps(r) + b"\n" for r in read_records(path)).count(b"\n") == 20_000


@pytest.mark.parametrize("kind", ["zst", "gz", "bz2", "xz"])
def test_a_mislabelled_file_names_itself_and_the_suffix(kind, tmp_path):
    from fuelline.io.streams import DamagedInput

    path = tmp_path / f"plain.jsonl.{kind}"
    path.write_bytes(JSONL[:1000])
    with pytest.raises(DamagedInput, match=rf"plain.jsonl.{kind}: cannot be read as .{kind} .*suffix right"):
        list(read_records(path))


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_line_ranges_and_size_limits_agree_with_a_plain_split(tmp_path, monkeypatch, chunk):
    """The block reader (lines over many blocks, long lines read past) against splitting the whole file."""
    import random

    monkeypatch.setattr("fuelline.io.streams.CHUNK_BYTES", chunk)
    rng = random.Random(chunk)
    lines = []
    for i in range(120):
        kind = rng.random()
        lines.append(b"" if kind < 0.1 else b"{oops" if kind < 0.15 else orjson.dumps({"n": i, "t": "w" * rng.randint(0, 300)}))
    data = b"\xef\xbb\xbf" + b"\n".join(lines) + (b"\n" if chunk % 2 else b"")
    path = tmp_path / "d.jsonl"
    path.write_bytes(data)
    limit = 200
    for start, stop in [(0, None), (0, 50), (13, 77), (119, None), (200, None)]:
        expected, refused = [], []
        for lineno, line in enumerate(lines, 1):
            if not start < lineno <= (stop if stop is not None else len(lines)):
                continue
            if len(line) > limit:
                refused.append((lineno, "record_too_large"))
            elif line.startswith(b"{oops"):
                refused.append((lineno, "malformed_json"))
            elif line:
                expected.append((lineno, orjson.loads(line)))
        rejects = Rejects(tmp_path / f"r-{start}.jsonl.zst")
        got = list(iter_file_records(path, start=start, stop=stop, on_error="skip", rejects=rejects,
                                     max_record_bytes=limit))
        rejects.close()
        assert got == expected
        kept = list(read_records(rejects.path)) if rejects.written else []
        assert [(r["line"], r["reason"]) for r in kept] == refused
        assert all(r["record"] == lines[r["line"] - 1].decode() for r in kept)


def test_max_record_bytes_must_be_positive(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"a": 1}\n')
    with pytest.raises(ValueError, match="max_record_bytes must be at least 1"):
        list(iter_file_records(tmp_path / "a.jsonl", max_record_bytes=0))


def test_a_source_of_no_records_and_a_file_found_twice_are_refused_naming_them(tmp_path):
    import zstandard

    (tmp_path / "a.jsonl").write_bytes(b'{"text": "x"}\n')
    (tmp_path / "blank.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b" \n\n"))
    (tmp_path / "none.json").write_bytes(b"[ ]\n")
    for empty in ("blank.jsonl.zst", "none.json"):
        with pytest.raises(ValueError, match=f"{empty}: empty"):
            expand_inputs(tmp_path / empty)
    assert expand_inputs(tmp_path / "blank.jsonl.zst", empty_ok=True) == [tmp_path / "blank.jsonl.zst"]
    assert len(expand_inputs(tmp_path)) == 3  # a directory with one file of records is read whole
    (tmp_path / "link.jsonl").symlink_to("a.jsonl")
    for twice in ([tmp_path / "a.jsonl", tmp_path / "a.jsonl"], [tmp_path, tmp_path / "none.json"],
                  [tmp_path / "a.jsonl", tmp_path / "link.jsonl"], [str(tmp_path / "*.jsonl"), str(tmp_path / "a*")]):
        with pytest.raises(ValueError, match="among the inputs twice"):
            expand_inputs(twice)
