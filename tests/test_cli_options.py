"""What `--help` and the option parser promise a new user (issue 36, first contact): required
options marked, boolean flags with their default, positionals named for what they are, one
spelling of thinking, and impossible numbers refused in one line, from the CLI and from a
pipeline file alike (the range is declared once, with the option). All in this process."""

import pytest

from .conftest import invoke_cli as fuelline


def help_of(*words) -> str:
    result = fuelline(*words, "--help")
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())  # click wraps lines


@pytest.mark.parametrize("words, flags", [
    (["cache", "build"], ["--model TEXT", "--layers TEXT"]),
    (["serve"], ["--model TEXT"]),
])
def test_help_marks_required_options(words, flags):
    text = help_of(*words)
    for flag in flags:
        after = text[text.index(flag):]
        assert "[required]" in after[:after.index(" --", 3)], (flag, after[:300])


def test_boolean_flags_show_their_default_and_export_megatron_names_its_input():
    text = help_of("cache", "build")
    assert "--force / --no-force" in text and "[default: --no-force]" in text
    assert "[default: --no-drop-truncated]" in help_of("chat", "regenerate")
    megatron = help_of("export", "megatron")
    assert "megatron [OPTIONS] TOKEN_DATASET" in megatron and " OUT " not in megatron


def test_thinking_is_one_flag_pair_and_the_old_spelling_is_refused_with_the_new_one(tmp_path):
    from fuelline.chat.regenerate import RegenerateConfig
    from fuelline.pipeline.config import load_pipeline

    assert "--thinking / --no-thinking" in help_of("chat", "regenerate")
    assert RegenerateConfig(thinking=False).sampling()["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in RegenerateConfig().sampling()
    old = fuelline("chat", "regenerate", "-i", str(tmp_path), "-o", str(tmp_path / "o.jsonl"), "--server", "a:1",
                   "--disable-thinking")
    assert old.exit_code == 2
    assert old.stderr == ("error: fuelline chat regenerate: option 'disable_thinking' is now 'thinking': write "
                          "thinking = false (--no-thinking) for disable_thinking = true\n")
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[[step]]\nuse = "regenerate"\ndisable_thinking = true\n')
    with pytest.raises(ValueError, match=r"#1 \(regenerate\): option 'disable_thinking' is now 'thinking'"):
        load_pipeline(pipeline)


@pytest.mark.parametrize("args, says", [
    (["pack", "--tokenizer", "{dir}", "--workers", "0"], "--workers must be at least 1, found 0"),
    (["clean", "--shard-size", "-5"], "--shard-size must be at least 1, found -5"),
    (["pack", "--tokenizer", "{dir}", "--val-fraction", "2"], "--val-fraction must be between 0 and 1, found 2.0"),
    (["pack", "--tokenizer", "{dir}", "--shard-size", "0"], "--shard-size must be at least 1, found 0"),
    (["chat", "regenerate", "--server", "a:1", "--top-p", "1.5"], "--top-p must be between 0 and 1, found 1.5"),
    (["chat", "regenerate", "--server", "a:1", "--concurrency", "0"], "--concurrency must be at least 1, found 0"),
    (["cache", "build", "--model", "{dir}", "--layers", "1", "--max-length", "-1"],
     "--max-length must be at least 1, found -1"),
    (["cache", "build", "--model", "{dir}", "--layers", "1", "--max-shard-bytes", "-1GiB"],
     "a size must be positive"),
    (["tokenizer", "train", "--vocab-size", "10"], "--vocab-size must be between 266 and 2,147,483,647, found 10"),
    (["dedup", "--ngram", "0"], "--ngram must be at least 1, found 0"),
    (["run", "{pipeline}", "--workers", "0"], "--workers must be at least 1, found 0"),
    # huge: found by benchmarks/reliability_cli.py as tracebacks (orjson, the BPE trainer)
    (["clean", "--shard-size", "99999999999999999999"], "--shard-size is out of range: 99999999999999999999 does "
                                                        "not fit in 64 bits"),
    (["tokenizer", "train", "--vocab-size", "99999999999"], "--vocab-size must be between 266 and 2,147,483,647, found 99999999999"),
    (["chat", "prepare", "--test-size", "-1"], "--test-size must be between 0 and 1, found -1.0"),
])
def test_impossible_numbers_on_the_command_line_are_one_line_and_exit_2(args, says, tmp_path):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[[step]]\nuse = "clean"\n')
    args = [a.format(dir=tmp_path, pipeline=pipeline) for a in args]
    if args[:2] == ["chat", "prepare"]:
        args += ["-i", str(pipeline), "--train-output", str(tmp_path / "out"), "--eval-output", str(tmp_path / "ev")]
    elif args[0] != "run":
        args += ["-i", str(pipeline), "-o", str(tmp_path / "out")]
    else:
        args += ["--run-dir", str(tmp_path / "run")]
    result = fuelline(*args)
    assert result.exit_code == 2, result.output
    assert says in result.stderr and "Traceback" not in result.output and "Usage:" not in result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize("table, says", [
    ('[defaults]\nworkers = 0\n[[step]]\nuse = "clean"\n', "[defaults]: option 'workers' must be at least 1, found 0"),
    ('[[step]]\nuse = "clean"\nshard_size = -1\n', "#1: option 'shard_size' must be at least 1, found -1"),
    ('[[step]]\nuse = "pack"\nval_fraction = 1e300\n', "option 'val_fraction' must be between 0 and 1, found 1e+300"),
    ('[[step]]\nuse = "regenerate"\nmax_tokens = 0\n', "option 'max_tokens' must be at least 1, found 0"),
    ('[[step]]\nuse = "regenerate"\ntemperature = nan\n', "option 'temperature' must be a number, not nan"),
    ('[[step]]\nuse = "regenerate"\nconcurrency = "64"\n', "option 'concurrency' must be an integer, found '64'"),
    ('[[step]]\nuse = "dedup"\nnum_perm = 0\n', "option 'num_perm' must be at least 1, found 0"),
    ('[[step]]\nuse = "dedup"\nkeep = "last"\n', "(dedup): option 'keep' must be one of first, longest, not 'last'"),
    ('[[step]]\nuse = "pack"\nchat_template = "chatlm"\n', "--chat-template chatlm: unknown chat template 'chatlm'"),
])
def test_impossible_values_in_a_pipeline_file_are_refused_when_it_is_loaded(table, says, tmp_path):
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(table)
    result = fuelline("run", str(pipeline), "--run-dir", str(tmp_path / "run"), "-i", str(pipeline))
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert says in line and not (tmp_path / "run").exists()


def _commands(command=None, words=()):
    """Every command of `fuelline` (sub-commands built lazily included) as its words."""
    import click

    from fuelline.cli import main

    command = command or main
    if not isinstance(command, click.Group):
        yield words
        return
    for name in command.list_commands(click.Context(command)):
        yield from _commands(command.get_command(click.Context(command), name), (*words, name))


@pytest.mark.parametrize("words", list(_commands()), ids=" ".join)
def test_every_command_takes_quiet_so_that_a_script_can_pass_it_to_any(words):
    quiet = fuelline(*words, "-q", "--quiet", "--help")  # parsed before --help acts: an unknown option is refused
    assert quiet.exit_code == 0, quiet.output
    assert "-q, --quiet" in quiet.output


@pytest.mark.parametrize("args, says", [
    (["chat", "regenerate", "-i", "{dir}", "--server", "a:1", "--reasoning", "keep"],
     "option 'reasoning' is now 'store_reasoning': the same option under its new name: store_reasoning = … "
     "(--store-reasoning …)"),
    (["chat", "regenerate", "-i", "{dir}", "--server", "a:1", "--turns", "last"],
     "option 'turns' is now 'regenerate_turns': the same option under its new name"),
    (["cache", "build", "-i", "{dir}", "--model", "{dir}", "--layers", "1", "--no-progress"],
     "--progress/--no-progress is now --quiet"),
    (["cache", "export", "--to", "specforge", "{dir}", "--progress"], "--progress/--no-progress is now --quiet"),
])
def test_an_earlier_spelling_is_refused_in_one_line_naming_the_new_one(args, says, tmp_path):
    result = fuelline(*[a.format(dir=tmp_path) for a in args], "-o", tmp_path / "out")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert says in line and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key, now", [("reasoning", "store_reasoning"), ("turns", "regenerate_turns")])
def test_a_regenerate_step_refuses_the_earlier_keys_naming_the_new_ones(key, now, tmp_path):
    from fuelline.pipeline.config import load_pipeline

    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[[step]]\nuse = "regenerate"\n{key} = "keep"\n')
    with pytest.raises(ValueError, match=rf"#1 \(regenerate\): option '{key}' is now '{now}'"):
        load_pipeline(pipeline)
