"""Outputs that overlap inputs, or each other, refused by every command before it touches the disk.

One tree holds inputs and a finished output; each refused command (output = input, output inside
an input, input inside the output, two outputs on one path; spelled relative, absolute, through a
symlink and through `..`; each with and without --restart) must exit 2 with one line naming both
paths, and leave the tree byte for byte as it was."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import orjson
import pytest

from fuelline.io import read_records
from tests.conftest import invoke_cli, shared_file

CHAT = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"question {i}?"},
                                          {"from": "gpt", "value": f"answer {i}."}]} for i in range(12)]


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under `root`, hidden ones included: a file's bytes, a link's target, a directory."""
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory, name)
            key = path.relative_to(root).as_posix()
            found[key] = (f"-> {os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir()
                          else path.read_bytes())
    return found


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """corpus.jsonl, d/corpus.jsonl, cl/ (clean's finished output, a user's notes beside its parts),
    chat.jsonl, empty.jsonl, a pipeline file, and `link` to d; the working directory is the tree."""
    raw = list(itertools.islice(read_records(shared_file("chinese-poetry.jsonl.zst")), 30))
    (tmp_path / "d").mkdir()
    for path in (tmp_path / "corpus.jsonl", tmp_path / "d" / "corpus.jsonl"):
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in raw))
    (tmp_path / "chat.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in CHAT))
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "clean.toml").write_text('[[step]]\nuse = "clean"\n')
    (tmp_path / "link").symlink_to("d")
    monkeypatch.chdir(tmp_path)
    assert invoke_cli("clean", "-i", "corpus.jsonl", "-o", "cl", "-q").exit_code == 0
    (tmp_path / "cl" / "notes.txt").write_text("mine\n")
    return tmp_path


def refused_commands(root: Path, tokenizer: Path) -> list[tuple[list, str]]:
    """(the command, what its one-line refusal must say)."""
    tok = ["--tokenizer", tokenizer]
    return [
        (["dedup", "-i", "cl", "-o", "cl"], "output cl is the input cl"),
        (["pack", "-i", "cl", "-o", "cl", *tok], "output cl is the input cl"),
        (["pack", "-i", "cl", "-o", root / "d" / ".." / "cl", *tok], "is the input cl"),
        (["boilerplate", "-i", root / "cl", "-o", "cl"], "is the input"),
        (["clean", "-i", "d", "-o", "d/out"], "output d/out lies inside the input d"),
        (["clean", "-i", "link", "-o", "d/out"], "output d/out lies inside the input link"),
        (["clean", "-i", "d", "-o", "link"], "output link is the input d"),
        (["clean", "-i", "d/corpus.jsonl", "-o", "d"], "output d contains the input d/corpus.jsonl"),
        (["clean", "-i", "d/*.jsonl", "-o", "d"], "output d contains the input d/corpus.jsonl"),
        (["tokenizer", "train", "-i", "cl", "-o", "cl/tok"], "output cl/tok lies inside the input cl"),
        (["decontaminate", "-i", "cl", "-o", "cl", "--against", "corpus.jsonl:title"], "output cl is the input cl"),
        (["chat", "prepare", "-i", "chat.jsonl", "--train-output", "same.jsonl", "--eval-output", "same.jsonl"],
         "output same.jsonl is the output same.jsonl"),
        (["chat", "prepare", "-i", "chat.jsonl", "--train-output", "chat.jsonl", "--eval-output", "e.jsonl"],
         "output chat.jsonl is the input chat.jsonl"),
        (["chat", "prepare", "-i", "chat.jsonl", "--train-output", "t", "--eval-output", "t"],
         "output t is the output t"),
        (["chat", "regenerate", "-i", "chat.jsonl", "-o", "chat.jsonl", "--server", "http://127.0.0.1:9",
          "--model", "m"], "output chat.jsonl is the input chat.jsonl"),
        (["run", "clean.toml", "-i", "d", "-o", "d"], "output d is the input d"),
        (["run", "clean.toml", "-i", "d", "-o", "d/run"], "output d/run lies inside the input d"),
        (["clean", "-i", "empty.jsonl", "-o", "e"], "empty.jsonl: empty"),
        (["clean", "-i", "corpus.jsonl", "-i", "./corpus.jsonl", "-o", "twice"], "among the inputs twice"),
        (["clean", "-i", "d", "-i", "link/corpus.jsonl", "-o", "twice"], "among the inputs twice"),
    ]


def test_refused_commands_leave_the_tree_byte_for_byte_as_it_was(tree, tokenizer_dir):
    before = snapshot(tree)
    for command, says in refused_commands(tree, tokenizer_dir):
        for restart in ([], ["--restart"]):
            result = invoke_cli(*command, *restart, "-q")
            where = " ".join(map(str, command + restart))
            assert result.exit_code == 2, (where, result.output, result.exception)
            assert says in result.stderr and result.stderr.count("\n") == 1, (where, result.stderr)
            assert snapshot(tree) == before, f"{where} changed the tree"


def test_a_finished_output_read_again_by_the_next_step_is_not_deleted_by_its_advice(tree):
    """`dedup -i cl -o cl` once advised --restart, which deleted cl, the input, and then failed."""
    for restart in ([], ["--restart"]):
        result = invoke_cli("dedup", "-i", "cl", "-o", "cl", *restart, "-q")
        assert result.exit_code == 2 and "--restart to delete" not in result.stderr
    assert sum(1 for _ in read_records(tree / "cl")) > 0


