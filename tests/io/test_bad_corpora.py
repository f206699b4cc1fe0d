"""Issue 15, class 4: corpora that are bad in ways that once cost gigabytes, tracebacks or records.

Each test reproduces one reported problem: a deeply nested JSON array, a deeply nested JSONL
record (that crashed the rejects file), a JSON array cut in the middle, invalid UTF-8, and one
huge line; issue 25 adds lone surrogate escapes and a byte order mark in JSON arrays. Memory is measured in a child process, under an address-space limit so that a
regression fails fast instead of taking the machine's memory.
"""

import resource
import subprocess
import sys

import orjson
import pytest
import zstandard
from hypothesis import given, settings, strategies as st

from fuelline.io import RecordError, Rejects, iter_file_records, read_records
from fuelline.io.bad_records import MAX_NESTING_DEPTH, MAX_RECORD_BYTES, READ_ERROR_REASONS
from fuelline.io.readers import count_units

GOOD = [{"id": str(i), "text": f"record {i}"} for i in range(3)]


def nested(depth: int) -> bytes:
    """An object holding `depth - 1` nested arrays: `depth` levels in all."""
    return b'{"x":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def skip_read(path, **options):
    """(locations of the records read, rejects counts, rejects kept) with on_error="skip"."""
    rejects = Rejects(path.with_name(path.name + ".rejects.jsonl.zst"))
    located = [loc for loc, _ in iter_file_records(path, on_error="skip", rejects=rejects, **options)]
    rejects.close()
    kept = list(read_records(rejects.path)) if rejects.written else []
    return located, dict(rejects.counts), kept


