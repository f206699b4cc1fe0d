"""URLs as inputs: what a URL is, expanding URL directories and globs, the fetch-through cache,
and the one-line errors for a missing backend, an unknown protocol or a URL that matches nothing."""

import importlib.util
import uuid
from pathlib import Path

import fsspec
import orjson
import pytest
import zstandard
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.registry import known_implementations

from fuelline.io import RecordError, expand_inputs, read_records
from fuelline.io.remote import cache_root, is_url, local_copy
from fuelline.pipeline.shards import describe_inputs, plan_shards


@pytest.fixture
def memory_root(tmp_path, monkeypatch):
    """A fresh memory:// directory (memory:// is one store per process: each test takes its own)."""
    monkeypatch.setenv("FUELLINE_CACHE_DIR", str(tmp_path / "cache"))
    root = f"/fuelline-test-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def jsonl(records) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


@pytest.mark.parametrize("text, expected", [
    ("s3://bucket/key.jsonl", True), ("gs://bucket", True), ("memory://x/y", True), ("file:///tmp/x", True),
    ("az+blob://c/d", True), ("C://Users/x", False), ("/tmp/x.jsonl", False), ("corpus/*.jsonl", False),
    ("s3:/bucket/key", False), ("nota url://x", False), (Path("s3://bucket/key"), False),
])
def test_what_is_a_url(text, expected):
    assert is_url(text) is expected


# One tree, written both locally and at a URL: a directory read must pick the same files the same way.
TREE = {
    "b.jsonl": b'{"id": "b"}\n',
    "a/2.jsonl.zst": zstandard.ZstdCompressor().compress(b'{"id": "a2"}\n'),
    "a/1.json": b'[{"id": "a1"}]',
    "a-b.jsonl": b'{"id": "a-b"}\n',
    "stats.json": b"{}",
    "notes.txt": b"not data",
    ".hidden.jsonl": b'{"id": "hidden"}\n',
    "_rejects/part-00000.jsonl": b'{"id": "rejected"}\n',
    ".x/y.jsonl": b'{"id": "in a hidden directory"}\n',
    "c/.c.jsonl.tmp-1-ab": b'{"id": "a temp file"}\n',
}


def test_a_url_directory_expands_to_the_files_a_local_one_does(memory_root, tmp_path):
    fs = fsspec.filesystem("memory")
    for name, data in TREE.items():
        fs.pipe(f"{memory_root}/tree/{name}", data)
        (tmp_path / "tree" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / name).write_bytes(data)
    local = [p.relative_to(tmp_path / "tree").as_posix() for p in expand_inputs(tmp_path / "tree")]
    remote = expand_inputs(f"memory://{memory_root}/tree")
    assert local == ["a/1.json", "a/2.jsonl.zst", "a-b.jsonl", "b.jsonl"]
    assert remote == [f"memory://{memory_root}/tree/{name}" for name in local]
    assert all(isinstance(u, str) for u in remote)  # a URL stays a URL (a Path would collapse the //)
    assert [r["id"] for r in read_records(f"memory://{memory_root}/tree")] == ["a1", "a2", "a-b", "b"]


def test_a_url_stage_directory_expands_to_its_parts_and_globs_match(memory_root):
    fs = fsspec.filesystem("memory")
    stage = f"{memory_root}/stage"
    for name in ("_plan.json", "stats.json", "part-00001.jsonl", "part-00000.jsonl", "_done/part-00000.json",
                 "_rejects/part-00000.jsonl", "other.jsonl"):
        fs.pipe(f"{stage}/{name}", b'{"id": "x"}\n')
    assert expand_inputs(f"memory://{stage}/") == [f"memory://{stage}/part-00000.jsonl",
                                                   f"memory://{stage}/part-00001.jsonl"]
    assert expand_inputs(f"memory://{stage}/part-*.jsonl") == [f"memory://{stage}/part-00000.jsonl",
                                                               f"memory://{stage}/part-00001.jsonl"]
    assert expand_inputs([f"memory://{stage}/other.jsonl"]) == [f"memory://{stage}/other.jsonl"]


