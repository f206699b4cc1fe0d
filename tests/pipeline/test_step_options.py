"""Every step's options come from its Config: the CLI and a pipeline file accept the same keys,
with the same defaults, and a key given in a pipeline file reaches the step."""

import dataclasses

import orjson
import pytest
from click.testing import CliRunner

from fuelline.cli import main
from fuelline.pipeline.config import load_pipeline, run_pipeline

# step -> (its CLI command, the arguments it requires besides --input and --output)
STEPS = {
    "pack": (["pack"], ["--tokenizer", "{dir}"]),
    "tokenizer": (["tokenizer", "train"], []),
}
NOT_OPTIONS = {"inputs", "output", "workers", "restart", "quiet", "executor", "ray_address"}  # where and how it runs


def _command(words):
    command = main
    for word in words:
        command = command.commands[word]
    return command


def _cli_config(step, tmp_path, monkeypatch):
    """The config the CLI command builds when given only what it requires."""
    from fuelline.pipeline import config

    words, required = STEPS[step]
    seen, build = [], config.build_dataclass

    def capture(*args):
        seen.append(build(*args))
        raise SystemExit(0)  # built: the command need not run

    monkeypatch.setattr(config, "build_dataclass", capture)
    args = [a.format(dir=tmp_path) for a in required]
    result = CliRunner().invoke(main, [*words, "-i", str(tmp_path), "-o", str(tmp_path / "out"), *args])
    assert seen, result.output
    return seen[0]


@pytest.mark.parametrize("step", STEPS)
def test_the_cli_and_a_pipeline_file_take_the_same_keys_and_defaults(step, tmp_path, monkeypatch):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[[stage]]\nuse = "{step}"\n')
    from_file = load_pipeline(pipeline)[0].stage.config
    keys = {f.name for f in dataclasses.fields(from_file)}
    assert {p.name for p in _command(STEPS[step][0]).params} - NOT_OPTIONS == keys
    from_cli = _cli_config(step, tmp_path, monkeypatch)
    references = {f.name for f in dataclasses.fields(from_file) if f.metadata.get("step_ref")}  # @STEP in a file
    assert {k: v for k, v in dataclasses.asdict(from_cli).items() if k not in references} == \
        {k: v for k, v in dataclasses.asdict(from_file).items() if k not in references}


def test_a_pack_steps_shard_size_sets_its_number_of_shards(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_bytes(b"".join(orjson.dumps({"id": f"d{i}", "text": f"春眠不觉晓 {i}"}) + b"\n" for i in range(7)))
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[defaults]\nworkers = 1\n[[stage]]\nuse = "tokenizer"\nvocab_size = 300\n'
                        f'[[stage]]\nuse = "pack"\ninput = "{docs}"\ntemplate = "plain"\nshard_size = 3\n')
    stats = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(docs)], progress=False)
    assert stats[1]["records_out"] == 7
    assert sum(stats[1]["encoder"].values()) == 3  # one entry per shard: 3 + 3 + 1 records


def test_a_pack_step_refuses_an_unknown_key_and_lists_the_known_ones(tmp_path):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[[stage]]\nuse = "pack"\nshard_sise = 3\n')
    with pytest.raises(ValueError, match=r"unknown option\(s\) shard_sise; valid: .*shard_size"):
        load_pipeline(pipeline)