def test_chat_prepare_into_one_file_twice_is_refused_not_half_written(tree):
    result = invoke_cli("chat", "prepare", "-i", "chat.jsonl", "--train-output", "same.jsonl", "--eval-output",
                        "same.jsonl", "--test-size", "0.25", "-q")
    assert result.exit_code == 2 and not (tree / "same.jsonl").exists()
    result = invoke_cli("chat", "prepare", "-i", "chat.jsonl", "--train-output", "train.jsonl", "--eval-output",
                        "eval.jsonl", "--test-size", "0.25", "-q")
    assert result.exit_code == 0, result.output
    lines = [len((tree / name).read_bytes().splitlines()) for name in ("train.jsonl", "eval.jsonl")]
    assert sum(lines) == len(CHAT) and min(lines) > 0


def test_the_same_spellings_of_apart_paths_still_run(tree):
    """Not every neighbour is an overlap: d/out beside d/corpus.jsonl, a sibling named like a prefix."""
    assert invoke_cli("clean", "-i", "d/corpus.jsonl", "-o", "d/out", "-q").exit_code == 0
    assert invoke_cli("dedup", "-i", "cl", "-o", "cl2", "-q").exit_code == 0
    assert invoke_cli("dedup", "-i", "cl", "-o", "cl2", "-q").exit_code == 0  # resumed: found finished


def test_restart_refuses_an_output_holding_a_users_file_and_keeps_every_byte(tree, tokenizer_dir):
    """--restart deleted the whole output directory, the user's notes.txt beside its parts with it."""
    assert invoke_cli("tokenizer", "train", "-i", "cl", "-o", "tok", "--vocab-size", "400", "-q").exit_code == 0
    assert invoke_cli("pack", "-i", "cl", "-o", "pk", "--tokenizer", tokenizer_dir, "-q").exit_code == 0
    assert invoke_cli("run", "clean.toml", "-i", "corpus.jsonl", "-o", "run", "-q").exit_code == 0
    for output in ("tok", "pk", "run/01-clean"):
        (tree / output / "notes.txt").write_text("mine\n")
    before = snapshot(tree)
    for command in (["clean", "-i", "corpus.jsonl", "-o", "cl", "--restart"],
                    ["tokenizer", "train", "-i", "cl", "-o", "tok", "--vocab-size", "400", "--restart"],
                    ["pack", "-i", "cl", "-o", "pk", "--tokenizer", tokenizer_dir, "--restart"],
                    ["run", "clean.toml", "-i", "corpus.jsonl", "-o", "run", "--restart"],
                    ["run", "clean.toml", "-i", "corpus.jsonl", "-o", "run", "--restart-from", "clean"]):
        result = invoke_cli(*command, "-q")
        assert result.exit_code == 2 and "which also holds notes.txt that fuelline did not write" in result.stderr, \
            (command, result.output)
        assert snapshot(tree) == before, f"{command} changed the tree"


def test_a_pipeline_refusing_to_delete_a_users_file_names_the_option_typed(tree):
    """Inside `fuelline run --restart-from STEP` the refusal said `--restart would delete …`, an option
    the user did not type."""
    assert invoke_cli("run", "clean.toml", "-i", "corpus.jsonl", "-o", "run", "-q").exit_code == 0
    (tree / "run" / "01-clean" / "notes.txt").write_text("mine\n")
    before = snapshot(tree)
    for option, says in ((["--restart-from", "clean"], "--restart-from clean"), (["--restart"], "--restart")):
        result = invoke_cli("run", "clean.toml", "-i", "corpus.jsonl", "-o", "run", *option, "-q")
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"error: {says} would delete run/01-clean, which also holds notes.txt "), \
            result.stderr
        assert snapshot(tree) == before


def test_restart_redoes_a_step_keeping_the_hidden_files_it_did_not_write(tree):
    (tree / "cl" / "notes.txt").unlink()
    (tree / "cl" / ".DS_Store").write_bytes(b"finder")
    (tree / "run").mkdir()
    (tree / "run" / "notes.txt").write_text("the run directory is the user's too\n")
    assert invoke_cli("clean", "-i", "corpus.jsonl", "-o", "cl", "--restart", "-q").exit_code == 0
    assert invoke_cli("run", "clean.toml", "-i", "corpus.jsonl", "-o", "run", "-q").exit_code == 0
    assert invoke_cli("run", "clean.toml", "-i", "corpus.jsonl", "-o", "run", "--restart", "-q").exit_code == 0
    assert (tree / "cl" / ".DS_Store").read_bytes() == b"finder" and sum(1 for _ in read_records(tree / "cl")) == 30
    assert (tree / "run" / "notes.txt").exists()


def test_what_a_step_reads_beside_its_inputs_is_kept_out_of_its_output(tree):
    """An evaluation set, a servers file, a --config file or a pipeline file inside the output: refused,
    unchanged, as an input is."""
    (tree / "d" / "c.toml").write_text('profile = "poetry"\n')
    (tree / "d" / "servers.json").write_text('{"format": "fuelline.servers", "version": 1, "model": "m", '
                                             '"servers": [{"url": "http://127.0.0.1:9"}]}')
    (tree / "d" / "p.toml").write_text('[[step]]\nuse = "clean"\n')
    before = snapshot(tree)
    for command, read in ((["decontaminate", "-i", "cl", "-o", "d", "--against", "d/corpus.jsonl:title"], "d/corpus.jsonl"),
                          (["clean", "-i", "corpus.jsonl", "-o", "d", "--config", "d/c.toml"], "d/c.toml"),
                          (["chat", "regenerate", "-i", "chat.jsonl", "-o", "d", "--servers-file", "d/servers.json"],
                           "d/servers.json"),
                          (["run", "d/p.toml", "-i", "corpus.jsonl", "-o", "d"], "d/p.toml")):
        result = invoke_cli(*command, "-q")
        assert result.exit_code == 2 and f"contains the input {read}" in result.stderr, (command, result.output)
        assert snapshot(tree) == before, f"{command} changed the tree"
