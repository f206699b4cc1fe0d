"""Reliability family (l), issue 35: `fuelline chat regenerate` resumed with other options.

An output of 8 conversations regenerated from an echo server, its stats removed (as if the run
had stopped before its end), is run again with one thing changed: each option that decides the
answers, generated from `RegenerateConfig`'s declaration (another choice, the flag turned, a
value in range, another model name), and another input. The run must stop with exit 2 naming
what differs (`different config.NAME`, `different inputs`) and leave the output as it was:
clear_error; exit 0 is silent_wrong (the command used to append answers of a second
configuration to the first), anything else a crash. An option that only changes how requests
are sent (`--concurrency`, `--attempts`, ...) must resume instead: ok when it exits 0 with every id
once. Runs in this process through click's runner, each trial forked (`trials.isolated`).
Called by benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson

from reliability_servers import echo_servers
from trials import Tally, changed_options, isolated

COUNT = 8
SENT_ALIKE = {"concurrency": 4, "attempts": 2, "request_timeout": 30.0}  # how requests go, not what is asked


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    work = work / "resume"
    work.mkdir(parents=True, exist_ok=True)
    chats, other = work / "chats.jsonl", work / "other.jsonl"
    _write_chats(chats, "What is {i} plus {i}?")
    _write_chats(other, "What is {i} times {i}?")
    with echo_servers([()]) as [url]:
        base = ["chat", "regenerate", "-i", str(chats), "--server", url, "--model", "echo", "-q"]
        code, stderr = _invoke([*base, "-o", str(work / "first.jsonl")])
        if code != 0:
            raise SystemExit(f"setup failed: {stderr[-2000:]}")
        return [_changed(work, base, url, other), _sent_alike(work, base)]


def _write_chats(path: Path, question: str) -> None:
    path.write_bytes(b"".join(orjson.dumps({"id": f"c{i}", "conversations": [
        {"role": "user", "content": question.format(i=i)}, {"role": "assistant", "content": "old"}]}) + b"\n"
        for i in range(COUNT)))


def _invoke(args: list[str]) -> tuple[int, str]:
    from click.testing import CliRunner

    from fuelline.cli import main

    result = CliRunner().invoke(main, args)
    return result.exit_code, result.stderr + (repr(result.exception) if result.exit_code not in (0, 2) else "")


def _unfinished(work: Path, name: str) -> Path:
    """A copy of the first run's output (answers, errors, plan marker) without its stats: an output
    whose run stopped before its end."""
    out = work / f"{name}.jsonl"
    for source in work.glob("*first.jsonl*"):
        shutil.copyfile(source, work / source.name.replace("first", name))
    return out


def _changed(work: Path, base: list[str], url: str, other: Path) -> Tally:
    tally = Tally("chat regenerate resumed with another option or input")
    inputs = [str(other) if word == base[3] else word for word in base]  # `-i CHATS` is base[2:4]
    from fuelline.chat.regenerate import RegenerateConfig

    changed = changed_options(RegenerateConfig, {"model": ["--model", "another-model"]})
    trials = [(name, [*base, *words]) for name, words in changed] + [("inputs", inputs)]
    for k, (name, args) in enumerate(trials):
        out = _unfinished(work, f"changed-{k}")
        before = out.read_bytes()

        def trial() -> str:
            code, stderr = _invoke([*args, "-o", str(out)])
            if code == 0 or out.read_bytes() != before:
                return f"silent_wrong\0exit {code}, output {'changed' if out.read_bytes() != before else 'kept'}"
            if code == 2 and f"different {name}" in stderr and "Traceback" not in stderr:
                return "clear_error"
            return f"crash\0exit {code}: {stderr[-400:]}"

        _add(tally, trial, name)
    return tally


def _sent_alike(work: Path, base: list[str]) -> Tally:
    tally = Tally("chat regenerate resumed with other request settings")
    for k, (name, value) in enumerate(SENT_ALIKE.items()):
        out = _unfinished(work, f"alike-{k}")

        def trial() -> str:
            code, stderr = _invoke([*base, "-o", str(out), "--" + name.replace("_", "-"), str(value)])
            ids = [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()]
            if code == 0 and sorted(ids) == sorted(f"c{i}" for i in range(COUNT)):
                return "ok"
            return f"crash\0exit {code}, {len(ids)} lines: {stderr[-400:]}"

        _add(tally, trial, f"--{name} {value}")
    return tally


def _add(tally: Tally, trial, label: str) -> None:
    """Run `trial` bounded in time; its outcome may carry a detail after a NUL ("crash\0exit 1: …")."""
    outcome, note = isolated(trial, timeout=120)
    outcome, _, detail = outcome.partition("\0")
    tally.add(outcome, f"{label}: {detail or note}")
