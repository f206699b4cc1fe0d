"""An output where nothing can be written (a read-only file system, no permission, a full disk or
quota) is one line naming the path and exit 2, never a traceback: the CLI's `write_refusal`."""

import errno
import os
import subprocess

import orjson
import pytest

from fuelline.io.atomic import write_refusal
from tests.conftest import invoke_cli


@pytest.mark.parametrize(("code", "words"), [(errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied"),
                                             (errno.EPERM, "not permitted"), (errno.ENOSPC, "no space left"),
                                             (errno.EDQUOT, "quota exceeded")])
def test_every_error_that_says_the_place_cannot_be_written_is_a_message_naming_it(code, words):
    message = write_refusal(OSError(code, os.strerror(code), "/data/out/part-00000.jsonl.zst"))
    assert words in message and "/data/out/part-00000.jsonl.zst" in message and "\n" not in message
    assert write_refusal(OSError(errno.EIO, "Input/output error", "/x")) is None  # a failing disk is no user error


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only tmpfs at tmp_path/ro; skipped where mounting is not allowed (it needs root)."""
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root (CI runs as root)")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount_point)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


def test_every_command_into_a_read_only_place_says_so_in_one_line(tmp_path, read_only_dir):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"id": f"d{i}", "text": f"document number {i} " * 5}) + b"\n"
                                for i in range(20)))
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[[step]]\nuse = "clean"\nworkers = 1\n')
    commands = [("clean", "-i", source, "-o", read_only_dir / "clean", "-q"),
                ("dedup", "-i", source, "-o", read_only_dir / "dedup", "-q"),
                ("tokenizer", "train", "-i", source, "-o", read_only_dir / "tok"),
                ("run", pipeline, "--run-dir", read_only_dir / "run", "-i", source, "-q")]
    for command in commands:
        result = invoke_cli(*command)
        assert result.exit_code == 2, (command, result.output)
        assert result.stderr.count("\n") == 1 and "read-only file system" in result.stderr \
            and str(read_only_dir) in result.stderr, result.stderr
    assert not any(read_only_dir.iterdir())
