"""Reliability family (r): the streaming target cache's acknowledgements against its window, so that
no configuration leaves the builder and a trainer waiting on each other.

Each trial runs `fuelline cache stream` and two trainer ranks (tests/cache/stream_trainer.py) with
one combination of acknowledgement mode (what is yielded, or each checkpoint), shuffle group,
window, DataLoader batch size and workers, and checkpoint period; in some, the builder or a trainer
is SIGKILLed at a random moment and started again, the builder with another window. Every trial
is bounded in time (a hang is an outcome). ok: every epoch's samples read once across the ranks,
byte-equal to the offline build's, nothing left behind; clear_error: a trainer refused when it
opens, or a builder refused when it resumes, with the rule's message ("each would wait for the
other", "would wait on each other", "would be waited for forever"). The reference and the
judgement are family (m)'s (reliability_stream.py).
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from pathlib import Path

from reliability_stream import TRAINER, TRIAL_SECONDS, Stream, _kill, _start
from trials import Tally, cli

REFUSALS = ("each would wait for the other", "would wait on each other", "would be waited for forever")
# (acknowledge, shuffle_partitions, window, batch size, workers, checkpoint every N batches)
GRID = list(itertools.product(("yielded", "checkpoint"), (1, 2), (1, 2, 4), ((0, 0), (3, 2)), (1, 3)))
REDUCED = [("checkpoint", 2, 2, (0, 0), 3), ("checkpoint", 1, 1, (3, 2), 1), ("yielded", 2, 2, (3, 2), 1)]


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    from reliability_cache import cache_inputs

    chats, model = cache_inputs(work)
    work = work / "stream-acks"
    work.mkdir()
    stream, rng = Stream(model, chats, work), random.Random(seed)
    grid = [case for case in GRID if case[0] == "checkpoint" or case[4] == 1] if full else REDUCED
    combos, killed = Tally("stream acknowledgements x shuffle groups x windows x batches"), \
        Tally("stream acknowledgements with kills and a builder resumed with another window")
    for k, case in enumerate(grid):
        outcome, note = trial(stream, work / f"combo-{k}", case, [])
        combos.add(outcome, f"{case}: {note}")
    for k in range(6 if full else 1):
        case = rng.choice(grid) if full else ("checkpoint", 1, 4, (3, 2), 1)
        kills = sorted((rng.uniform(2.0, 10.0), rng.choice(["builder", "trainer-0", "trainer-1"])) for _ in range(2))
        outcome, note = trial(stream, work / f"kill-{k}", case, kills, rng.choice([1, 2, 4]))
        killed.add(outcome, f"{case} kills {kills}: {note}")
    return [combos, killed]


def trial(stream: Stream, out: Path, case: tuple, kills: list, resumed_window: int | None = None) -> tuple[str, str]:
    """Builder and two trainer ranks of `case`, the processes `kills` names SIGKILLed at those seconds
    and started again (the builder with `resumed_window`): the outcome once all have ended."""
    acknowledge, shuffle, window, (batch, workers), every = case
    options = ["--partition-samples", 5, "--epochs", 2, "--window", window, "--wait-timeout", 60]
    argv = {"builder": cli(*stream.words(out, *options))}
    checkpoints = {}
    for rank in (0, 1):
        checkpoints[rank] = out.parent / f"{out.name}-trainer-{rank}.json"
        argv[f"trainer-{rank}"] = [sys.executable, str(TRAINER), str(out), str(rank), "2", str(checkpoints[rank]),
                                   "0.005", acknowledge, str(shuffle), str(batch), str(workers), str(every)]
    logs = {name: out.parent / f"{out.name}-{name}.log" for name in argv}
    processes = {name: _start(words, logs[name]) for name, words in argv.items()}
    started, pending = time.monotonic(), list(kills)
    try:
        while any(p.poll() is None for p in processes.values()):
            if time.monotonic() - started > TRIAL_SECONDS:
                return "hang", f"not finished after {TRIAL_SECONDS} s"
            for name, process in processes.items():
                if process.poll() not in (None, 0):
                    said = logs[name].read_text()
                    last = said.strip().splitlines()[-1] if said.strip() else ""
                    if process.returncode > 0 and any(r in last for r in REFUSALS) and last.startswith(
                            ("error: ", "fuelline.formats.target_stream.StreamError: ")):
                        if name == "builder" and "would wait on each other" in said and resumed_window is not None:
                            argv["builder"] = cli(*stream.words(out, *options))  # back to a window that fits
                            logs[name].write_text("")
                            processes[name] = _start(argv[name], logs[name])
                            resumed_window = None
                            break
                        return "clear_error", ""
                    return "crash", f"{name} exit {process.returncode}: {said[-600:]}"
            if pending and time.monotonic() - started > pending[0][0]:
                _, name = pending.pop(0)
                _kill(processes[name])
                if name == "builder" and resumed_window is not None:
                    words = [str(w) for w in argv["builder"]]
                    words[words.index("--window") + 1] = str(resumed_window)
                    argv["builder"] = words
                processes[name] = _start(argv[name], logs[name])
            time.sleep(0.02)
    finally:
        for process in processes.values():
            _kill(process)
    return stream.judge(out, {rank: json.loads(path.read_bytes())["consumed"] for rank, path in checkpoints.items()})
