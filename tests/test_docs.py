"""Every command and Python block of the README and the docs runs as written, in order, on this
(CPU) machine.

Each page runs in a fresh directory laid out like a checkout beside ../shared (a link to the
shared data, and `configs/` and `examples/` linked from the repository), so its relative paths
resolve as they do for a user at the repository root; a page makes what it needs (e.g. `fuelline demo --dir
runs/demo`) in an earlier block of the same page. The pages that start with that demo share one
run of it: its output is copied into each page's checkout (always at the same path, so the
copy is the demo's own output there), and the page's own `fuelline demo` resumes it, as a
second demo in the same place does for a user. Blocks of other languages (json, toml, text)
are examples of file contents or of commands that cannot run here (a GPU) and are not run.

A bash or python block is left out only when the line right before its fence is the marker
`<!-- docs-test: skip (REASON) -->` (invisible once rendered). Only the README's set-up block
carries it: it installs packages, which a test must not do; `test_only_the_setup_block_is_skipped`
keeps it that way.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import ROOT, shared_file

SKIP = "<!-- docs-test: skip"
BLOCK = re.compile(r"^(<!-- docs-test: skip[^\n]*-->\n)?```(\w+)\n(.*?)^```", re.S | re.M)
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
# Pages whose examples serve and run the real SmolLM2 on this CPU (minutes each): run by `-m slow`.
REAL_MODEL_PAGES = {"README.md", "docs/cache.md"}
SETUP = 'pip install -e . && fuelline demo\npip install -e ".[dev]" && python -m pytest -q\n'
DEMO = "fuelline demo --dir runs/demo"


def blocks(page: Path) -> list[tuple[bool, str, str]]:
    """(skipped, language, body) of every fenced block of a page, in order."""
    return [(bool(marker), lang, body) for marker, lang, body in BLOCK.findall(page.read_text(encoding="utf-8"))]


def runnable_blocks(page: Path) -> list[tuple[str, str]]:
    return [(lang, body) for skipped, lang, body in blocks(page) if lang in ("bash", "python") and not skipped]


def test_only_the_setup_block_is_skipped():
    readme = blocks(ROOT / "README.md")
    assert readme[0] == (True, "bash", SETUP), "the README starts with the two set-up commands, unchanged"
    others = [(page, body) for page in PAGES for k, (skipped, _, body) in enumerate(blocks(ROOT / page))
              if skipped and (page, k) != ("README.md", 0)]
    assert not others, f"blocks skipped by the docs test besides the README's set-up: {others}"


def run_block(page: str, k: int, lang: str, body: str, checkout: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = [sys.executable, "-c", body] if lang == "python" else ["bash", "-euo", "pipefail", "-c", body]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"{page} block {k} ({lang}) failed:\n{body}\n{result.stdout}\n{result.stderr}"
    print(f"{page} block {k} ({lang}): {time.perf_counter() - start:.1f}s")


@pytest.fixture(scope="module")
def docs_root(tmp_path_factory) -> Path:
    """The directory that holds the pages' checkout and, beside it, `shared` (a link to the shared data)."""
    shared_file("chinese-poetry.jsonl.zst")  # skips, saying why, without the shared data
    root = tmp_path_factory.mktemp("docs")
    (root / "shared").symlink_to(shared_file("chat").parent.parent)
    return root


def starts_with_the_demo(body: str) -> bool:
    return body.splitlines()[0].split("#")[0].strip() == DEMO


def fresh_checkout(root: Path) -> Path:
    """ROOT/checkout, emptied, with `configs/` and `examples/` linked from the repository."""
    checkout = root / "checkout"
    shutil.rmtree(checkout, ignore_errors=True)
    checkout.mkdir()
    for name in ("configs", "examples"):
        (checkout / name).symlink_to(ROOT / name)
    return checkout


@pytest.fixture(scope="module")
def demo_output(docs_root) -> Path:
    """What `fuelline demo --dir runs/demo` leaves in a checkout, run once for every page that starts with it."""
    checkout = fresh_checkout(docs_root)
    run_block("the shared demo", 1, "bash", DEMO, checkout)
    kept = docs_root / "demo"
    (checkout / "runs" / "demo").rename(kept)
    return kept


def page_marks(page: str) -> list:
    """A page runs many commands (chat.md: about a minute on a quiet machine), hence its own timeout.
    Pages share nothing but the demo, so the xdist workers take them one by one (tests/conftest.py)."""
    if page in REAL_MODEL_PAGES:
        return [pytest.mark.slow, pytest.mark.timeout(2400)]
    return [pytest.mark.timeout(600)]


@pytest.mark.parametrize("page", [pytest.param(page, marks=page_marks(page)) for page in PAGES])
def test_every_block_runs(page, docs_root, request):
    shared_file("chat/gsm8k-train.jsonl.zst")  # skips, saying why, without the shared data
    runnable = runnable_blocks(ROOT / page)
    if page == "README.md":
        assert runnable, "the README's quick start has no runnable block"
    demo = request.getfixturevalue("demo_output") if runnable and starts_with_the_demo(runnable[0][1]) else None
    checkout = fresh_checkout(docs_root)
    if demo:  # copy2 keeps the mtimes the demo's resume markers name; the path is the one the demo ran in
        shutil.copytree(demo, checkout / "runs" / "demo", symlinks=True)
    for k, (lang, body) in enumerate(runnable, start=1):
        run_block(page, k, lang, body, checkout)
