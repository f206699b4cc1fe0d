"""A stage with URL input and URL output (memory:// and file://) writes what it writes locally,
and resumes from what the URL holds."""

import importlib.util
import random
import uuid

import orjson
import pytest
import zstandard
from fsspec.core import url_to_fs

from fuelline.clean.stage import CleanStage
from fuelline.dedup.stage import DedupStage
from fuelline.io import expand_inputs, read_records
from fuelline.io.remote import staging_dir
from fuelline.pack.packer import pack
from fuelline.pipeline.workdir import StepOutputMismatch
from fuelline.pipeline.executor import RunOptions, run_stage

from ..conftest import invoke_cli as fuelline

WORDS = ("river garden morning letter window market bridge silver orchard harbor lantern meadow teacher village "
         "winter the the of and to with that have be travel quiet yellow ancient paper stone music kitchen").split()
BOOKKEEPING = ("_plan.json", "stats.json")
COUNTS = ("records_in", "records_out", "dropped", "counters", "shards")


def document(i: int) -> dict:
    rng = random.Random(i // 3 if i % 5 == 0 else i)  # some documents repeat another's text: dedup drops them
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))).capitalize() + "."
             for _ in range(rng.randint(2, 9))]
    return {"id": f"doc-{i}", "text": "\n".join(lines)}


def corpus() -> dict[str, bytes]:
    """Two input files: plain JSONL with one malformed line, and JSONL.zst."""
    first = b"".join(orjson.dumps(document(i)) + b"\n" for i in range(170))
    first = first.replace(b'{"id":"doc-77"', b'{"id":"doc-77" oops', 1)
    second = zstandard.ZstdCompressor().compress(b"".join(orjson.dumps(document(i)) + b"\n" for i in range(170, 300)))
    return {"a.jsonl": first, "b.jsonl.zst": second}


def put(url: str, content: bytes) -> None:
    fs, path = url_to_fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, content)


def url_files(url: str) -> dict[str, bytes]:
    """Every file under `url`, by relative name, read back through fsspec."""
    fs, root = url_to_fs(url)
    root = root.rstrip("/")
    fs.invalidate_cache(root)
    return {name[len(root) + 1:]: fs.cat_file(name) for name in sorted(fs.find(root))}


def local_files(directory) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def data(files: dict[str, bytes]) -> dict[str, bytes]:
    """What must be byte-identical: every output file but bookkeeping, markers, rejects (which name the
    input) and `_prepare/` (the work of a corpus-level stage, which stays in the staging directory)."""
    return {n: b for n, b in files.items()
            if n not in BOOKKEEPING and not n.startswith(("_done/", "_rejects/", "_prepare/"))}


def rejects(files: dict[str, bytes]) -> dict[str, list]:
    """The rejected records of each shard, without the name of the input they came from."""
    return {n: [{k: v for k, v in orjson.loads(line).items() if k != "source"}
                for line in zstandard.ZstdDecompressor().decompressobj().decompress(b).splitlines()]
            for n, b in files.items() if n.startswith("_rejects/")}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FUELLINE_CACHE_DIR", str(tmp_path / "cache"))  # spawned workers inherit it
    return tmp_path / "cache"


@pytest.fixture
def memory_root():
    root = f"memory:///fuelline-test-{uuid.uuid4().hex}"
    yield root
    fs, path = url_to_fs(root)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def url_base(scheme: str, memory_root: str, tmp_path) -> str:
    return memory_root if scheme == "memory" else f"file://{tmp_path / 'remote'}"


STAGES = {"clean": lambda: CleanStage(CleanStage.Config(profile="web")),  # with boilerplate: a corpus-level prepare
          "dedup": lambda: DedupStage()}


