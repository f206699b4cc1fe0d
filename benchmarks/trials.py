"""What every reliability trial shares: its outcomes, the tally of a scenario, and ways to run a
command or a read so that a crash or a hang is an outcome rather than the harness's end.

Outcomes of a trial:
- ok: the result is proven equal to the reference (same bytes after a resume; damaged data read
  back equal to the original; every good record kept and every bad one counted);
- clear_error: the format's own error, or a CLI exit with a message naming the file and no
  traceback;
- silent_wrong: different data, or records lost without a count, and no error;
- crash: a traceback, a signal, an unexpected exception type, or an error that names no file;
- hang: no end within the trial's time limit;
- leftover: the resumed output is right but temp or work files were left behind.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import typing
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

OUTCOMES = ("ok", "clear_error", "silent_wrong", "crash", "hang", "leftover")
TIMEOUT_S = 600
ADDRESS_SPACE = 3 << 30  # bad corpora: a parser that balloons is killed, and counted as a crash


@dataclass
class Tally:
    """One scenario's outcomes, and a note for every trial that did not end well."""

    scenario: str
    counts: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def add(self, outcome: str, note: str = "") -> None:
        assert outcome in OUTCOMES, outcome
        self.counts[outcome] += 1
        if outcome not in ("ok", "clear_error") and note:
            self.notes.append(note[-600:])

    def row(self) -> dict:
        return {"scenario": self.scenario, "trials": sum(self.counts.values()),
                **{o: self.counts[o] for o in OUTCOMES}, "notes": self.notes[:5]}


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "fuelline.cli", *map(str, args)]


def run(argv: list[str], *, limit_memory: bool = False, timeout: float = TIMEOUT_S, env=None):
    """A command to its end: (returncode, stderr); returncode None when it hung."""
    def preexec():
        if limit_memory:
            resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, preexec_fn=preexec, env=env)
    except subprocess.TimeoutExpired:
        return None, f"hung for {timeout:.0f} s"
    return done.returncode, done.stderr


def changed_options(config_class, given: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    """(the name the refusal of a resume must give, the command-line words) for every option of
    `config_class` that decides the output, each given a value other than its default; `given`: the
    words of the options no rule here derives a value for (a model, a layer list)."""
    from fuelline.pipeline.options import default_of, option_fields

    found = []
    for field, hint in option_fields(config_class):
        if not field.metadata.get("identity", True):
            continue
        flag = field.metadata.get("flag") or "--" + field.name.replace("_", "-")
        default, choices = default_of(field), field.metadata.get("choices")
        if field.name in given:
            words = given[field.name]
        elif choices:
            words = [flag, next(c for c in choices if c != default)]
        elif default is None and bool in typing.get_args(hint):
            words = [flag]
        elif isinstance(default, bool):
            words = [flag if not default else "--no-" + flag[2:]]
        elif isinstance(default, list):
            words = [flag, ",".join(default[:1])]
        else:
            low = field.metadata.get("min") or 0
            words = [flag, str(max(low, 1) if default is None else default // 2 or 1)]
        found.append((f"config.{field.name}", words))
    return found


def failure_outcome(returncode: int | None, stderr: str, names: str) -> str:
    """A failed command: a clear error names `names` and shows no traceback; anything else crashed."""
    if returncode is None:
        return "hang"
    if returncode < 0 or "Traceback" in stderr or names not in stderr:
        return "crash"
    return "clear_error"


def kill_after(argv: list[str], seconds: float) -> None:
    """Run `argv` in a session of its own and SIGKILL the whole session (children too) if it still runs
    after `seconds`: a kill at the moment a trial chose."""
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_in_parallel(trials: list[tuple[str, Callable[[], tuple[str, str]]]], workers: int = 4) -> list[Tally]:
    """(scenario, trial) pairs run `workers` at a time (they mostly wait on servers and processes);
    the outcomes tallied by scenario, in the order the scenarios first appear."""
    from concurrent.futures import ThreadPoolExecutor

    tallies: dict[str, Tally] = {}
    with ThreadPoolExecutor(workers) as pool:
        for (name, _), (outcome, note) in zip(trials, pool.map(lambda trial: trial[1](), trials)):
            tallies.setdefault(name, Tally(name)).add(outcome, note)
    return list(tallies.values())


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def isolated(fn: Callable[[], str], timeout: float = 60) -> tuple[str, str]:
    """fn() in a forked child, so that a segfault, SIGBUS or hang is an outcome, not the harness's end."""
    import multiprocessing
    import traceback

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        try:
            send.send((fn(), ""))
        except BaseException:  # noqa: BLE001 - everything unexpected is the finding
            send.send(("crash", traceback.format_exc()))

    proc = context.Process(target=child)
    proc.start()
    send.close()
    result = receive.recv() if receive.poll(timeout) else ("hang", f"hung for {timeout:.0f} s")
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if proc.exitcode and proc.exitcode < 0 and result[0] not in ("crash", "hang"):
        result = ("crash", f"died of signal {-proc.exitcode}")
    return result


def judged(read: Callable[[], object], original: object, error_type: type, names: str) -> str:
    """ok when `read()` equals `original`; clear_error for `error_type` naming `names`; else the finding."""
    import numpy as np

    try:
        got = read()
    except error_type as e:
        if names not in str(e):
            raise AssertionError(f"the error names no file: {e}") from e
        return "clear_error"
    same = got.keys() == original.keys() and all(np.array_equal(got[k], original[k]) for k in got)
    return "ok" if same else "silent_wrong"


def damage_file(path: Path, kind: str, where: float, value: int) -> None:
    data = bytearray(path.read_bytes())
    at = min(int(where * len(data)), max(len(data) - 1, 0))
    if kind == "truncate":
        del data[at:]
    elif data:
        data[at] ^= value
    path.write_bytes(bytes(data))


def table(rows: list[dict]) -> str:
    lines = ["| scenario | trials | ok | clear error | silent wrong | crash | hang | leftover |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['scenario']} | {r['trials']} | {r['ok']} | {r['clear_error']} | {r['silent_wrong']} | "
              f"{r['crash']} | {r['hang']} | {r['leftover']} |" for r in rows]
    return "\n".join(lines)


def can_mount(work: Path) -> bool:
    """Whether a tmpfs can be mounted here (root, and a container that allows it)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    probe = work / "mount-probe"
    if not mount_tmpfs(probe, 64 << 10):
        return False
    subprocess.run(["umount", "-l", str(probe)], capture_output=True)
    return True


def mount_tmpfs(directory: Path, size: int, *, read_only: bool = False) -> bool:
    directory.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
                          capture_output=True).returncode == 0
