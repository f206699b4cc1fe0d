import pytest

from fuelline.io import JsonlZstWriter, atomic_write, open_writer, read_records

RECORDS = [{"id": str(i), "text": "诗" * i, "meta": {"n": i}} for i in range(1, 100)]


@pytest.mark.parametrize("output_format", ["jsonl.zst", "parquet"])
def test_round_trip_and_same_bytes_for_same_records(tmp_path, output_format):
    paths = []
    for name in ("a", "b"):
        with open_writer(tmp_path / name, output_format) as writer:
            for record in RECORDS:
                writer.write(record)
        paths.append(writer.path)
    assert list(read_records(paths[0])) == RECORDS
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_a_failed_write_leaves_neither_the_file_nor_a_temp_file(tmp_path):
    with pytest.raises(RuntimeError):
        with JsonlZstWriter(tmp_path / "out.jsonl.zst") as writer:
            writer.write(RECORDS[0])
            raise RuntimeError("crash while writing")
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_keeps_the_old_file_until_commit(tmp_path):
    target = tmp_path / "stats.json"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(target) as f:
            f.write(b"new, half written")
            assert target.read_bytes() == b"old"
            raise KeyboardInterrupt
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["stats.json"]


def test_unknown_output_format_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown output format 'csv'"):
        open_writer(tmp_path / "x", "csv")


def test_a_failed_close_leaves_no_temp_file(tmp_path):
    writer = open_writer(tmp_path / "mixed", "parquet")
    writer.write({"a": 1})
    writer.write({"a": "not a number"})  # pyarrow refuses the column when the file is finished
    import pyarrow as pa

    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        writer.close()
    assert list(tmp_path.iterdir()) == []


def test_a_record_orjson_cannot_write_is_refused_before_any_byte_is_written(tmp_path):
    deep = 1
    for _ in range(300):
        deep = [deep]
    with JsonlZstWriter(tmp_path / "out.jsonl.zst") as writer:
        with pytest.raises(TypeError):
            writer.write({"deep": deep})
        writer.write(RECORDS[0])
    assert writer.count == 1
    assert list(read_records(writer.path)) == [RECORDS[0]]
