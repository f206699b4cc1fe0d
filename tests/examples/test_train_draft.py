"""examples/train_draft.py on caches of a tiny 4-layer Qwen3: the draft learns (bf16 and fp8 caches),
a target model the cache was not built from is refused before any step, and the draft trains while
`fuelline cache stream` builds the cache, resuming from its checkpoint after a stop or a SIGKILL
with every sample trained on once."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fuelline.cache.build import build_cache  # noqa: E402
from fuelline.cache.plan import CacheConfig  # noqa: E402
from fuelline.formats.target_stream import read_stream_manifest  # noqa: E402
from fuelline.serve.processes import with_parent_death_signal  # noqa: E402

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


# -- training while the cache streams -----------------------------------------------------------------

STREAM_SAMPLES = 48  # 4 partitions of 12, 12 batches of 4


def stream_builder(target: Path, chats: Path, out: Path) -> subprocess.Popen:
    """`fuelline cache stream` of `chats` in the background: partitions of 12, a window of 3 (the trainer
    acknowledges its checkpoints, so the partition before its batch may stay on disk)."""
    argv = [sys.executable, "-m", "fuelline", "cache", "stream", "--model", str(target), "-i", str(chats), "-o",
            str(out), "--layers", "-1,0,2", "--min-loss-tokens", "1", "--min-shards", "2", "--device", "cpu",
            "--partition-samples", "12", "--window", "3", "--wait-timeout", "120", "-q"]
    return subprocess.Popen(with_parent_death_signal(argv), env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stream_arguments(stream: Path, target: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["--stream", str(stream), "--target-model", str(target), "--device", "cpu", "--workers", "0",
            "--batch-size", "4", "--lr", "1e-2", "--log-every", "1", "--checkpoint", str(tmp_path / "draft.pt"),
            "--acknowledge", "checkpoint", *extra]


def finished_stream(builder: subprocess.Popen, stream: Path) -> None:
    """The builder ends once every partition is acknowledged, and deletes every one."""
    _, err = builder.communicate(timeout=300)
    assert builder.returncode == 0, err[-3000:]
    assert {p["state"] for p in read_stream_manifest(stream)["partitions"]} == {"deleted"}
    assert not list(stream.glob("epoch-*"))


def test_the_draft_trains_while_the_cache_streams_and_resumes_from_its_checkpoint(script, qwen4_dir, tmp_path):
    """Started beside the builder (before the stream is planned), stopped at step 5, resumed to the end
    of the stream: 12 batches, each sample once, and the resumed run starts from the trained weights."""
    chats = write_chats(tmp_path / "chats.jsonl", STREAM_SAMPLES, seed=1)
    stream = tmp_path / "stream"
    builder = stream_builder(qwen4_dir, chats, stream)
    try:
        first = script.main(stream_arguments(stream, qwen4_dir, tmp_path, "--steps", "5", "--checkpoint-every", "2"))
        second = script.main(stream_arguments(stream, qwen4_dir, tmp_path, "--checkpoint-every", "2"))
        finished_stream(builder, stream)
    finally:
        builder.kill()
        builder.wait()
    assert (first["steps"], first["samples"]) == (5, 20)
    assert (second["steps"], second["samples"]) == (12, STREAM_SAMPLES - 20)
    assert second["first_loss"] < 0.8 * first["first_loss"], (first["history"], second["history"])
    assert torch.load(tmp_path / "draft.pt", weights_only=True)["stream"]["position"] == STREAM_SAMPLES


@pytest.mark.slow
def test_a_trainer_killed_mid_stream_resumes_without_losing_a_sample(script, qwen4_dir, tmp_path):
    """SIGKILL at a random point after a checkpoint: with acknowledge="checkpoint" every partition past
    the last checkpoint is still on disk, and the resumed run trains on exactly the samples after it."""
    chats = write_chats(tmp_path / "chats.jsonl", STREAM_SAMPLES, seed=2)
    stream, saved = tmp_path / "stream", tmp_path / "draft.pt"
    builder = stream_builder(qwen4_dir, chats, stream)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    trainer = subprocess.Popen(with_parent_death_signal([sys.executable, str(SCRIPT), *stream_arguments(
        stream, qwen4_dir, tmp_path, "--checkpoint-every", "1")]), env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    kill_after = random.Random().randint(1, 9)  # checkpoints; the kill lands somewhere in the step after
    try:
        deadline = time.monotonic() + 300
        while trainer.poll() is None and time.monotonic() < deadline and not (
                saved.exists() and torch.load(saved, weights_only=True)["step"] >= kill_after):
            time.sleep(0.05)
        assert trainer.poll() is None, trainer.communicate()[1][-3000:]
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        position = torch.load(saved, weights_only=True)["stream"]["position"]
        assert position < STREAM_SAMPLES, "the trainer finished before the kill: nothing was tested"
        resumed = script.main(stream_arguments(stream, qwen4_dir, tmp_path, "--checkpoint-every", "1"))
        finished_stream(builder, stream)
    finally:
        for process in (trainer, builder):
            process.kill()
            process.wait()
    assert resumed["samples"] == STREAM_SAMPLES - position