@pytest.mark.parametrize("scheme, stage_name", [
    ("memory", "dedup"),
    ("file", "clean"),
    # Each stage and each scheme is above; dedup with file:// URLs and workers in other processes is
    # also in the default suite on Ray (tests/pipeline/test_ray.py, test_dedup_on_ray_reads_and_writes_urls).
    pytest.param("memory", "clean", marks=pytest.mark.slow),
    pytest.param("file", "dedup", marks=pytest.mark.slow),
])
def test_url_input_and_output_give_the_local_bytes_and_resume(scheme, stage_name, cache, memory_root, tmp_path):
    files = corpus()
    (tmp_path / "in").mkdir()
    for name, content in files.items():
        (tmp_path / "in" / name).write_bytes(content)
    local_options = RunOptions(workers=1, shard_size=60, on_error="skip", progress=False)
    local_stats = run_stage(STAGES[stage_name](), tmp_path / "in", tmp_path / "local", local_options)
    expected = local_files(tmp_path / "local")

    base = url_base(scheme, memory_root, tmp_path)
    for name, content in files.items():
        put(f"{base}/in/{name}", content)
    # memory:// lives in this process only: one worker; file:// with two spawned workers that fetch and upload
    options = RunOptions(workers=1 if scheme == "memory" else 2, shard_size=60, on_error="skip", progress=False)
    stats = run_stage(STAGES[stage_name](), f"{base}/in", f"{base}/out", options)

    written = url_files(f"{base}/out")
    assert data(written) == data(expected)
    assert len([n for n in written if n.startswith("part-")]) == stats["shards"] == 6  # 300 lines in shards of 60
    assert rejects(written) == rejects(expected) and rejects(written)  # the malformed line at least
    assert {k: stats[k] for k in COUNTS} == {k: local_stats[k] for k in COUNTS}
    assert orjson.loads(written["stats.json"]) == stats
    assert {n for n in written if n.startswith("_done/")} == {n for n in expected if n.startswith("_done/")}
    named = [i["path"] for i in orjson.loads(written["_plan.json"])["identity"]["inputs"]]  # the URLs, not the cached copies
    assert named == expand_inputs(f"{base}/in") and all(n.startswith(f"{scheme}://") for n in named)
    staging = staging_dir(f"{base}/out")
    assert not list(staging.glob("part-*")), "uploaded parts are not kept in the staging directory"

    again = run_stage(STAGES[stage_name](), f"{base}/in", f"{base}/out", options)
    assert again["resumed_shards"] == stats["shards"]
    assert {k: again[k] for k in COUNTS} == {k: stats[k] for k in COUNTS}
    assert data(url_files(f"{base}/out")) == data(written)


def test_a_shard_missing_or_damaged_at_the_url_is_redone(cache, memory_root, tmp_path):
    fs, root = url_to_fs(memory_root)
    for name, content in corpus().items():
        put(f"{memory_root}/in/{name}", content)
    options = RunOptions(workers=1, shard_size=60, on_error="skip", progress=False)
    run_stage(CleanStage(), f"{memory_root}/in", f"{memory_root}/out", options)
    written = url_files(f"{memory_root}/out")

    fs.rm(f"{root}/out/part-00001.jsonl.zst")  # lost
    fs.pipe(f"{root}/out/part-00003.jsonl.zst", written["part-00003.jsonl.zst"][:-5])  # truncated
    fs.rm(f"{root}/out/_done/part-00004.json")  # its marker never went up (the local copy is still staged)
    stats = run_stage(CleanStage(), f"{memory_root}/in", f"{memory_root}/out", options)
    assert stats["resumed_shards"] == stats["shards"] - 3
    assert data(url_files(f"{memory_root}/out")) == data(written)


def test_other_options_into_a_url_are_refused_unless_restart(cache, memory_root):
    fs, root = url_to_fs(memory_root)
    for name, content in corpus().items():
        put(f"{memory_root}/in/{name}", content)
    options = RunOptions(workers=1, shard_size=60, on_error="skip", progress=False)
    run_stage(CleanStage(), f"{memory_root}/in", f"{memory_root}/out", options)
    other = RunOptions(workers=1, shard_size=100, on_error="skip", progress=False)
    with pytest.raises(StepOutputMismatch, match=f"^{memory_root}/out holds the output of a run with different "
                                                  "shard_size"):
        run_stage(CleanStage(), f"{memory_root}/in", f"{memory_root}/out", other)
    stats = run_stage(CleanStage(), f"{memory_root}/in", f"{memory_root}/out",
                      RunOptions(workers=1, shard_size=100, on_error="skip", progress=False, restart=True))
    assert stats["shards"] == 4 and stats["resumed_shards"] == 0
    assert sorted(n for n in url_files(f"{memory_root}/out") if n.startswith("part-")) == [
        f"part-0000{k}.jsonl.zst" for k in range(4)]  # the parts of the old plan are gone


