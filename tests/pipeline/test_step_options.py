"""Every step's options come from its Config: the CLI and a pipeline file accept the same keys,
with the same defaults, and a key given in a pipeline file reaches the step."""

import dataclasses

import orjson
import pytest
from click.testing import CliRunner

from fuelline.cli import main
from fuelline.pipeline.config import RUN_OPTION_KEYS, load_pipeline, run_pipeline
from fuelline.pipeline.options import option_fields
from fuelline.pipeline.registry import STAGES
from fuelline.serve.launcher import ServeConfig

# step -> (its CLI command, the arguments it requires besides --input and --output, the same as pipeline keys)
STEPS = {
    "pack": (["pack"], ["--tokenizer", "{dir}"], ""),
    "tokenizer": (["tokenizer", "train"], [], ""),
    "regenerate": (["chat", "regenerate"], [], ""),
    # the model is resolved when a pipeline file is loaded: a directory that exists
    "cache": (["cache", "build"], ["--model", "{dir}", "--layers", "1,9"], 'model = "{dir}"\nlayers = [1, 9]\n'),
    **{stage: ([stage], [], "") for stage in ("ingest", "boilerplate", "clean", "dedup")},
    "chat-from-poetry": (["chat", "from-poetry"], [], ""),
}
# how it runs: the run options (pipeline files: [defaults] or the step's table, as RunOptions) and the command line's own
NOT_OPTIONS = {"inputs", "output", "restart", "resume", "quiet", "progress", *RUN_OPTION_KEYS}
STAGE_RUN = {"config_file", "explain"}  # a record stage's options from a TOML file; --explain instead of running
PIPELINE_ONLY = {"regenerate": {"serve_" + f.name for f, _ in option_fields(ServeConfig)}}  # servers a step starts


def _command(words):
    command = main
    for word in words:
        command = command.get_command(None, word)
    return command


def _cli_config(step, tmp_path, monkeypatch, *given):
    """The config the CLI command builds when given what it requires and `given`."""
    from fuelline.pipeline import config

    words, required, _ = STEPS[step]
    seen, build = [], config.build_dataclass

    def capture(*args):
        seen.append(build(*args))
        raise SystemExit(0)  # built: the command need not run

    monkeypatch.setattr(config, "build_dataclass", capture)
    args = [a.format(dir=tmp_path) for a in required]
    result = CliRunner().invoke(main, [*words, "-i", str(tmp_path), "-o", str(tmp_path / "out"), *args, *given])
    assert seen, result.output
    return seen[0]


@pytest.mark.parametrize("step", STEPS)
def test_the_cli_and_a_pipeline_file_take_the_same_keys_and_defaults(step, tmp_path, monkeypatch):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[[step]]\nuse = "{step}"\n{STEPS[step][2].format(dir=tmp_path)}')
    from_file = load_pipeline(pipeline)[0].step.config
    keys = {f.name for f, _ in option_fields(type(from_file))} - PIPELINE_ONLY.get(step, set())
    run = NOT_OPTIONS | (STAGE_RUN if step in STAGES else set())
    # hidden: old spellings; on_error is a run option and pack's and the cache's own
    assert {p.name for p in _command(STEPS[step][0]).params if not p.hidden} - (run - keys) == keys
    from_cli = _cli_config(step, tmp_path, monkeypatch)
    references = {f.name for f, _ in option_fields(type(from_file)) if f.metadata.get("step_ref")}  # @STEP in a file
    compared = dataclasses.asdict(from_file).keys() - references - {"serve"}  # the servers a pipeline step starts
    assert {k: dataclasses.asdict(from_cli)[k] for k in compared} == {k: dataclasses.asdict(from_file)[k] for k in compared}


def test_a_pack_steps_shard_size_sets_its_number_of_shards(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_bytes(b"".join(orjson.dumps({"id": f"d{i}", "text": f"春眠不觉晓 {i}"}) + b"\n" for i in range(7)))
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[defaults]\nworkers = 1\n[[step]]\nuse = "tokenizer"\nvocab_size = 300\n'
                        f'[[step]]\nuse = "pack"\ninput = "{docs}"\ntemplate = "plain"\nshard_size = 3\n')
    stats = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(docs)], progress=False)
    assert stats[1]["records_out"] == 7
    assert sum(stats[1]["encoder"].values()) == 3  # one entry per shard: 3 + 3 + 1 records


def test_a_pack_step_refuses_an_unknown_key_and_lists_the_known_ones(tmp_path):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[[step]]\nuse = "pack"\nval_fractoin = 0.1\n')
    with pytest.raises(ValueError, match=r"unknown option\(s\) val_fractoin; valid: .*val_fraction"):
        load_pipeline(pipeline)


