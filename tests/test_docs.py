"""Every command and Python block of the docs runs as written, in order, on this (CPU) machine.

Each page runs in a fresh directory laid out like a checkout beside ../shared (a link to the
shared data), so its relative paths resolve as they do for a user at the repository root.
Blocks of other languages (json, toml, text) are examples of file contents and are not run.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, shared_file

BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
PAGES = ["docs/chat.md"]


def runnable_blocks(page: Path) -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in BLOCK.findall(page.read_text(encoding="utf-8")) if lang in ("bash", "python")]


@pytest.mark.parametrize("page", PAGES)
def test_every_block_runs(page, tmp_path):
    shared_file("chat/gsm8k-train.jsonl.zst")  # skips, saying why, without the shared data
    blocks = runnable_blocks(ROOT / page)
    assert blocks, f"{page} has no runnable blocks"
    workdir = tmp_path / "checkout"
    workdir.mkdir()
    (tmp_path / "shared").symlink_to(shared_file("chat").parent.parent)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for k, (lang, body) in enumerate(blocks, start=1):
        command = [sys.executable, "-c", body] if lang == "python" else ["bash", "-euo", "pipefail", "-c", body]
        result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{page} block {k} ({lang}) failed:\n{body}\n{result.stdout}\n{result.stderr}"
