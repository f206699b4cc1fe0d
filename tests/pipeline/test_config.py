import orjson
import pytest

from fuelline.io import read_records
from fuelline.pipeline.config import load_pipeline, run_pipeline

TWO_STAGES = """
[defaults]
workers = 1
shard_size = 3

[[stage]]
use = "ingest"
text_key = "lines"
id_key = "key"

[[stage]]
use = "ingest"
name = "long_only"
min_chars = 8
"""


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    records = [{"key": f"k{i}", "lines": ["床前明月光", "疑是地上霜"][: 1 + i % 2], "src": "x"} for i in range(8)]
    records.append({"lines": ["短句"]})  # no key: id from file name and line
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def test_a_two_stage_pipeline_runs_and_resumes(tmp_path, corpus):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(TWO_STAGES)
    run_dir = tmp_path / "run"
    first = run_pipeline(load_pipeline(pipeline), run_dir, input=[str(corpus)], progress=False)
    assert [s["records_out"] for s in first] == [9, 4]
    assert first[1]["dropped"] == {"too_short": 5}
    docs = list(read_records(run_dir / "02-long_only"))
    assert all(d["text"] == "床前明月光\n疑是地上霜" for d in docs)
    assert [d["id"] for d in docs] == ["k1", "k3", "k5", "k7"]
    assert orjson.loads((run_dir / "pipeline.json").read_bytes())["stages"][1]["dir"] == "02-long_only"
    second = run_pipeline(load_pipeline(pipeline), run_dir, input=[str(corpus)], progress=False)
    assert [s["resumed_shards"] for s in second] == [s["shards"] for s in first]


@pytest.mark.parametrize("text, message", [
    ('[[stage]]\nuse = "ingest"\ntext_kee = "x"\n', r"#1 \(ingest\): unknown option\(s\) text_kee"),
    ('[[stage]]\nuse = "ingest"\nmin_chars = "ten"\n', r"option 'min_chars' must be an integer, found 'ten'"),
    ('[[stage]]\nuse = "dedupe"\n', r"unknown stage 'dedupe'"),
    ('[defaults]\nworkerz = 2\n[[stage]]\nuse = "ingest"\n', r"\[defaults\]: unknown option\(s\) workerz"),
    ('[[stage]]\nuse = "ingest"\n[[stage]]\nuse = "ingest"\n', r"step name 'ingest' is used twice"),
    ("[[stage]\n", r"invalid TOML"),
])
def test_pipeline_file_errors_name_the_problem(tmp_path, text, message):
    pipeline = tmp_path / "bad.toml"
    pipeline.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_pipeline(pipeline)