def test_regenerate_options_reach_its_config_from_the_cli_and_from_a_pipeline_file(tmp_path, monkeypatch):
    from_cli = _cli_config("regenerate", tmp_path, monkeypatch, "--server", "a:1", "--server", "b:2",
                           "--finish-reasons", "stop,abort", "--concurrency", "3", "--no-thinking")
    monkeypatch.undo()
    assert (from_cli.servers, from_cli.finish_reasons, from_cli.client.concurrency, from_cli.thinking) == \
        (["a:1", "b:2"], ["stop", "abort"], 3, False)
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[[step]]\nuse = "regenerate"\nmodel = "m"\nconcurrency = 3\nfinish_reasons = ["stop"]\n')
    step = load_pipeline(pipeline)[0].step
    assert (step.config.client.concurrency, step.config.finish_reasons) == (3, ["stop"])
    identity = step.identity([])["config"]
    assert identity["model"] == "m" and identity["finish_reasons"] == ["stop"]
    assert not {"servers", "servers_file", "concurrency", "serve_ports", "backoff"} & identity.keys()  # how, not what


def test_cache_build_takes_sizes_layers_and_inline_writes_as_users_write_them(tmp_path, monkeypatch):
    config = _cli_config("cache", tmp_path, monkeypatch, "--max-shard-bytes", "1GiB", "--inline-writes",
                         "--layers", "-1, 3")
    assert (config.layers, config.max_shard_bytes, config.inline_writes, config.queue_bytes) == \
        ([-1, 3], 1 << 30, True, 4 << 30)
    monkeypatch.undo()
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[[step]]\nuse = "cache"\nmodel = "{tmp_path}"\nlayers = [2]\nqueue_bytes = 1024\n'
                        'device = "cpu"\n')  # the model is resolved when the file is loaded: a directory
    step = load_pipeline(pipeline)[0].step
    assert step.config.queue_bytes == 1024
    identity = step.identity([])["config"]
    assert identity["layers"] == [2] and not {"model", "device", "force", "inline_writes", "queue_bytes"} & identity.keys()


def test_chat_prepare_takes_the_keys_of_its_config():
    """Its command has train and eval outputs of its own; its options are its Config's, as every stage's."""
    from fuelline.pipeline.registry import step_class

    outputs = {"train_output", "eval_output", "work_dir"}
    assert {p.name for p in _command(["chat", "prepare"]).params} - NOT_OPTIONS - STAGE_RUN - outputs == \
        {f.name for f, _ in option_fields(step_class("chat-prepare").Config)}


def test_serve_takes_the_options_a_regenerate_step_takes_as_serve_keys(tmp_path):
    """`fuelline serve --ports 30001` and a regenerate step's `serve_ports = "30001"` are one option."""
    command_only = {"log_dir", "servers_file", "check_interval", "extra_args", "quiet"}  # a foreground command's own
    serve = {f.name: f for f, _ in option_fields(ServeConfig)}
    assert {p.name for p in _command(["serve"]).params} - command_only == serve.keys()
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[[step]]\nuse = "regenerate"\nserve_model = "{tmp_path}"\nserve_ports = "30001"\n')
    config = load_pipeline(pipeline)[0].step.config
    assert (config.serve.model, config.serve.ports, config.serve.engine) == (str(tmp_path), "30001",
                                                                             ServeConfig().engine)
    with pytest.raises(ValueError, match=r"unknown option\(s\) serve_prots; valid: .*serve_ports"):
        pipeline.write_text('[[step]]\nuse = "regenerate"\nserve_prots = "30001"\n')
        load_pipeline(pipeline)


def test_the_report_has_no_options_but_its_run_directory():
    from fuelline.pipeline.registry import step_class

    assert option_fields(step_class("report").Config) == []
    assert {p.name for p in _command(["report"]).params} == {"run_dir", "as_json", "quiet"}