def test_a_url_matching_nothing_is_an_error_naming_it(memory_root):
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{memory_root}/notes.txt", b"x")
    with pytest.raises(FileNotFoundError, match=f"^memory://{memory_root}/missing.jsonl: no such file"):
        expand_inputs(f"memory://{memory_root}/missing.jsonl")
    with pytest.raises(FileNotFoundError, match=rf"^memory://{memory_root}/\*.jsonl: matched no data files"):
        expand_inputs(f"memory://{memory_root}/*.jsonl")
    with pytest.raises(FileNotFoundError, match=f"^memory://{memory_root}: matched no data files"):
        expand_inputs(f"memory://{memory_root}")  # a directory of no data files
    with pytest.raises(ValueError, match=f"^memory://{memory_root}/notes.txt: unsupported file type"):
        expand_inputs(f"memory://{memory_root}/notes.txt")


def test_a_url_is_fetched_once_then_again_when_it_changes(memory_root, monkeypatch):
    fs = fsspec.filesystem("memory")
    url = f"memory://{memory_root}/docs.jsonl"
    fs.pipe(f"{memory_root}/docs.jsonl", jsonl([{"id": 1}, {"id": 2}]))
    fetched = []
    get_file = MemoryFileSystem.get_file

    def counted(self, remote, *args, **kwargs):
        fetched.append(remote)
        return get_file(self, remote, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "get_file", counted)

    first = local_copy(url)
    assert first.is_relative_to(cache_root()) and first.name.endswith("-docs.jsonl")  # suffixes kept: the format
    assert first.read_bytes() == jsonl([{"id": 1}, {"id": 2}])
    assert local_copy(url) == first and len(fetched) == 1  # reused, not fetched again
    assert plan_shards([url], 1)[1].source == url and len(fetched) == 1  # readers name the URL, read the copy

    fs.pipe(f"{memory_root}/docs.jsonl", jsonl([{"id": 3}]))  # the remote file changes
    second = local_copy(url)
    assert len(fetched) == 2 and second != first
    assert second.read_bytes() == jsonl([{"id": 3}])
    assert not first.exists()  # the copy of the old version is gone
    assert [r["id"] for r in read_records(url)] == [3]
    described = describe_inputs([url])
    assert described[0]["path"] == url and described[0]["size"] == len(jsonl([{"id": 3}])) and described[0]["version"]


def test_a_bad_record_at_a_url_is_named_by_its_url(memory_root):
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{memory_root}/bad.jsonl.zst", zstandard.ZstdCompressor().compress(b'{"id": 1}\n{oops\n'))
    with pytest.raises(RecordError, match=rf"^memory://{memory_root}/bad.jsonl.zst:2: invalid JSON"):
        list(read_records(f"memory://{memory_root}/bad.jsonl.zst"))


def test_a_missing_backend_or_unknown_protocol_is_one_line_naming_url_and_package(monkeypatch):
    monkeypatch.setitem(known_implementations, "fuellinefake",
                        {"class": "fuelline_fake_backend.FakeFileSystem", "err": "Install fuelline_fake_backend"})
    with pytest.raises(RuntimeError) as missing:
        expand_inputs("fuellinefake://bucket/corpus/")
    assert str(missing.value).startswith("fuellinefake://bucket/corpus/: fuellinefake:// needs the package "
                                         "fuelline_fake_backend, which is not installed: "
                                         "pip install fuelline_fake_backend")
    assert "\n" not in str(missing.value)
    with pytest.raises(ValueError, match=r"^nosuchproto://x/y.jsonl: unknown URL protocol nosuchproto://"):
        expand_inputs("nosuchproto://x/y.jsonl")


@pytest.mark.parametrize("url, package", [("s3://bucket/corpus", "s3fs"), ("gs://bucket/corpus", "gcsfs")])
def test_object_store_urls_name_their_package(url, package):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    with pytest.raises(RuntimeError, match=f"^{url}: .* pip install {package}"):
        expand_inputs(url)
