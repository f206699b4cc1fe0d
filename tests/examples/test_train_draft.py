"""examples/train_draft.py on caches of a tiny 4-layer Qwen3: the draft learns (bf16 and fp8 caches),
and a target model the cache was not built from is refused before any step."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fuelline.cache.build import build_cache  # noqa: E402
from fuelline.cache.plan import CacheConfig  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_draft.py"
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()


def write_chats(path: Path, count: int, seed: int = 0) -> Path:
    """Short conversations of one fixed shape (what follows a day of the week): something to learn."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for k in range(count):
            start, steps = rng.randrange(7), rng.randint(2, 6)
            answer = ", then ".join(DAYS[(start + i) % 7] for i in range(1, steps + 1))
            turns = [{"role": "user", "content": f"Which {steps} days come after {DAYS[start]}?"},
                     {"role": "assistant", "content": f"After {DAYS[start]} come {answer}."}]
            f.write(json.dumps({"id": f"chat-{k}", "conversations": turns}) + "\n")
    return path


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The caches are built, and the default suite's draft trained, in this process: on one intra-op thread,
    as `train` runs the script (on a busy machine a second thread mostly waits)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    return write_chats(tmp_path_factory.mktemp("chats") / "chats.jsonl", 300)


def build(target: Path, chats: Path, out: Path, hidden_dtype: str) -> Path:
    config = CacheConfig(layers=[-1, 0, 2], min_loss_tokens=1, min_shards=2, device="cpu", hidden_dtype=hidden_dtype)
    build_cache(target, [chats], out, config, progress=False)
    return out


@pytest.fixture(scope="module")
def cache(qwen4_dir, chats, tmp_path_factory):
    return build(qwen4_dir, chats, tmp_path_factory.mktemp("bf16") / "cache", "bf16")


@pytest.fixture(scope="module")
def fp8_cache(qwen4_dir, chats, tmp_path_factory):
    return build(qwen4_dir, chats, tmp_path_factory.mktemp("fp8") / "cache", "fp8")


def arguments(cache: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["--cache", str(cache), "--device", "cpu", "--workers", "0", "--max-tokens", "128", "--lr", "1e-2",
            "--json-out", str(tmp_path / "metrics.json"), *extra]


def train(cache: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """The script on CPU. Small batches and one thread: a step is dominated by the [positions, 151k]
    logits (the real Qwen vocabulary), and on a busy machine threads only wait for each other."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *arguments(cache, tmp_path, *extra)], capture_output=True,
                          text=True, timeout=900, env=env)  # ~60 s on a quiet machine


@pytest.fixture(scope="module")
def script():
    """The script as a module, run in this process: its main(argv) is what the command runs (`train`, the
    slow test, runs it as one)."""
    spec = importlib.util.spec_from_file_location("train_draft", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_draft_learns_the_target_distribution(cache, tmp_path):
    done = train(cache, tmp_path, "--steps", "200")
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["steps"] == 200
    assert metrics["final_loss"] < 0.5 * metrics["first_loss"], metrics
    assert metrics["final_top1"] > metrics["first_top1"] + 0.15, metrics


def test_fp8_cache_trains(script, fp8_cache, tmp_path):
    """Ten steps, the fastest part of the descent: the loss of steps 6-10 is 0.43 of step 1's here (one
    thread, a fixed seed)."""
    script.main(arguments(fp8_cache, tmp_path, "--steps", "10", "--log-every", "5"))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["final_loss"] < 0.7 * metrics["first_loss"], metrics


def refused(script, cache: Path, other: Path, tmp_path: Path, capsys) -> str:
    """The message of a run with `other` as the target, which must stop before any step: sys.exit(message),
    which a process prints on stderr (no traceback) and exits 1 for. The checks read the cache's manifest
    only, the same in either hidden dtype."""
    with pytest.raises(SystemExit) as stopped:
        script.main(arguments(cache, tmp_path, "--steps", "5", "--target-model", str(other)))
    message = stopped.value.code
    assert isinstance(message, str) and "does not fit the target model, nothing trained" in message, message
    assert "step" not in capsys.readouterr().out
    assert not (tmp_path / "metrics.json").exists()
    return message


def test_a_target_of_another_hidden_size_is_refused(script, fp8_cache, qwen4_dir, tmp_path, capsys):
    other = tmp_path / "narrower"
    other.mkdir()
    config = json.loads((qwen4_dir / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 32}))
    assert f"hidden size: the cache has 64, {other} has 32" in refused(script, fp8_cache, other, tmp_path, capsys)


def test_a_target_without_the_cached_layers_is_refused(script, fp8_cache, tiny_qwen3_dir, tmp_path, capsys):
    """The 2-layer Qwen3 of conftest: same hidden size, but layer 2 of the cache is not one of its layers."""
    message = refused(script, fp8_cache, tiny_qwen3_dir, tmp_path, capsys)
    assert "layer ids [2] of the cache are not capturable layers" in message


def test_a_target_of_the_same_shape_with_other_weights_is_refused(script, fp8_cache, qwen_dir, tmp_path, capsys):
    """Same config, other seed: only the manifest's model fingerprint tells them apart."""
    from fuelline.models import tiny_qwen3

    other = tiny_qwen3(tmp_path / "reseeded", qwen_dir, seed=1, layers=4)
    assert "is not the model the cache was built from" in refused(script, fp8_cache, other, tmp_path, capsys)