def run_measured(code: str, limit_bytes: int = 2 << 30, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """Run `code` in a child Python under RLIMIT_AS; return the result and its peak RSS in MB.

    The peak is VmHWM, not getrusage's ru_maxrss: Linux keeps ru_maxrss across exec, so a child
    forked from a large pytest process would report the parent's size."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    script = code + ("\nimport re\nprint('peak_kb', re.search(r'VmHWM:\\s+(\\d+)', "
                     "open('/proc/self/status').read()).group(1))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                            preexec_fn=limit, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    kb = int(result.stdout.split("peak_kb")[-1])
    return result, kb / 1024


def test_the_new_reasons_count_as_read_errors():
    # The executor counts these into records_in (records_in = out + dropped in the funnel).
    assert {"invalid_utf8", "nesting_too_deep", "record_too_large", "truncated_json_array"} <= set(READ_ERROR_REASONS)


# --- a .json array nested 100,000 deep (a 200 KB file) once needed ~23 GB -------------------------

def test_a_json_array_nested_100000_deep_is_refused_in_small_memory(tmp_path):
    path = tmp_path / "deep.json"
    elements = [orjson.dumps(GOOD[0]), nested(100_000), orjson.dumps(GOOD[1]), nested(MAX_NESTING_DEPTH + 1),
                nested(MAX_NESTING_DEPTH), orjson.dumps(GOOD[2])]
    path.write_bytes(b"[" + b",\n".join(elements) + b"]")
    assert 190_000 < path.stat().st_size < 250_000
    code = (f"from fuelline.io import Rejects, iter_file_records\nrejects = Rejects()\n"
            f"print('got', [n for n, _ in iter_file_records({str(path)!r}, on_error='skip', rejects=rejects)], "
            f"dict(rejects.counts))\n")
    result, peak_mb = run_measured(code, timeout=60)
    assert "got [1, 3, 5, 6] {'nesting_too_deep': 2}" in result.stdout
    assert peak_mb < 300, f"peak RSS {peak_mb:.0f} MB"


def test_a_too_deep_array_element_is_named_with_on_error_raise(tmp_path):
    path = tmp_path / "deep.json"
    path.write_bytes(b"[" + orjson.dumps(GOOD[0]) + b"," + nested(20_000) + b"]")
    with pytest.raises(RecordError, match=rf"deep\.json:2: array element 2 is nested deeper than {MAX_NESTING_DEPTH}"):
        list(read_records(path))


def test_a_too_deep_element_in_the_rejects_names_its_reason_and_the_elements_after_it_are_read(tmp_path):
    path = tmp_path / "deep.json"
    # Deep inside an object key, inside an array, and as the very last element.
    deep_in_object = b'{"a": {"b": [1, {"c": ' + nested(300) + b"}]}, " + b'"after": 1}'
    path.write_bytes(b"[" + b",".join([deep_in_object, orjson.dumps(GOOD[0]), nested(250)]) + b"]")
    located, counts, kept = skip_read(path)
    assert located == [2]
    assert counts == {"nesting_too_deep": 2}
    assert [(r["reason"], r["line"]) for r in kept] == [("nesting_too_deep", 1), ("nesting_too_deep", 3)]
    assert "array element 1 is nested deeper than" in kept[0]["detail"]


# --- a .jsonl record nested 300 deep crashed `clean --on-error skip` in the rejects file ----------

def test_jsonl_records_nested_too_deep_are_rejected_with_their_raw_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    lines = [orjson.dumps(GOOD[0]), nested(300), nested(2_000), nested(MAX_NESTING_DEPTH), orjson.dumps(GOOD[1])]
    path.write_bytes(b"\n".join(lines) + b"\n")
    located, counts, kept = skip_read(path)
    assert located == [1, 4, 5]
    assert counts == {"nesting_too_deep": 2}  # 300 levels: past fuelline's limit; 2,000: past orjson's own
    assert [(r["line"], r["record"]) for r in kept] == [(2, lines[1].decode()), (3, lines[2].decode())]
    assert all(f"nested deeper than {MAX_NESTING_DEPTH} levels" in r["detail"] for r in kept)
    with pytest.raises(RecordError, match=rf"deep\.jsonl:2: nested deeper than {MAX_NESTING_DEPTH} levels"):
        list(read_records(path))


def test_brackets_inside_strings_are_not_nesting(tmp_path):
    path = tmp_path / "code.jsonl"
    record = {"text": "{[" * 5_000, "meta": {"a": [1, 2]}}
    path.write_bytes(orjson.dumps(record) + b"\n")
    assert list(read_records(path)) == [record]


def test_a_rejected_record_that_cannot_be_written_as_json_keeps_its_raw_line(tmp_path):
    deep = 1
    for _ in range(300):
        deep = [deep]
    rejects = Rejects(tmp_path / "rejects.jsonl.zst")
    rejects.add("malformed_record", {"x": deep}, source="in.jsonl", line=7, detail="no text", raw=b'{"x": [[1]]}')
    rejects.add("malformed_record", {"x": deep}, source="in.jsonl", line=8)  # no raw line: a short repr
    rejects.close()
    kept = list(read_records(tmp_path / "rejects.jsonl.zst"))
    assert (kept[0]["line"], kept[0]["record"]) == (7, '{"x": [[1]]}')
    assert kept[0]["detail"].startswith("no text; record kept as its raw line: it cannot be written as JSON")
    assert kept[1]["record"].startswith("{'x': [[[[") and "record kept as a shortened repr" in kept[1]["detail"]
    assert rejects.counts == {"malformed_record": 2}


def fuelline(*args):
    return subprocess.run([sys.executable, "-m", "fuelline.cli", *args], capture_output=True, text=True, check=False)


def test_clean_skips_a_jsonl_record_nested_300_deep_and_keeps_it_in_the_rejects(tmp_path):
    source = tmp_path / "in.jsonl"
    deep = b'{"id": "deep", "text": "A deep one with the words of a text.", "meta": ' + nested(300) + b"}"
    good = {"id": "ok", "text": ("The river runs past the old mill and the children watch the boats go by.\n"
                                 "In the evening the baker closes his shop and walks home along the water.\n"
                                 "Some of the neighbours say that the bridge was built by their grandfathers.\n"
                                 "The town has a market on Saturdays where farmers sell apples, bread and cheese.\n"
                                 "Visitors often stay for a week because the hills around it are quiet.")}
    source.write_bytes(orjson.dumps(good) + b"\n" + deep + b"\n")
    out = tmp_path / "out"
    result = fuelline("clean", "-i", str(source), "-o", str(out), "--profile", "web", "--no-boilerplate",
                      "--on-error", "skip", "-q", "-w", "1")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert stats["dropped"] == {"nesting_too_deep": 1} and stats["records_in"] == 2 and stats["records_out"] == 1
    kept = [r for r in read_records(out / "_rejects") if r["reason"] == "nesting_too_deep"]
    assert [(r["line"], r["record"]) for r in kept] == [(2, deep.decode())]


# --- a .json array cut in the middle kept none of its good elements with on_error = "skip" --------

def test_a_json_array_cut_in_the_middle_keeps_the_elements_before_the_cut(tmp_path):
    whole = orjson.dumps([{"n": i, "text": "x" * 50} for i in range(1000)])
    path = tmp_path / "cut.json"
    path.write_bytes(whole[: len(whole) * 2 // 3])
    located, counts, kept = skip_read(path)
    assert len(located) > 600 and located == list(range(1, len(located) + 1))
    assert counts == {"truncated_json_array": 1}
    assert kept[0]["line"] == len(located) + 1 and "ends inside element" in kept[0]["detail"]
    with pytest.raises(RecordError, match=rf"cut\.json:element {len(located) + 1}: the JSON array ends inside"):
        list(read_records(path))


def test_a_cut_compressed_json_array_stays_a_damaged_file_error(tmp_path):
    from fuelline.io.streams import DamagedInput

    whole = zstandard.ZstdCompressor().compress(orjson.dumps([{"n": i} for i in range(20_000)]))
    path = tmp_path / "cut.json.zst"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DamagedInput, match="ends early"):
        skip_read(path)


def test_a_json_array_broken_in_the_middle_keeps_what_comes_before(tmp_path):
    path = tmp_path / "broken.json"
    path.write_bytes(b'[{"a": 1}, {"b": 2} {"c": 3}, {"d": 4}]')
    located, counts, kept = skip_read(path)
    assert located == [1, 2] and counts == {"malformed_json": 1}
    assert kept[0]["detail"].startswith("invalid JSON array: parse error")


# --- invalid UTF-8 was reported as "surrogates not allowed … column 1" ----------------------------

def test_invalid_utf8_in_a_jsonl_line_names_the_byte(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(orjson.dumps(GOOD[0]) + b'\n{"text": "caf\xe9 au lait"}\n' + orjson.dumps(GOOD[1]) + b"\n")
    with pytest.raises(RecordError) as error:
        list(read_records(path))
    message = str(error.value)
    assert message.startswith(f"{path}:2: invalid UTF-8 at byte 13 of the line")
    assert "surrogates" not in message and "column" not in message
    located, counts, kept = skip_read(path)
    assert located == [1, 3] and counts == {"invalid_utf8": 1}
    assert kept[0]["record"] == '{"text": "caf\ufffd au lait"}'


def test_invalid_utf8_in_a_json_array_names_the_byte_of_the_file(tmp_path):
    data = b"[" + orjson.dumps(GOOD[0]) + b', {"text": "caf\xe9"}, ' + orjson.dumps(GOOD[1]) + b"]"
    path = tmp_path / "latin1.json"
    path.write_bytes(data)
    offset = data.index(b"\xe9")
    with pytest.raises(RecordError, match=rf"latin1\.json:element 2: invalid UTF-8 at byte {offset} of the file"):
        list(read_records(path))
    located, counts, _ = skip_read(path)
    assert located == [1] and counts == {"invalid_utf8": 1}


# --- a single 100 MB line took 3.3 GB in clean ----------------------------------------------------

@pytest.fixture(scope="module")
def huge_line_file(tmp_path_factory):
    """GOOD[0], a 100 MB line, GOOD[1]."""
    path = tmp_path_factory.mktemp("huge") / "huge.jsonl"
    with open(path, "wb") as f:
        f.write(orjson.dumps(GOOD[0]) + b'\n{"id": "huge", "text": "')
        block = b"The same words again and again. " * 32_768  # 1 MiB
        f.writelines(block for _ in range(100))
        f.write(b'"}\n' + orjson.dumps(GOOD[1]) + b"\n")
    return path


def test_a_100_mb_line_is_refused_as_too_large_without_reading_it_whole(huge_line_file):
    assert MAX_RECORD_BYTES == 64 << 20
    code = (f"from fuelline.io import Rejects, iter_file_records\nrejects = Rejects()\n"
            f"print('got', [n for n, _ in iter_file_records({str(huge_line_file)!r}, on_error='skip', "
            f"rejects=rejects)], dict(rejects.counts))\n")
    result, peak_mb = run_measured(code)
    assert "got [1, 3] {'record_too_large': 1}" in result.stdout
    assert peak_mb < 64 + 150, f"peak RSS {peak_mb:.0f} MB"  # one limit's worth of line, plus the interpreter


def test_clean_refuses_a_100_mb_line_by_name_in_bounded_memory(huge_line_file, tmp_path):
    out = tmp_path / "out"
    code = ("from fuelline.cli import main\n"
            f"main(['clean', '-i', {str(huge_line_file)!r}, '-o', {str(out)!r}, '--profile', 'web', '--no-boilerplate', "
            "'--on-error', 'skip', '-q', '-w', '1'], standalone_mode=False)\n")
    _, peak_mb = run_measured(code, limit_bytes=4 << 30)
    assert peak_mb < 600, f"peak RSS {peak_mb:.0f} MB"  # 3.3 GB before
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert stats["dropped"]["record_too_large"] == 1 and stats["records_in"] == 3
    (kept,) = [r for r in read_records(out / "_rejects") if r["reason"] == "record_too_large"]
    assert kept["line"] == 2 and kept["record"].startswith('{"id": "huge", "text": "The same words')
    assert len(kept["record"]) == 4096 and f"over the limit of {MAX_RECORD_BYTES:,}" in kept["detail"]


def test_record_size_limit_is_exact_across_read_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr("fuelline.io.streams.CHUNK_BYTES", 64)
    records = [{"n": i, "text": "y" * (i * 7 % 130)} for i in range(60)]
    lines = [orjson.dumps(r) for r in records]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    limit = 100
    located, counts, kept = skip_read(path, max_record_bytes=limit)
    too_long = [i + 1 for i, line in enumerate(lines) if len(line) > limit]
    assert too_long and located == [i + 1 for i, line in enumerate(lines) if len(line) <= limit]
    assert counts == {"record_too_large": len(too_long)}
    assert [r["line"] for r in kept] == too_long
    assert all(r["record"] == lines[r["line"] - 1].decode() for r in kept)  # short enough to be kept whole
    with pytest.raises(RecordError, match=rf"mixed\.jsonl:{too_long[0]}: the line is {len(lines[too_long[0] - 1])} bytes"):
        list(read_records(path, max_record_bytes=limit))


def test_a_json_array_element_with_too_much_text_is_refused(tmp_path):
    path = tmp_path / "big.json"
    big = {"t": "z" * 1000, "u": [1, 2, {"k": "v"}]}
    path.write_bytes(orjson.dumps([GOOD[0], big, GOOD[1], "q" * 2000, {"k": "诗" * 200}]))
    located, counts, kept = skip_read(path, max_record_bytes=500)
    assert located == [1, 3] and counts == {"record_too_large": 3}  # 600 bytes of UTF-8 in the last one
    assert [r["line"] for r in kept] == [2, 4, 5]
    assert [loc for loc, _ in iter_file_records(path, on_error="skip", max_record_bytes=5000)] == [1, 2, 3, 5]


# --- lone surrogate escapes in a JSON array: a decode error naming nothing, or "?" written -------

LONE_LOW = b'{"id":"s1","instruction":"\\udc00","input":"","response":"r"}'
LONE_HIGH = b'{"id":"s2","instruction":"a\\ud800b","input":"","response":"r"}'
PAIR = b'{"id":"s3","instruction":"a\\ud83d\\ude00b","input":"","response":"r"}'


@pytest.mark.parametrize("bad", [LONE_LOW, LONE_HIGH], ids=["low", "high"])
def test_a_lone_surrogate_escape_in_a_json_array_is_refused_naming_file_and_element(tmp_path, bad):
    path = tmp_path / "alpaca.json"
    path.write_bytes(b"[" + PAIR + b"," + bad + b"," + PAIR + b"]")
    with pytest.raises(RecordError, match=r"alpaca\.json:2: array element 2 holds the lone surrogate escape \\ud"):
        list(read_records(path))
    rejects = Rejects(tmp_path / "rejects.jsonl")
    kept = list(read_records(path, on_error="skip", rejects=rejects))
    rejects.close()
    assert [r["instruction"] for r in kept] == ["a\U0001F600b", "a\U0001F600b"]  # the pair is one character
    assert rejects.counts == {"malformed_json": 1}


def test_json_lines_and_a_json_array_refuse_the_same_escapes(tmp_path):
    lines, array = tmp_path / "d.jsonl", tmp_path / "d.json"
    lines.write_bytes(b"\n".join([LONE_LOW, PAIR, LONE_HIGH, PAIR]) + b"\n")
    array.write_bytes(b"[" + b",".join([LONE_LOW, PAIR, LONE_HIGH, PAIR]) + b"]")
    read = {path.suffix: [loc for loc, _ in iter_file_records(path, on_error="skip")] for path in (lines, array)}
    assert read[".jsonl"] == read[".json"] == [2, 4]


escaped_strings = st.lists(st.sampled_from(["a", "字", "\\\\", "\\u00e9", "\\ud83d\\ude00", "\\ud800", "\\udfff",
                                           "\\\\ud800", "\\\\\\ud800", "\\ud800\\\\udc00", "\\ud83d"]), max_size=6)


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(escaped_strings.map("".join), min_size=1, max_size=12), read_bytes=st.integers(1, 40))
def test_every_lone_escape_is_charged_to_its_own_element_whatever_the_read_sizes(texts, read_bytes):
    """Against Python's json module, which keeps a lone half as a lone surrogate in the str."""
    import json
    import tempfile
    from pathlib import Path
    from unittest import mock

    elements = [b'{"text": "' + text.encode() + b'"}' for text in texts]
    expected = [i + 1 for i, e in enumerate(elements) if not _has_lone_surrogate(json.loads(e)["text"])]
    with tempfile.TemporaryDirectory() as tmp, mock.patch("fuelline.io.json_escapes.READ_BYTES", read_bytes), \
            mock.patch("fuelline.io.streams.CHUNK_BYTES", read_bytes):
        path = Path(tmp) / "a.json"
        path.write_bytes(b"[" + b",\n".join(elements) + b"]")
        got = list(iter_file_records(path, on_error="skip"))
    assert [loc for loc, _ in got] == expected
    assert [r["text"] for _, r in got] == [json.loads(elements[i - 1])["text"] for i in expected]


def _has_lone_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


# --- a JSON array after a UTF-8 byte order mark was one malformed_json reject ----------------------

def test_a_json_array_after_a_byte_order_mark_reads_every_element(tmp_path):
    records = [{"id": str(i), "text": f"诗{i}"} for i in range(1923)]
    path = tmp_path / "poems.json"
    path.write_bytes(b"\xef\xbb\xbf" + orjson.dumps(records))
    assert count_units(path) is None  # an array, so not cut into line ranges
    assert list(read_records(path, on_error="skip")) == records
