"""`fuelline cache build` on real (tiny, local) transformers: captured states, resume, ranks, errors.

The reference for every stored tensor is transformers' own `output_hidden_states` of a
causal LM loaded independently of the builder (`AutoModelForCausalLM`, not the base model the
builder hooks), so a wrong layer, an off-by-one, a padded position or a missed norm shows up.
"""

from __future__ import annotations

import json
import re
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fuelline.cache.build import build_cache  # noqa: E402
from fuelline.cache.dataset import CacheDataset, widen_hidden  # noqa: E402
from fuelline.cache.fp8 import error_bound  # noqa: E402
from fuelline.cache.inspect import verify_cache  # noqa: E402
from fuelline.cache.plan import CacheConfig  # noqa: E402
from fuelline.formats.target_cache import FUELLINE_INDEX, HIDDEN_DTYPES, INDEX, MANIFEST  # noqa: E402

LAYERS = [-1, 0, 2]  # of a 4-layer model: the embedding output, a middle layer, the last allowed
WORDS = ("the cat sat on a mat and ran far away into deep green woods where old owls sing of rain "
         "今天 天气 很好 我们 去 公园 散步 吧").split()


def write_chats(path: Path, count: int, seed: int = 0) -> Path:
    """Conversations of 1-3 exchanges, 5-80 words a turn: lengths vary, so batches pad."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for k in range(count):
            turns = []
            for _ in range(rng.randint(1, 3)):
                turns.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(3, 30)))})
                turns.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 80)))})
            f.write(json.dumps({"id": f"chat-{k}", "conversations": turns}, ensure_ascii=False) + "\n")
    return path


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """In-process builds on one intra-op thread, as the CLI runs below (OMP_NUM_THREADS=1), so a cache built
    here has the CLI's bytes; and on a busy machine a second thread mostly waits (forwards ~10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


CHATS = 24  # enough for lengths that vary, padded batches and several shards


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    return write_chats(tmp_path_factory.mktemp("chats") / "chats.jsonl", CHATS)


def config(**overrides) -> CacheConfig:
    values = dict(layers=LAYERS, min_loss_tokens=1, batch_tokens=1024, min_shards=3, device="cpu")
    return CacheConfig(**{**values, **overrides})


@pytest.fixture(scope="module")
def padded(qwen4_dir, chats, tmp_path_factory):
    """`chats` in length-grouped (padded) batches, bf16, the fuelline format: (cache, stats), read by the
    tests that need such a cache and changed by none."""
    out = tmp_path_factory.mktemp("padded") / "cache"
    return out, build_cache(qwen4_dir, [chats], out, config(), progress=False)


def reference_states(model_dir: Path, layers: list[int]):
    """A function: input ids → (hidden [T, L·H], last [T, H]) from transformers' output_hidden_states."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()

    def states(ids: torch.Tensor):
        with torch.no_grad():
            # logits for one position only: the 151k-token LM head over every position was most of the time
            hidden = model(input_ids=ids.long()[None], output_hidden_states=True, logits_to_keep=1).hidden_states
        return torch.cat([hidden[k + 1] for k in layers], dim=-1)[0], hidden[-1][0]

    return states


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != "stats.json"}


def test_one_sample_batches_equal_output_hidden_states(qwen4_dir, chats, tmp_path):
    """Batches of one sample (no padding): every stored state is bit-equal to a bf16 forward's."""
    out = tmp_path / "cache"
    stats = build_cache(qwen4_dir, [chats], out, config(batch_tokens=1), progress=False)
    assert stats["records_out"] == CHATS and stats["cache"]["padding_share"] == 0
    states = reference_states(qwen4_dir, LAYERS)
    dataset = CacheDataset(out)
    for i in range(len(dataset)):
        sample = dataset[i]
        hidden, last = states(sample["input_ids"])
        assert torch.equal(sample["target_hidden_states"], hidden), i
        assert torch.equal(sample["target_last_hidden_states"], last), i


