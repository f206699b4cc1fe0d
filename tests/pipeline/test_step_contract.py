"""The one resume contract (`fuelline.pipeline.workdir`), kept by every step command alike.

Each step runs from its command in a real process that is SIGKILLed at a moment the contract
names (right after its plan marker is written, or right before stats.json, once all its work is
done: every step writes both through `WorkDir`); the same command then resumes, and the output
equals that of a `--restart` run byte for byte (stats apart, which hold seconds). Options that
decide the output are refused, naming what differs; stats.json holds the identity.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson
import pytest

from fuelline.io import read_records

from ..chat.test_regenerate import echo_thread
from ..conftest import invoke_cli, shared_file

KILLED_AT = """
import os, signal, sys
from fuelline.pipeline.workdir import WorkDir
point = sys.argv[1]
original = getattr(WorkDir, point)
def killed(self, *args, **kwargs):
    if point == "begin":
        original(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
setattr(WorkDir, point, killed)
from fuelline.cli import main
main(sys.argv[2:], prog_name="fuelline")
"""


TIMED = {"training_report.json"}  # the tokenizer's, with its seconds


@dataclass
class Case:
    args: Callable[[dict, Path], list]  # the command, given the inputs and OUT
    output: Callable[[Path], Path]  # the directory whose bytes are compared (OUT, or RUN/report)
    stats: Callable[[Path], Path]
    other: tuple[tuple[str, ...], str] | None  # options that decide the output, and the name the refusal gives
    heavy: bool = False  # imports torch: killed at one moment only


def _cache_args(inputs, out):
    return ["cache", "build", "--model", inputs["model"], "-i", inputs["regenerated"], "-o", out, "--layers", "-1,0",
            "--max-length", 256]


CASES = {
    "clean": Case(lambda i, out: ["clean", "-i", i["raw"], "-o", out, "-w", 1, "-q"],
                  lambda out: out, lambda out: out / "stats.json", (("--max-han", 200), "config.max_han")),
    "tokenizer": Case(lambda i, out: ["tokenizer", "train", "-i", i["docs"], "-o", out, "--vocab-size", 300],
                      lambda out: out, lambda out: out / "stats.json", (("--vocab-size", 320), "config.vocab_size")),
    "pack": Case(lambda i, out: ["pack", "-i", i["docs"], "-o", out, "--tokenizer", i["tokenizer"], "-w", 1, "-q"],
                 lambda out: out, lambda out: out / "stats.json", (("--val-fraction", 0.5), "config.val_fraction")),
    "regenerate": Case(lambda i, out: ["chat", "regenerate", "-i", i["chats"], "-o", out / "out.jsonl", "--server",
                                       i["server"], "--model", "echo", "-q"],
                       lambda out: out, lambda out: out / "out.stats.json", (("--preset", "qwen3"), "config.preset")),
    "cache": Case(_cache_args, lambda out: out, lambda out: out / "stats.json",
                  (("--max-length", 128), "config.max_length"), heavy=True),
    "export": Case(lambda i, out: ["cache", "export", "--to", "specforge", i["cache"], "-o", out, "--workers", 1],
                   lambda out: out, lambda out: out / "stats.json", (("--method", "dflash"), "config.method"),
                   heavy=True),
    "vocab-map": Case(lambda i, out: ["cache", "vocab-map", i["cache"], "--draft-vocab", 16, "-o",
                                      out / "vocab_mapping.pt", "--workers", 1],
                      lambda out: out, lambda out: out / "vocab_mapping.stats.json",
                      (("--draft-vocab", 20), "config.draft_vocab_size"), heavy=True),
    "report": Case(lambda i, out: ["report", out], lambda out: out / "report", lambda out: out / "report" / "stats.json",
                   None),
}


def _run(*args):
    result = invoke_cli(*args)
    assert result.exit_code == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_qwen3_dir):
    """Each step's input, made by the step before it (in this process)."""
    base = tmp_path_factory.mktemp("contract")
    raw = base / "raw.jsonl"
    records = [r for _, r in zip(range(120), read_records(shared_file("chinese-poetry.jsonl.zst")))]
    raw.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    chats = base / "chats.jsonl"
    chats.write_bytes(b"".join(orjson.dumps({"id": f"c{i}", "conversations": [
        {"role": "user", "content": f"What is {i} plus {i}?"}, {"role": "assistant", "content": "An old answer."}]})
        + b"\n" for i in range(10)))
    with echo_thread() as server:
        found = {"raw": raw, "chats": chats, "server": server, "model": tiny_qwen3_dir}
        _run(*CASES["clean"].args(found, base / "docs"))
        found["docs"] = base / "docs"
        _run(*CASES["tokenizer"].args(found, base / "tokenizer"))
        found["tokenizer"] = base / "tokenizer"
        _run(*CASES["regenerate"].args(found, base / "regenerated"))
        found["regenerated"] = base / "regenerated" / "out.jsonl"
        _run(*_cache_args(found, base / "cache"))
        found["cache"] = base / "cache"
        run_dir = base / "run"  # a run for the report: one clean step
        (base / "clean.toml").write_text('[[step]]\nuse = "clean"\nworkers = 1\n')
        _run("run", base / "clean.toml", "-i", raw, "--run-dir", run_dir, "-q")
        found["run"] = run_dir
        yield found


def _output_bytes(directory: Path) -> dict[str, bytes]:
    """The output's files but stats and the others that hold seconds (shard markers, `TIMED`); JSONL lines
    sorted (regenerate appends answers in the order they come)."""
    found = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        name = path.relative_to(directory).as_posix()
        if name.endswith("stats.json") or name.startswith("_done/") or name in TIMED:
            continue
        data = path.read_bytes()
        found[name] = b"".join(sorted(data.splitlines(keepends=True))) if name.endswith(".jsonl") else data
    return found


def _killed_at(point: str, args: list) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_AT, point, *map(str, args)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr


@pytest.mark.parametrize("name", list(CASES))
def test_every_step_resumes_after_a_kill_refuses_other_options_and_writes_stats(name, inputs, tmp_path):
    case = CASES[name]
    out = inputs["run"] if name == "report" else tmp_path / "out"
    args = case.args(inputs, out)
    restart = [] if name == "report" else ["--restart"]  # the report is made again whenever the run changed
    for point in ("finish",) if case.heavy else ("begin", "finish"):
        if case.stats(out).exists():  # finished: redone, and killed once its work is done
            case.stats(out).unlink() if name == "report" else None
            _killed_at(point, [*args, *restart])
        else:
            _killed_at(point, args)
        assert not case.stats(out).exists()  # killed before its end
        _run(*args)  # resumed
        stats = orjson.loads(case.stats(out).read_bytes())
        assert stats["identity"] and "resumed" not in stats and {"stage", "records_in", "records_out"} <= set(stats)
        resumed = _output_bytes(case.output(out))
        assert resumed
        (case.output(out) / "stats.json").unlink() if name == "report" else None
        _run(*args, *restart)
        assert _output_bytes(case.output(out)) == resumed, f"{name} killed at {point}, then resumed"
    stats = orjson.loads(case.stats(out).read_bytes())
    _run(*args)  # finished: found again
    assert orjson.loads(case.stats(out).read_bytes())["identity"] == stats["identity"]
    if case.other is not None:
        options, named = case.other
        refused = invoke_cli(*args, *options)
        assert refused.exit_code == 2 and f"different {named}; pass --restart" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


@pytest.mark.parametrize("options, named", [(("--model", "another"), "config.model"),
                                            (("--temperature", 0.5), "config.temperature"),
                                            (("--preset", "qwen3"), "config.preset")])
def test_chat_regenerate_resumed_with_another_model_sampling_or_preset_is_refused_naming_it(options, named, inputs,
                                                                                            tmp_path):
    args = [*CASES["regenerate"].args(inputs, tmp_path), "--resume"]
    _run(*args)
    (tmp_path / "out.stats.json").unlink()  # as if stopped before its end: what is there is kept
    before = (tmp_path / "out.jsonl").read_bytes()
    refused = invoke_cli(*args, *options)
    assert refused.exit_code == 2 and f"different {named}; pass --restart" in refused.stderr, refused.stderr
    assert (tmp_path / "out.jsonl").read_bytes() == before  # no answer of a second configuration appended
    assert len(list(read_records(tmp_path / "out.jsonl"))) == 10


def test_run_restart_from_redoes_one_step_and_keeps_the_earlier_ones(inputs, tmp_path):
    pipeline, other = tmp_path / "p.toml", tmp_path / "q.toml"
    steps = '[[step]]\nuse = "clean"\nworkers = 1\n\n[[step]]\nuse = "tokenizer"\nvocab_size = {}\n'
    pipeline.write_text(steps.format(300))
    other.write_text(steps.format(320))
    run = ["--run-dir", tmp_path / "run", "-i", inputs["raw"], "-q"]
    _run("run", pipeline, *run)
    part = tmp_path / "run" / "01-clean" / "part-00000.jsonl.zst"
    kept = part.stat().st_mtime_ns, part.stat().st_ino
    clean_stats = (tmp_path / "run" / "01-clean" / "stats.json").read_bytes()
    refused = invoke_cli("run", other, *run)
    assert refused.exit_code == 2 and "different config.vocab_size; pass --restart-from tokenizer to redo this step" \
        in refused.stderr, refused.stderr
    unknown = invoke_cli("run", other, *run, "--restart-from", "pack")
    assert unknown.exit_code == 2 and "no step of that name (its steps: clean, tokenizer)" in unknown.stderr
    _run("run", other, *run, "--restart-from", "tokenizer")
    tokenizer = orjson.loads((tmp_path / "run" / "02-tokenizer" / "stats.json").read_bytes())
    assert tokenizer["identity"]["config"]["vocab_size"] == 320 and "resumed" not in tokenizer
    assert (part.stat().st_mtime_ns, part.stat().st_ino) == kept  # the clean step was not redone
    assert (tmp_path / "run" / "01-clean" / "stats.json").read_bytes() == clean_stats  # found finished, not rewritten


def test_restart_deletes_only_a_steps_output_and_says_when_it_cannot(tmp_path, inputs):
    stranger = tmp_path / "mine"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("not a step's")
    refused = invoke_cli(*CASES["tokenizer"].args(inputs, stranger), "--restart")
    assert refused.exit_code == 2 and "is not a fuelline stage output" in refused.stderr
    assert (stranger / "notes.txt").read_text() == "not a step's"
    out = tmp_path / "tok"
    _run(*CASES["tokenizer"].args(inputs, out))
    if os.geteuid() == 0:
        pytest.skip("root deletes from a read-only directory")
    out.chmod(0o500)
    try:
        failed = invoke_cli(*CASES["tokenizer"].args(inputs, out), "--restart")
    finally:
        out.chmod(0o700)
    assert failed.exit_code == 2 and "could not delete" in failed.stderr and "nothing was run" in failed.stderr


@pytest.mark.parametrize("name, marker", [("pack", "_work/plan.json"), ("cache", ".build/plan.json"),
                                          ("tokenizer", "_started.json")])
def test_an_output_an_earlier_version_left_unfinished_is_refused_naming_its_marker_until_restart(name, marker, inputs,
                                                                                              tmp_path):
    out = tmp_path / "out"
    (out / marker).parent.mkdir(parents=True, exist_ok=True)
    (out / marker).write_bytes(b'{"identity": {}, "shards": []}')  # the plans of then: not read now
    args = CASES[name].args(inputs, out)
    refused = invoke_cli(*args)
    assert refused.exit_code == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert f"{out} was left unfinished by an earlier fuelline version ({marker} there, no _plan.json) and cannot be " \
           "resumed; pass --restart" in refused.stderr, refused.stderr
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [marker]  # untouched
    _run(*args, "--restart")
    assert not (out / marker).exists() and "identity" in orjson.loads(CASES[name].stats(out).read_bytes())