def test_a_step_resumes_refuses_other_options_naming_them_and_restarts(tmp_path):
    """The one resume contract, on the tokenizer step: done is found again, other options are refused
    naming the option, --restart redoes it; an unfinished run of other options is replaced."""
    from fuelline.io.stage_layout import PLAN_FILE
    from fuelline.pipeline.workdir import StepOutputMismatch

    docs = tmp_path / "docs.jsonl"
    docs.write_bytes(b"".join(orjson.dumps({"id": f"d{i}", "text": f"春眠不觉晓 {i}"}) + b"\n" for i in range(7)))
    pipeline, other = tmp_path / "p.toml", tmp_path / "q.toml"
    pipeline.write_text('[[step]]\nuse = "tokenizer"\nvocab_size = 300\n')
    other.write_text('[[step]]\nuse = "tokenizer"\nvocab_size = 320\n')
    first = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(docs)], progress=False)[0]
    again = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(docs)], progress=False)[0]
    assert again["resumed"] and again["identity"] == first["identity"] and "resumed" not in first
    with pytest.raises(StepOutputMismatch, match=r"different config\.vocab_size; pass --restart"):
        run_pipeline(load_pipeline(other), tmp_path / "run", input=[str(docs)], progress=False)
    redone = run_pipeline(load_pipeline(other), tmp_path / "run", input=[str(docs)], progress=False, restart=True)[0]
    assert redone["identity"]["config"]["vocab_size"] == 320 and "resumed" not in redone
    step_dir = tmp_path / "run" / "01-tokenizer"
    (step_dir / "stats.json").unlink()  # stopped before its end: nothing of it is kept
    assert (step_dir / PLAN_FILE).exists()
    replaced = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(docs)], progress=False)[0]
    assert replaced["identity"] == first["identity"] and "resumed" not in replaced
    stranger = tmp_path / "mine"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("not a step's")
    from fuelline.pipeline.registry import make_step
    from fuelline.pipeline.workers import RunOptions

    with pytest.raises(StepOutputMismatch, match="is not a fuelline stage output"):
        make_step("tokenizer", load_pipeline(pipeline)[0].step.config).run([str(docs)], stranger, RunOptions(), {})
    assert (stranger / "notes.txt").read_text() == "not a step's"


def test_an_output_made_before_an_option_existed_is_found_again_at_its_default(tmp_path):
    """A step finished by an older fuelline lacks the options added since: they stand for their defaults."""
    from fuelline.pipeline.workdir import StepOutputMismatch

    docs = tmp_path / "docs.jsonl"
    docs.write_bytes(b"".join(orjson.dumps({"id": f"d{i}", "text": f"春眠不觉晓 {i}"}) + b"\n" for i in range(7)))
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[[step]]\nuse = "tokenizer"\nvocab_size = 300\n')
    run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(docs)], progress=False)
    stats_file = tmp_path / "run" / "01-tokenizer" / "stats.json"
    stats = orjson.loads(stats_file.read_bytes())
    del stats["identity"]["config"]["min_frequency"]  # as if the option came later
    stats_file.write_bytes(orjson.dumps(stats))
    again = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(docs)], progress=False)[0]
    assert again["resumed"]
    pipeline.write_text('[[step]]\nuse = "tokenizer"\nvocab_size = 300\nmin_frequency = 3\n')
    with pytest.raises(StepOutputMismatch, match=r"different config\.min_frequency"):
        run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(docs)], progress=False)


def test_an_output_made_before_a_rename_or_a_moved_option_is_found_again_and_a_change_is_refused(tmp_path):
    """An older identity is read in today's terms: regenerate's `reasoning` and `turns` are now
    `store_reasoning` and `regenerate_turns`. A pack of chat records made with the old chat-encoding
    defaults is refused, naming the option."""
    from fuelline.chat.regenerate_step import RegenerateStep
    from fuelline.pack.packer import PackConfig
    from fuelline.pipeline.options import identity_history, identity_values
    from fuelline.pipeline.stats import StepStats
    from fuelline.pipeline.workdir import StepOutputMismatch, WorkDir

    step = RegenerateStep()
    now = step.identity([])
    renamed = {"store_reasoning": "reasoning", "regenerate_turns": "turns"}
    old = {**now, "config": {renamed.get(k, k): v for k, v in now["config"].items()}}
    StepStats("regenerate", 1, 1, identity=old).write(tmp_path / "regenerated")
    assert step.work_dir(tmp_path / "regenerated", []).finished()["resumed"]
    kept = RegenerateStep(RegenerateStep.Config(store_reasoning="keep"))  # the same output, asked with another value
    with pytest.raises(StepOutputMismatch, match=r"different config\.store_reasoning; pass --restart"):
        kept.work_dir(tmp_path / "regenerated", []).finished()

    chat = {"config": identity_values(PackConfig(template="chat"))}
    StepStats("pack", 1, 1, identity={"config": {**chat["config"], "chat_template": "chatml"}}).write(tmp_path / "sft")
    with pytest.raises(StepOutputMismatch, match=r"different config\.chat_template; pass --restart"):
        WorkDir(tmp_path / "sft", chat, **identity_history(PackConfig), reads=[]).finished()