def test_padded_batches_store_only_real_positions(qwen4_dir, chats, padded):
    """Length-grouped batches with padding: the stored states are those of the unpadded sequence (up to
    bf16 rounding: another batch shape sums in another order), ids and masks exactly the encoding."""
    from fuelline.chat.encode import encode_chats

    out, stats = padded
    assert 0 < stats["cache"]["padding_share"] < 0.5
    records = {r["id"]: r for r in map(json.loads, chats.read_text().splitlines())}
    states = reference_states(qwen4_dir, LAYERS)
    dataset = CacheDataset(out)
    assert sorted(dataset[i]["record_id"] for i in range(len(dataset))) == sorted(records)
    for i in range(len(dataset)):
        sample = dataset[i]
        encoded = encode_chats([records[sample["record_id"]]], qwen4_dir, "auto")[0]
        assert np.array_equal(sample["input_ids"].numpy(), encoded.input_ids)
        assert np.array_equal(sample["loss_mask"].numpy(), encoded.loss_mask.astype(np.uint8))
        hidden, last = states(sample["input_ids"])
        # a wrong layer or a shifted position is ~100% off; bf16 sums in another order stay well under 2%
        for name, truth in (("target_hidden_states", hidden), ("target_last_hidden_states", last)):
            stored = sample[name].float()
            assert stored.shape == truth.shape
            assert float((stored - truth.float()).norm() / truth.float().norm()) < 0.02, (i, name)
    # in the cache's order, lengths ascend within each shard (what keeps the padding low)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["num_samples"] == CHATS and manifest["target_layer_ids"] == LAYERS


def test_fp8_within_the_documented_bound(qwen4_dir, chats, tmp_path):
    out = tmp_path / "cache"
    build_cache(qwen4_dir, [chats], out, config(batch_tokens=1, hidden_dtype="fp8"), progress=False)
    states = reference_states(qwen4_dir, LAYERS)
    dataset = CacheDataset(out)
    assert dataset[0]["target_hidden_states"].dtype == torch.float8_e4m3fn
    for i in range(len(dataset)):
        sample = dataset[i]
        hidden, last = states(sample["input_ids"])
        wide = widen_hidden({k: v for k, v in sample.items() if k != "record_id"}, torch.float32)
        for name, truth, scales in (("target_hidden_states", hidden, sample["target_hidden_scales"]),
                                    ("target_last_hidden_states", last, sample["target_last_hidden_scales"][:, None])):
            error = (wide[name] - truth.float()).abs()
            assert bool((error <= error_bound(truth, scales)).all()), (i, name)


def test_bytes_per_token_and_estimate_match_the_build(qwen4_dir, chats, padded, tmp_path):
    from fuelline.cache.estimate import estimate_from_inputs

    estimates, counts = estimate_from_inputs(qwen4_dir, [chats], config(), 64, progress=False)
    for fmt, dtype in (("deepspec-v2", "bf16"), ("fuelline", "bf16"), ("fuelline", "fp8")):
        if (fmt, dtype) == ("fuelline", "bf16"):
            out = padded[0]  # config()'s own format and dtype
        else:
            out = tmp_path / f"{fmt}-{dtype}"
            build_cache(qwen4_dir, [chats], out, config(format=fmt, hidden_dtype=dtype), progress=False)
        on_disk = sum(p.stat().st_size for p in out.glob("shard-*.bin")) + (out / "samples.idx").stat().st_size
        (estimate,) = [e for e in estimates if (e.format, e.hidden_dtype) == (fmt, HIDDEN_DTYPES[dtype])]
        assert estimate.total_bytes == on_disk, (fmt, dtype)
    assert counts["samples"] == CHATS


def _cli(*args: str, progress: bool = False) -> list[str]:
    return [sys.executable, "-m", "fuelline", "cache", "build", *([] if progress else ["--quiet"]), *args]


def _build_args(model: Path, chats: Path, out: Path, *extra: str) -> list[str]:
    """The options of `config(**CLI_BUILD)`."""
    return ["--model", str(model), "-i", str(chats), "-o", str(out), "--layers", ",".join(map(str, LAYERS)),
            "--min-loss-tokens", "1", "--batch-tokens", "256", "--min-shards", "4", "--device", "cpu", *extra]


CLI_BUILD = dict(batch_tokens=256, min_shards=4)


def invoke(*args: str):
    """`fuelline ARGS` in this process (click's runner), for what only the exit code and the messages show.
    An exception the command did not turn into a message is what a real process shows as a traceback."""
    from click.testing import CliRunner

    from fuelline.cli import main

    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        "".join(traceback.format_exception(result.exception))
    return result


def invoke_build(*args: str):
    return invoke("cache", "build", "--quiet", *args)


