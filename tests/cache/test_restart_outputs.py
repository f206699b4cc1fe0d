"""A real tiny cache's commands (cache build, export in each format, vocab-map) under the overlap rule
and --restart: an output holding a user's file is refused, what they read is kept out of their output,
and the tree stays byte for byte as it was."""

from pathlib import Path

import pytest

from tests.conftest import invoke_cli
from tests.test_output_overlap import snapshot

from .test_build import write_chats

pytest.importorskip("torch")

BUILD = ["--layers", "0", "--min-loss-tokens", "1", "--batch-tokens", "256", "--min-shards", "2", "--device", "cpu"]


@pytest.fixture
def built(tiny_qwen3_dir, tmp_path, monkeypatch):
    """chats.jsonl, a cache cb/, its exports, a chat template tpl/t.toml; the working directory."""
    monkeypatch.chdir(tmp_path)
    write_chats(tmp_path / "chats.jsonl", 8)
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "t.toml").write_text('[mine]\nuser_header = "U:"\nassistant_header = "A:"\n')
    commands = [["cache", "build", "--model", tiny_qwen3_dir, "-i", "chats.jsonl", "-o", "cb", *BUILD],
                ["cache", "export", "--to", "specforge", "cb", "-o", "es"],
                ["cache", "export", "--to", "speculators", "cb", "-o", "ep"],
                ["cache", "export", "--to", "speculators", "--layout", "arrow", "cb", "-o", "ea"]]
    for command in commands:
        result = invoke_cli(*command, "-q")
        assert result.exit_code == 0, (command, result.output)
    return tmp_path, commands


def test_restart_of_each_cache_command_keeps_a_users_file_and_every_byte(built):
    root, commands = built
    for command in commands:
        (root / command[command.index("-o") + 1] / "notes.txt").write_text("mine\n")
    before = snapshot(root)
    for command in commands:
        result = invoke_cli(*command, "--restart", "-q")
        assert result.exit_code == 2 and "also holds notes.txt that fuelline did not write" in result.stderr, \
            (command, result.output)
        assert snapshot(root) == before, f"{command} changed the tree"
    (root / "es" / "notes.txt").unlink()
    assert invoke_cli(*commands[1], "--restart", "-q").exit_code == 0


def test_a_rerun_of_each_export_refuses_a_users_file_its_trainer_would_read_and_keeps_every_byte(built):
    """A plain rerun of an export deleted any file under its output its trainer's walker would read and
    no sample names: a user's my.ckpt (SpecForge), notes.pt (speculators' files at any depth, its Arrow
    layout's in hidden_states/)."""
    root, commands = built
    mine = {"es": "my.ckpt", "ep": "notes.pt", "ea": "hidden_states/notes.pt"}
    for output, name in mine.items():
        (root / output / name).parent.mkdir(exist_ok=True)
        (root / output / name).write_bytes(b"mine\n")
    before = snapshot(root)
    for command in commands[1:]:
        output = command[command.index("-o") + 1]
        result = invoke_cli(*command, "-q")
        assert result.exit_code == 2 and f"{output}/{mine[output]}: not written by this export" in result.stderr, \
            (command, result.output)
        assert snapshot(root) == before, f"{command} changed the tree"


def test_cache_outputs_overlapping_what_they_read_are_refused_unchanged(built, tiny_qwen3_dir):
    root, _ = built
    before = snapshot(root)
    for command, says in ((["cache", "export", "--to", "specforge", "cb", "-o", "cb/out"], "lies inside the input cb"),
                          (["cache", "vocab-map", "cb", "--draft-vocab", "8", "-o", "cb/map.pt"], "lies inside"),
                          (["cache", "build", "--model", tiny_qwen3_dir, "-i", "chats.jsonl", "-o", "tpl", *BUILD,
                            "--chat-template", "tpl/t.toml"], "contains the input tpl/t.toml"),
                          (["cache", "stream", "--model", tiny_qwen3_dir, "-i", "chats.jsonl", "-o", "tpl", *BUILD,
                            "--chat-template", "tpl/t.toml:mine"], "contains the input tpl/t.toml")):
        for restart in ([], ["--restart"]):
            result = invoke_cli(*command, *restart, "-q")
            assert result.exit_code == 2 and says in result.stderr, (command, result.output)
            assert snapshot(root) == before, f"{command} changed the tree"