def test_a_url_that_is_not_a_stage_output_or_matches_nothing_is_refused(cache, memory_root):
    fs, root = url_to_fs(memory_root)
    fs.pipe(f"{root}/in/a.jsonl", b'{"id": "a", "text": "x"}\n')
    fs.pipe(f"{root}/taken/notes.txt", b"mine")
    options = RunOptions(workers=1, progress=False)
    with pytest.raises(StepOutputMismatch, match=f"^{memory_root}/taken exists, is not empty and is not a fuelline"):
        run_stage(CleanStage(), f"{memory_root}/in", f"{memory_root}/taken", options)
    with pytest.raises(FileNotFoundError, match=f"^{memory_root}/nothing/\\*.jsonl: matched no data files"):
        run_stage(CleanStage(), f"{memory_root}/nothing/*.jsonl", f"{memory_root}/out", options)
    assert url_files(f"{memory_root}/taken") == {"notes.txt": b"mine"}
    with pytest.raises(ValueError, match="^pack writes to a local directory; s3://bucket/packed is a URL"):
        pack([f"{memory_root}/in"], "tokenizer", "s3://bucket/packed")


def test_the_cli_takes_urls_and_names_a_missing_backend_in_one_line(cache, tmp_path):
    source = tmp_path / "in" / "a.jsonl"
    source.parent.mkdir()
    source.write_bytes(corpus()["a.jsonl"])
    out = tmp_path / "out"
    result = fuelline("clean", "-i", f"file://{source.parent}", "-o", f"file://{out}", "--profile", "web",
                      "--on-error", "skip", "--shard-size", "60", "-w", "1", "-q")
    assert result.exit_code == 0, result.output
    assert f"(rejected records in file://{out}/_rejects/)" in result.stdout
    assert sum(1 for _ in read_records(out)) == orjson.loads((out / "stats.json").read_bytes())["records_out"] > 0
    if importlib.util.find_spec("s3fs") is None:
        result = fuelline("clean", "-i", str(source), "-o", "s3://bucket/clean", "-q")
        assert result.exit_code == 2
        assert result.stderr.startswith("error: s3://bucket/clean: s3:// needs the package s3fs, which is not "
                                         "installed: pip install s3fs")
        assert result.stderr.count("\n") == 1
    result = fuelline("tokenizer", "train", "-i", str(source), "-o", "gs://bucket/tokenizer")
    assert result.exit_code == 2
    assert result.stderr == ("error: fuelline tokenizer train --output writes to a local directory; "
                             "gs://bucket/tokenizer is a URL (stage outputs may be URLs: docs/io.md, "
                             "\"Object storage and other URLs\")\n")


def test_a_second_output_goes_inside_the_url_and_the_lock_names_it(cache, memory_root, tmp_path):
    from fuelline.chat.prepare import ChatPrepareConfig, ChatPrepareStage
    from fuelline.io.lock import OutputBusy
    from fuelline.pipeline.output import RemoteOutput

    records = b"".join(orjson.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": f"{2 * i}"}) + b"\n"
                       for i in range(200))
    (tmp_path / "chat.jsonl").write_bytes(records)
    put(f"{memory_root}/chat.jsonl", records)
    options = RunOptions(workers=1, shard_size=80, progress=False)
    stage = ChatPrepareStage(ChatPrepareConfig(test_size=0.2))
    local = run_stage(stage, tmp_path / "chat.jsonl", tmp_path / "local", options)
    stats = run_stage(stage, f"{memory_root}/chat.jsonl", f"{memory_root}/out", options,
                      output_locations={"eval": f"{memory_root}/out/eval"})
    assert stats["outputs"] == local["outputs"] and local["outputs"]["eval"] > 0
    assert data(url_files(f"{memory_root}/out")) == data(local_files(tmp_path / "local"))
    with pytest.raises(ValueError, match=f"output 'eval' must be inside it .* not {memory_root}/elsewhere"):
        run_stage(stage, f"{memory_root}/chat.jsonl", f"{memory_root}/out2", options,
                  output_locations={"eval": f"{memory_root}/elsewhere"})
    with RemoteOutput(f"{memory_root}/out").lock():  # another run into the same URL on this machine
        with pytest.raises(OutputBusy, match=f"^{memory_root}/out \\(staged in .*\\) is being written by another"):
            run_stage(stage, f"{memory_root}/chat.jsonl", f"{memory_root}/out", options)