def _env() -> dict:
    # One thread per process: the 1-rank and 2-rank runs then compute in the same order.
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _kill_after_first_commit(command: list[str], out: Path) -> bytes:
    """Start a build and SIGKILL it (its whole process group) once some batches are committed; its stderr."""
    process = subprocess.Popen(command, env=_env(), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if any(p.stat().st_size >= 48 * 3 for p in out.glob(".build/*.idx.partial")):
            break
        time.sleep(0.05)
    assert process.poll() is None, f"the build ended before it could be killed: {process.stderr.read().decode()}"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (out / MANIFEST).exists()
    return process.stderr.read()


@pytest.fixture(scope="module")
def uninterrupted(qwen4_dir, tmp_path_factory):
    """The reference build: one rank, one thread, never interrupted; built in this process with the options
    of `_build_args` (the CLI's builds in test_a_hub_id_is_found_through_the_hub_cache_offline and
    test_two_ranks_write_the_same_cache_as_one show that a process of its own writes the same bytes)."""
    chats = write_chats(tmp_path_factory.mktemp("chats") / "more.jsonl", 96, seed=1)
    out = tmp_path_factory.mktemp("reference") / "cache"
    build_cache(qwen4_dir, [chats], out, config(**CLI_BUILD), progress=False)
    return chats, out


def test_sigkill_resumes_to_identical_bytes(qwen4_dir, uninterrupted, tmp_path):
    """A real process killed; the same command resumes it (in this process: what resumes is on disk).
    Until the kill, past loading the model and committing batches, --quiet kept its stderr empty:
    no bar, no loading report (transformers writes that to the process's own stderr)."""
    chats, reference = uninterrupted
    out = tmp_path / "cache"
    said = _kill_after_first_commit(_cli(*_build_args(qwen4_dir, chats, out)), out)
    assert said == b"", said.decode()
    assert any(out.glob(".build/*.partial"))
    done = invoke_build(*_build_args(qwen4_dir, chats, out))
    assert done.exit_code == 0, done.stderr
    assert files_of(out) == files_of(reference)
    assert not (out / ".build").exists()


def _torchrun(ranks: int, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
            "-m", "fuelline", "cache", "build", "--quiet", *args]


def test_two_ranks_write_the_same_cache_as_one(qwen4_dir, uninterrupted, tmp_path):
    chats, reference = uninterrupted
    out = tmp_path / "cache"
    done = subprocess.run(_torchrun(2, _build_args(qwen4_dir, chats, out)), env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert files_of(out) == files_of(reference)


def test_another_thread_count_keeps_the_plan_and_moves_hidden_states_only_by_bf16_rounding(qwen4_dir, chats, padded,
                                                                                         tmp_path):
    """What docs/cache.md promises across thread counts (and so across rank counts on a CPU): the
    plan, ids, masks and layout exactly, the hidden states within bf16 rounding. `padded` was built
    on one thread; the padded batches are few, and so are the waits of two threads on a busy machine."""
    from fuelline.cache.compare import compare_caches

    reference = padded[0]
    out = tmp_path / "cache"
    torch.set_num_threads(2)
    try:
        build_cache(qwen4_dir, [chats], out, config(), progress=False)
    finally:
        torch.set_num_threads(1)
    result = compare_caches(reference, out)
    assert result["differences"] == [] and result["samples"] == CHATS
    assert result["max_relative_difference"] <= 2 ** -6  # at most 4 units in the last place of a token's largest
    same = invoke("cache", "compare", str(reference), str(reference))
    assert same.exit_code == 0 and "hidden states: identical" in same.stdout


def test_compare_names_what_differs_between_two_plans(qwen4_dir, chats, padded, tmp_path):
    out = tmp_path / "cache"
    build_cache(qwen4_dir, [chats], out, config(max_length=64), progress=False)
    done = invoke("cache", "compare", str(padded[0]), str(out))
    assert done.exit_code == 1 and "Traceback" not in done.stderr
    assert done.stdout.startswith("different plans: ")


@pytest.mark.slow
def test_two_rank_build_resumed_by_one_rank(qwen4_dir, uninterrupted, tmp_path):
    """A variation of two proofs in the default suite: test_sigkill_resumes_to_identical_bytes (a SIGKILL and an
    exact resume) and test_two_ranks_write_the_same_cache_as_one (a torchrun of two ranks); here the killed
    build had two ranks and the resume has one."""
    chats, reference = uninterrupted
    out = tmp_path / "cache"
    _kill_after_first_commit(_torchrun(2, _build_args(qwen4_dir, chats, out)), out)
    done = subprocess.run(_cli(*_build_args(qwen4_dir, chats, out)), env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert files_of(out) == files_of(reference)


def test_finished_cache_is_found_again(qwen4_dir, uninterrupted):
    """Found by the CLI's options, though built in this process: the two describe the same build."""
    chats, reference = uninterrupted
    before = files_of(reference)
    done = invoke_build(*_build_args(qwen4_dir, chats, reference))
    assert done.exit_code == 0 and "already built" in done.stdout
    assert files_of(reference) == before
    other = invoke_build(*_build_args(qwen4_dir, chats, reference, "--hidden-dtype", "fp8"))
    assert other.exit_code == 2 and "different config.hidden_dtype; pass --restart" in other.stderr


@pytest.mark.parametrize("extra, message", [
    (["--layers", "1,3"], "3 is the final decoder layer"),
    (["--layers", "2,1"], "ascending"),
    (["--layers", "7"], "out of range"),
    (["--format", "deepspec-v2", "--hidden-dtype", "fp8"], "needs --format fuelline"),
])
def test_refused_options_say_why(qwen4_dir, chats, tmp_path, extra, message):
    out = tmp_path / "cache"
    args = _build_args(qwen4_dir, chats, out)
    if "--layers" in extra:
        at = args.index("--layers")
        del args[at: at + 2]
    done = invoke_build(*args, *extra)
    assert done.exit_code == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (out / MANIFEST).exists()


def test_not_enough_disk_refuses_unless_forced(qwen4_dir, chats, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _path: usage(10**6, 10**6 - 1000, 1000))
    out = tmp_path / "cache"
    with pytest.raises(ValueError, match="free some space or pass --force"):
        build_cache(qwen4_dir, [chats], out, config(), progress=False)
    assert not any(out.glob("shard-*"))
    stats = build_cache(qwen4_dir, [chats], out, config(force=True), progress=False)
    assert stats["records_out"] == CHATS


def test_a_record_that_is_not_a_conversation_is_named(qwen4_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "conversations": [{"role": "user", "content": "hi"}, '
                   '{"role": "assistant", "content": "hello there"}]}\n{"id": "b", "text": "no turns"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        build_cache(qwen4_dir, [bad], tmp_path / "cache", config(), progress=False)


def test_a_failed_plan_leaves_nothing_behind(qwen4_dir, tmp_path):
    """Without its plan a `.build/` resumes nothing: a build stopped while planning removes what it began."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "conversations": [{"role": "user", "content": "hi"}, '
                   '{"role": "assistant", "content": "hello there"}]}\n{"id": "b", "text": "no turns"}\n')
    done = invoke_build(*_build_args(qwen4_dir, bad, tmp_path / "cache"))
    assert done.exit_code == 2 and "bad.jsonl:2" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "cache").exists()


def test_a_bad_option_value_is_named_before_any_model_is_loaded(chats, tmp_path):
    """The model given does not even exist: the option is checked first, and named with its value."""
    done = invoke_build("--model", str(tmp_path / "no-model"), "-i", str(chats), "-o", str(tmp_path / "cache"),
                        "--layers", "0", "--chat-template", "nosuchtemplate")
    assert done.exit_code == 2 and "Traceback" not in done.stderr
    assert "--chat-template nosuchtemplate: unknown chat template 'nosuchtemplate'; known: auto, chatml" in done.stderr
    assert str(chats) not in done.stderr  # the input is not to blame
    assert not (tmp_path / "cache").exists()


def test_a_failure_after_the_plan_says_the_build_resumes(qwen4_dir, chats, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda does not fail here")
    out = tmp_path / "cache"
    with pytest.raises(ValueError, match="CUDA is not available") as failed:
        build_cache(qwen4_dir, [chats], out, config(device="cuda"), progress=False)
    assert any("the same command resumes there" in note for note in failed.value.__notes__)
    assert (out / ".build" / "plan.json").exists()
    assert build_cache(qwen4_dir, [chats], out, config(), progress=False)["records_out"] == CHATS


def test_a_hub_id_is_found_through_the_hub_cache_offline(qwen4_dir, uninterrupted, tmp_path, monkeypatch):
    """`--model org/name` as from_pretrained takes it: a Hub cache laid out as huggingface_hub writes it,
    read with HF_HUB_OFFLINE=1 (a real process: huggingface_hub reads both variables when imported). The
    cache equals the one built from the directory, but for the model's name (and the index checksums,
    which cover the manifest that holds it). Its progress goes to a pipe, not a terminal: lines, every
    bar drawn, no carriage return, and no loading report from transformers (that --quiet means an
    empty stderr is shown by test_sigkill_resumes_to_identical_bytes)."""
    chats, by_dir = uninterrupted
    by_id = tmp_path / "by-id"
    hub = tmp_path / "hub"
    snapshot = hub / "models--fuelline-test--qwen3-4-layers" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (hub / "models--fuelline-test--qwen3-4-layers" / "refs").mkdir()
    (hub / "models--fuelline-test--qwen3-4-layers" / "refs" / "main").write_text("0" * 40)
    for path in qwen4_dir.iterdir():
        (snapshot / path.name).symlink_to(path)
    env = {**_env(), "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(_cli(*_build_args(Path("fuelline-test/qwen3-4-layers"), chats, by_id), progress=True),
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "Loading weights" not in done.stderr
    assert "cache rank 0: 100%" in done.stderr and "encode: " in done.stderr
    manifest = json.loads((by_id / MANIFEST).read_text())
    assert manifest["target_model_name_or_path"] == "fuelline-test/qwen3-4-layers"
    shards = lambda d: {n: b for n, b in files_of(d).items() if n.startswith("shard-")}  # noqa: E731
    assert shards(by_id) == shards(by_dir)
    id_index, dir_index = (np.fromfile(d / INDEX, dtype=FUELLINE_INDEX) for d in (by_id, by_dir))
    unsealed = [name for name in FUELLINE_INDEX.names if name != "index_checksum"]
    assert all(np.array_equal(id_index[name], dir_index[name]) for name in unsealed)
    assert verify_cache(by_id) == verify_cache(by_dir) == []
    import huggingface_hub.constants

    # the message only (the variables are proven above): in this process, as huggingface_hub read them
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    missing = invoke_build(*_build_args(Path("fuelline-test/not-cached"), chats, tmp_path / "none"))
    assert missing.exit_code == 2 and "Traceback" not in missing.stderr
    assert "fuelline-test/not-cached: no such model directory, and not found as a Hub id" in missing.stderr


@pytest.mark.slow
def test_smollm2_states_equal_output_hidden_states(smollm2_dir, tmp_path):
    """The real SmolLM2-135M (a Llama, 30 layers, hidden 576) through its own chat template."""
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"id": f"q{k}", "conversations": [
        {"role": "user", "content": question}, {"role": "assistant", "content": answer}]}) + "\n"
        for k, (question, answer) in enumerate([
            ("What is the capital of France?", "The capital of France is Paris."),
            ("Name a prime number.", "Seven is a prime number: its only divisors are one and itself."),
            ("Say hello.", "Hello! How can I help you today?")])))
    layers = [-1, 1, 9, 17, 28]
    out = tmp_path / "cache"
    stats = build_cache(smollm2_dir, [chats], out, CacheConfig(layers=layers, min_loss_tokens=1, batch_tokens=1,
                                                                min_shards=1, device="cpu"), progress=False)
    assert stats["records_out"] == 3
    states = reference_states(smollm2_dir, layers)
    dataset = CacheDataset(out)
    assert dataset.hidden_size == 576 and dataset[0]["target_hidden_states"].shape[1] == 5 * 576
    for i in range(len(dataset)):
        sample = dataset[i]
        hidden, last = states(sample["input_ids"])
        assert torch.equal(sample["target_hidden_states"], hidden), i
        assert torch.equal(sample["target_last_hidden_states"], last), i


FAKE_TURN = {"id": "fake", "conversations": [{"role": "user", "content": "Say done"}, {
    "role": "assistant", "content": "done<|im_end|>\n<|im_start|>user\nfake turn"}]}  # control tokens in an answer
TOOL_UNDER_CHATML = {"id": "tool", "conversations": [{"role": "user", "content": "Hi"}, {
    "role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]}


def test_a_build_keeping_no_conversation_exits_2_with_the_reason(qwen4_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({**FAKE_TURN, "id": f"fake-{k}"}) + "\n" for k in range(2)))
    done = invoke_build(*_build_args(qwen4_dir, bad, tmp_path / "cache"))
    assert done.exit_code == 2 and "Traceback" not in done.stderr
    assert "cache kept none of its 2 records (dropped: special_token_text 2)" in done.stderr
    assert f"{bad}:1: record 'fake-0': turn 1: content spells '<|im_end|>'" in done.stderr


def test_skip_drops_unrenderable_records_into_rejects_and_a_changed_policy_is_refused(qwen4_dir, tmp_path):
    source = write_chats(tmp_path / "chats.jsonl", 2)
    with open(source, "a") as f:
        f.write(json.dumps(TOOL_UNDER_CHATML) + "\n" + json.dumps(FAKE_TURN) + "\n")
    out = tmp_path / "cache"
    args = _build_args(qwen4_dir, source, out, "--chat-template", "chatml")
    stopped = invoke_build(*args)
    assert stopped.exit_code == 2 and f"{source}:3: record 'tool': turn 1 has tool_calls" in stopped.stderr
    assert not out.exists()
    done = invoke_build(*args, "--on-error", "skip")
    assert done.exit_code == 0, done.stderr
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["records_in"], stats["records_out"]) == (4, 2)
    assert stats["dropped"] == {"special_token_text": 1, "unrenderable": 1}
    assert stats["drop_examples"]["unrenderable"].startswith(f"{source}:3: record 'tool': ")
    from fuelline.io import read_records

    rejects = sorted((r["reason"], r["line"], r["record"]["id"]) for r in read_records(out / "_rejects"))
    assert rejects == [("special_token_text", 4, "fake"), ("unrenderable", 3, "tool")]
    assert verify_cache(out) == [] and len(CacheDataset(out)) == 2
    again = invoke_build(*args)
    assert again.exit_code == 2 and "different config.on_error" in again.stderr


def test_tool_records_on_the_models_own_template_without_generation_blocks(qwen4_dir, tmp_path):
    """Issue 38: a model whose own template (Hermes', no generation blocks) renders tool calls: every
    tool-call record is cached, ids and mask those `encode_chats` gives (checked against transformers'
    masks in tests/chat/test_tool_template_families.py), the calls supervised."""
    from fuelline.chat.encode import encode_chats, load_tokenizer

    from ..chat.tool_conversations import CONVERSATIONS, TOOLS
    from ..chat.tool_template_families import HERMES, with_chat_template

    model = with_chat_template(qwen4_dir, tmp_path / "model", HERMES, as_file=True)
    records = {name: {"id": name, "conversations": turns, "tools": TOOLS} for name, turns in CONVERSATIONS.items()}
    source = tmp_path / "tools.jsonl"
    source.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records.values()), encoding="utf-8")
    stats = build_cache(model, [source], tmp_path / "cache", config(), progress=False)
    assert stats["records_out"] == len(records)
    dataset = CacheDataset(tmp_path / "cache")
    tokenizer = load_tokenizer(model).tokenizer
    for i in range(len(dataset)):
        sample = dataset[i]
        encoded = encode_chats([records[sample["record_id"]]], model, "auto")[0]
        assert np.array_equal(sample["input_ids"].numpy(), encoded.input_ids)
        assert np.array_equal(sample["loss_mask"].numpy(), encoded.loss_mask.astype(np.uint8))
        supervised = tokenizer.decode(sample["input_ids"][sample["loss_mask"].bool()].tolist(), skip_special_tokens=False)
        assert "<tool_call>" in supervised and "<tool_response>" not in supervised


def test_ids_the_model_cannot_embed_are_refused_before_any_forward(chats, tmp_path):
    """A model whose embedding has fewer rows than its tokenizer has ids (a tokenizer grown by a
    template's tokens): refused in one line naming the id, the record and the vocabulary, nothing kept."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from fuelline.models import tiny_chat_model

    texts = [" ".join(t["content"] for t in r["conversations"]) for r in map(json.loads, chats.open())]
    model = tiny_chat_model(tmp_path / "whole", texts, vocab_size=600, layers=4)
    small = AutoConfig.from_pretrained(model)
    small.vocab_size = 100  # the ids from 100 of the tokenizer (a few hundred) have no row
    AutoModelForCausalLM.from_config(small).save_pretrained(tmp_path / "whole")
    out = tmp_path / "cache"
    refused = invoke_build(*_build_args(tmp_path / "whole", chats, out))
    assert refused.exit_code == 2, refused.output
    assert re.fullmatch(r"error: .*chats\.jsonl:1: record 'chat-0': token id [\d,]+ is outside the model's "
                        r"vocabulary of 100 ids \(its tokenizer has \d+\).*\n", refused.stderr), refused.stderr
    assert not out.exists()
