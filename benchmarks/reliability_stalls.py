"""Reliability family (g), issue 36: `fuelline chat regenerate` against servers that stall, are
slow, or do not stream, and on prompt records.

Each trial runs the CLI as a subprocess with a time limit (a run that does not end within it is a
hang) against echo servers on 127.0.0.1 (`fuelline.serve.echo`):
- stalls: a server that lists its model and never answers (alone: a clear error naming it, after
  the stall timeout, never the old ~50 minutes; beside a good one: every record right), one that
  stops in the middle of answers, one that never answers every 3rd request;
- slow: answers streamed a piece every 0.3 s, longer in total than both the stall timeout and
  `--request-timeout`: every record must be written, none taken for a stall;
- not streaming: a server that answers whole (`--stream never`), one that refuses to stream
  (`--stream refuse`), one that answers whole and stalls every 3rd request;
- prompts: conversations ending with a user turn, chat prepare's eval records `{id, turns}` and
  records with nothing to answer (each answer must be the echo's answer to its history, each
  record without anything to answer in OUT.errors as `nothing_to_regenerate`, never written);
  input with nothing to answer at all (exit 2 naming the reason); `--regenerate-turns all` on
  conversations with tool results (refused per record, never written).

Outcomes as in benchmarks/trials.py; a record lost for a false reason (a healthy slow answer
taken for a stall) or written without its answers is silent_wrong. Called by
benchmarks/reliability.py (`scenarios()`); `python benchmarks/reliability_stalls.py [--reduced]`
runs it alone.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from functools import partial
from pathlib import Path

import orjson
from reliability_servers import echo_servers, judge, regenerate_argv
from trials import Tally, cli, failure_outcome, run, run_in_parallel, table

STALL_S = 2  # the trials' --stall-timeout; one full-run trial keeps the default (60 s)
LIMIT_S = 90  # a trial past this is a hang
DEFAULTS_LIMIT_S = 150  # the trial under the defaults: 60 s to find the stall, then the error
TRIAL_NUMBERS = itertools.count()  # each trial's own output directory


def scenarios(work: Path, *, full: bool, seed: int = 0) -> list[Tally]:  # noqa: ARG001 - the families' signature
    chats = plain_chats(work, 8)
    stall = ("--stall-timeout", str(STALL_S))
    trials = [
        ("stalls: lists its model, never answers, alone", partial(
            server_trial, work, chats, [("--fault", "stall")], stall, expect="error")),
        ("stalls: lists its model, never answers, beside a good one", partial(
            server_trial, work, chats, [("--fault", "stall"), ()], stall)),
        ("stalls: stops in the middle of every 2nd answer, beside a good one", partial(
            server_trial, work, chats, [("--fault", "stall-midway", "--fault-every", "2"), ()], stall)),
        ("stalls: never answers every 3rd request, alone", partial(
            server_trial, work, chats, [("--fault", "stall", "--fault-every", "3")], stall, expect="either")),
        ("slow: a piece every 0.3 s, answers longer than both timeouts", partial(
            server_trial, work, chats, [("--chunk-delay", "0.3")],
            ("--stall-timeout", "1.5", "--request-timeout", "1"), expect="all")),
        ("not streaming: answers whole", partial(server_trial, work, chats, [("--stream", "never")], stall,
                                                 expect="all")),
        ("not streaming: refuses to stream", partial(server_trial, work, chats, [("--stream", "refuse")], stall,
                                                     expect="all")),
        ("not streaming: answers whole, stalls every 3rd, beside a good one", partial(
            server_trial, work, chats, [("--stream", "never", "--fault", "stall", "--fault-every", "3"), ()],
            ("--request-timeout", "2"))),
        ("prompts: open conversations, eval records, nothing to answer", partial(prompt_trial, work)),
        ("prompts: nothing to answer at all", partial(nothing_trial, work)),
        ("prompts: --regenerate-turns all on conversations with tool results", partial(turns_all_trial, work)),
    ]
    if full:
        trials.append(("stalls: lists its model, never answers, alone, under the defaults", partial(
            server_trial, work, chats, [("--fault", "stall")], (), expect="error", limit=DEFAULTS_LIMIT_S,
            defaults=True)))
        trials += [(f"stalls: stops in the middle of every {k}th answer, alone", partial(
            server_trial, work, chats, [("--fault", "stall-midway", "--fault-every", str(k))], stall, expect="either"))
            for k in (2, 3)]
    return run_in_parallel(trials)


def plain_chats(work: Path, count: int) -> Path:
    path = work / "stalls-chats.jsonl"
    write(path, [{"id": f"c{i}", "conversations": [
        {"role": "user", "content": f"问题 {i}"}, {"role": "assistant", "content": "旧"},
        {"role": "user", "content": f"再问 {i}"}, {"role": "assistant", "content": "旧"}]} for i in range(count)])
    return path


def write(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def server_trial(work: Path, chats: Path, servers: list[tuple[str, ...]], options: tuple[str, ...], *,
                 expect: str = "ok", limit: float = LIMIT_S, defaults: bool = False) -> tuple[str, str]:
    """`expect`: ok (every record right, failures allowed in OUT.errors), all (every record written,
    none failed), error (a clear error naming the server), either (ok or a clear error).
    `defaults`: none of the harness's quick client options."""
    out = work / f"stalls-{next(TRIAL_NUMBERS)}" / "out.jsonl"
    with echo_servers(servers) as urls:
        argv = (cli("chat", "regenerate", "-i", chats, "-o", out, "--model", "echo", "-q",
                    *[a for url in urls for a in ("--server", url)]) if defaults
                else regenerate_argv(chats, out, urls, *options))
        code, stderr = run(argv, timeout=limit)
    outcome, note = judge(code, stderr, chats, out)
    if outcome == "ok" and expect == "error":
        return "silent_wrong", "a server that never answers gave exit 0"
    if outcome == "clear_error" and expect in ("ok", "all"):
        return "crash", f"expected every record, got an error: {stderr[-400:]}"
    if outcome == "ok" and expect == "all" and lines(out.with_name(out.name + ".errors")):
        return "silent_wrong", f"records lost for a false reason: {lines(out.with_name(out.name + '.errors'))[:2]}"
    return outcome, note


TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
OPEN = {"id": "open", "conversations": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "old"},
                                        {"role": "user", "content": "Color?"}]}
# Valid records with nothing to answer (an empty conversation is no valid record: the contract's refusal,
# family (j)).
NOTHING = [{"id": "system-only", "conversations": [{"role": "system", "content": "Be brief."}]},
           {"id": "system-only-2", "conversations": [{"role": "system", "content": "Answer in French."}]}]
TOOL_RESULTS = {"id": "tool", "tools": TOOLS, "conversations": [
    {"role": "user", "content": "Time?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_time",
                                                                                          "arguments": {}}}]},
    {"role": "tool", "content": "09:00"}, {"role": "assistant", "content": "Nine."}]}


def prompt_trial(work: Path) -> tuple[str, str]:
    """Prompts answered, eval records answered turn by turn, records with nothing dropped with the reason."""
    source = write(work / "prompts" / "in.jsonl", [OPEN, {"id": "eval", "turns": ["Hi", "Name a river"]}, *NOTHING])
    out = work / "prompts" / "out.jsonl"
    with echo_servers([()]) as urls:
        code, stderr = run(regenerate_argv(source, out, urls, "--stall-timeout", str(STALL_S)), timeout=LIMIT_S)
    if code != 0:
        return failure_outcome(code, stderr, "in.jsonl"), stderr[-600:]
    return prompts_judged(out, {"open": 2, "eval": 2}, {r["id"] for r in NOTHING}, "nothing_to_regenerate")


def nothing_trial(work: Path) -> tuple[str, str]:
    source = write(work / "nothing" / "in.jsonl", NOTHING)
    out = work / "nothing" / "out.jsonl"
    with echo_servers([()]) as urls:
        code, stderr = run(regenerate_argv(source, out, urls), timeout=LIMIT_S)
    if code == 0:
        return "silent_wrong", "input with nothing to answer exited 0"
    if lines(out):
        return "silent_wrong", "records with nothing to answer were written"
    return failure_outcome(code, stderr, "nothing_to_regenerate"), stderr[-600:]


def turns_all_trial(work: Path) -> tuple[str, str]:
    source = write(work / "turns-all" / "in.jsonl", [TOOL_RESULTS, OPEN])
    out = work / "turns-all" / "out.jsonl"
    with echo_servers([("--tools", "call")]) as urls:
        code, stderr = run(regenerate_argv(source, out, urls, "--regenerate-turns", "all"), timeout=LIMIT_S)
    if code != 0:
        return failure_outcome(code, stderr, "in.jsonl"), stderr[-600:]
    return prompts_judged(out, {"open": 2}, {"tool"}, "tool_results_under_turns_all")


def prompts_judged(out: Path, answers: dict[str, int], refused: set[str], reason: str) -> tuple[str, str]:
    """ok when each of `answers` (id → assistant turns) holds the echo's answers to its history,
    alternating with its user turns, and each of `refused` is in OUT.errors with `reason` only."""
    from fuelline.serve.echo import echo_answer

    written = {r["id"]: r for r in lines(out)}
    errors = {e["id"]: e for e in lines(out.with_name(out.name + ".errors"))}
    if set(written) != set(answers):
        return "silent_wrong", f"written {sorted(written)}, expected {sorted(answers)}"
    if set(errors) != refused or any(e["reason"] != reason for e in errors.values()):
        return "silent_wrong", f"errors file {errors}, expected {sorted(refused)} as {reason}"
    for rid, count in answers.items():
        turns = written[rid]["conversations"]
        made = [k for k, t in enumerate(turns) if t["role"] == "assistant"]
        if len(made) != count or any(turns[k]["content"] != echo_answer(turns[:k]) for k in made):
            return "silent_wrong", f"{rid}: answers are not the server's answers to the history: {turns}"
        if turns[-1]["role"] != "assistant":
            return "silent_wrong", f"{rid}: its last user turn got no answer"
    return "ok", ""


def main() -> None:
    parser = argparse.ArgumentParser(description="the stalls family of benchmarks/reliability.py alone")
    parser.add_argument("--reduced", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fuelline-stalls-") as work:
        print(table([t.row() for t in scenarios(Path(work), full=not args.reduced)]))


if __name__ == "__main__":
    main()
