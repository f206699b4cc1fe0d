import orjson
import pytest

from fuelline.io import read_records
from fuelline.pipeline.config import load_pipeline, run_pipeline

TWO_STEPS = """
[defaults]
workers = 1
shard_size = 3

[[step]]
use = "ingest"
text_key = "lines"
id_key = "key"

[[step]]
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


def test_a_two_step_pipeline_runs_and_resumes(tmp_path, corpus):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(TWO_STEPS)
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


def test_stage_tables_the_earlier_name_of_step_tables_still_run(tmp_path, corpus):
    steps, stages = tmp_path / "steps.toml", tmp_path / "stages.toml"
    steps.write_text(TWO_STEPS)
    stages.write_text(TWO_STEPS.replace("[[step]]", "[[stage]]"))
    as_steps = run_pipeline(load_pipeline(steps), tmp_path / "a", input=[str(corpus)], progress=False)
    as_stages = run_pipeline(load_pipeline(stages), tmp_path / "b", input=[str(corpus)], progress=False)
    assert [s["records_out"] for s in as_stages] == [s["records_out"] for s in as_steps] == [9, 4]
    assert list(read_records(tmp_path / "b" / "02-long_only")) == list(read_records(tmp_path / "a" / "02-long_only"))
    stages.write_text('[[stage]]\nuse = "ingest"\nmin_chars = "ten"\n')
    with pytest.raises(ValueError, match=r"\[\[stage\]\] #1 \(ingest\): option 'min_chars'"):  # named as written
        load_pipeline(stages)


def test_a_file_mixing_step_and_stage_tables_is_refused(tmp_path):
    mixed = tmp_path / "mixed.toml"
    mixed.write_text('[[step]]\nuse = "ingest"\n\n[[stage]]\nuse = "clean"\n')
    with pytest.raises(ValueError) as refused:
        load_pipeline(mixed)
    assert str(refused.value) == (f"{mixed}: both [[step]] and [[stage]] tables, whose order together is ambiguous; "
                                  "write every step as [[step]] ([[stage]] is its earlier name)")


@pytest.mark.parametrize("text, message", [
    ('[[step]]\nuse = "ingest"\ntext_kee = "x"\n', r"#1 \(ingest\): unknown option\(s\) text_kee"),
    ('[[step]]\nuse = "ingest"\nmin_chars = "ten"\n', r"option 'min_chars' must be an integer, found 'ten'"),
    ('[[step]]\nuse = "dedupe"\n', r"unknown step 'dedupe'"),
    ('[defaults]\nworkerz = 2\n[[step]]\nuse = "ingest"\n', r"\[defaults\]: unknown option\(s\) workerz"),
    ('[[step]]\nuse = "ingest"\n[[step]]\nuse = "ingest"\n', r"step name 'ingest' is used twice"),
    ("[[step]\n", r"invalid TOML"),
])
def test_pipeline_file_errors_name_the_problem(tmp_path, text, message):
    pipeline = tmp_path / "bad.toml"
    pipeline.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_pipeline(pipeline)
