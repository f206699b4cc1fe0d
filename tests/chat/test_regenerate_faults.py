"""Regeneration against servers that go wrong (issue 25): every server gone, answers that are
not answers, bookkeeping fields that are garbage, and stats that must describe the whole input
after a resume. Real HTTP servers on 127.0.0.1: fuelline.serve.echo and its fault modes, each
on a thread of the test process."""

import asyncio
import time
from contextlib import ExitStack

import orjson
import pytest

from fuelline.chat.regenerate import RegenerateConfig, regenerate
from fuelline.serve.client import ClientConfig, NoServerError, ServerPool

from .test_regenerate import after_lines, assert_regenerated, echo_servers, echo_thread, free_port, lines

QUESTION = [{"role": "user", "content": "q"}]


def abandoning(coro, seconds: float):
    """(finished, result) of `coro` run on its own loop for at most `seconds`. A task still
    pending then is abandoned, never awaited: a hang fails the test instead of hanging it."""
    loop = asyncio.new_event_loop()

    async def bounded():
        task = asyncio.ensure_future(coro)
        await asyncio.wait([task], timeout=seconds)
        return (True, task.result()) if task.done() else (False, None)

    try:
        return loop.run_until_complete(bounded())
    finally:
        loop.close()


def test_requests_waiting_for_a_dead_server_stop_cleanly_when_cancelled():
    """Issue 25 class 2: the run's first error cancels the requests waiting for a server; some of
    them were cancelled as their wait timed out, which (Python 3.11, asyncio.Condition under
    wait_for) released a lock they no longer held and left it taken for good: the run hung
    while stopping. 20 rounds of 32 waiters cancelled mid-wait, 1 ms waits: each must end
    cancelled, and soon."""
    config = ClientConfig(concurrency=4, attempts=3, backoff=0.0, probe_interval=0.001, backoff_max=0.01,
                          all_down_timeout=600)

    async def rounds():
        async with ServerPool([f"127.0.0.1:{free_port()}"], config, warn=lambda m: None) as pool:
            for number in range(20):
                tasks = [asyncio.create_task(pool.complete("echo", QUESTION, {})) for _ in range(32)]
                await asyncio.sleep(0.05)
                for task in tasks:
                    task.cancel()
                _, pending = await asyncio.wait(tasks, timeout=30)
                if pending:
                    return f"round {number}: {len(pending)} of 32 requests never ended after cancel"
                errors = [t.exception() for t in tasks if not t.cancelled()]
                if errors:
                    return f"round {number}: {errors[0]!r}"
        return "ok"

    finished, result = abandoning(rounds(), 120)
    assert finished and result == "ok", result


def test_all_servers_down_fails_at_the_deadline_not_at_the_next_probe():
    """all_down_timeout is kept to the second even when the probe interval is longer."""
    config = ClientConfig(attempts=2, backoff=0.0, probe_interval=60.0, all_down_timeout=0.5)

    async def request():
        async with ServerPool([f"127.0.0.1:{free_port()}"], config, warn=lambda m: None) as pool:
            started = time.monotonic()
            try:
                await pool.complete("echo", QUESTION, {})
            except NoServerError as e:
                return str(e), time.monotonic() - started
            return "answered", 0.0

    finished, result = abandoning(request(), 30)
    assert finished, "no error 30 s after every server was gone (all_down_timeout 0.5 s)"
    message, seconds = result
    assert "no server has answered" in message and seconds < 20


def chats(count: int, turns: int = 2) -> list[dict]:
    return [{"id": f"c{i}", "conversations": [t for k in range(turns) for t in (
        {"role": "user", "content": f"question {i}.{k}"}, {"role": "assistant", "content": "old"})]}
        for i in range(count)]


def write_jsonl(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def test_every_server_stopped_mid_run_ends_with_the_documented_error(tmp_path):
    """The probe's run: two servers answering, both stopped after ~100 conversations (their sockets
    closed, their connections cut, as SIGTERM stops `python -m fuelline.serve.echo`)."""
    source = write_jsonl(tmp_path / "in.jsonl", chats(600))
    output = tmp_path / "out.jsonl"
    config = RegenerateConfig("echo", client=ClientConfig(concurrency=8, request_timeout=60, attempts=4,
                                                          backoff=0.05, probe_interval=0.2, all_down_timeout=2))
    with ExitStack() as servers_running:
        urls = [servers_running.enter_context(echo_thread("--delay", "0.01")) for _ in range(2)]
        started = time.monotonic()
        with after_lines(output, 100, servers_running.close):
            with pytest.raises(RuntimeError, match="no server has answered for 2 s.*run the same command again"):
                regenerate([source], output, urls, config, progress=False, warn=lambda m: None)
    assert time.monotonic() - started < 60
    assert 100 <= lines(output) < 600


ONE_TRY_EACH = ClientConfig(concurrency=4, request_timeout=60.0, attempts=4, backoff=0.01, probe_interval=0.1)


def regenerate_quietly(source, output, urls, warnings=None, resume=False, **options):
    config = RegenerateConfig("echo", client=options.pop("client", ONE_TRY_EACH), **options)
    return regenerate([source], output, urls, config, resume=resume, progress=False,
                      warn=(warnings.append if warnings is not None else lambda m: None))


@pytest.mark.parametrize("fault", ["empty", "whitespace", "abort", "reasoning-only", "no-choices", "html",
                                   "error-object", "truncated-json", "wrong-types", "cut"])
def test_an_answer_that_is_not_one_is_retried_elsewhere_never_written(tmp_path, fault):
    """Issue 25 class 3: "", whitespace and finish_reason "abort" (partial text) were written and
    later turns conditioned on them. Beside a good server, every conversation still gets real answers."""
    records = chats(30)
    source = write_jsonl(tmp_path / "in.jsonl", records)
    # A retry goes back to the faulty server when the good one is full: enough attempts that no
    # conversation fails for good on a loaded machine, and a faulty server that rests a while.
    client = ClientConfig(concurrency=4, request_timeout=60.0, attempts=10, backoff=0.01, probe_interval=1.0)
    with echo_servers(("--fault", fault), ()) as urls:
        stats = regenerate_quietly(source, tmp_path / "out.jsonl", urls, client=client)
    assert_regenerated(tmp_path / "out.jsonl", records)
    assert stats["dropped"] == {} and stats["finish_reasons"] == {"stop": 60}
    assert stats["servers"][urls[0]]["failed"] > 0
    if fault == "abort":
        assert stats["counters"]["answers_abort"] > 0  # every finish reason received is counted


@pytest.mark.parametrize("fault, reason", [("empty", "empty_answer"), ("whitespace", "empty_answer"),
                                           ("abort", "finish_abort"), ("reasoning-only", "no_content"),
                                           ("error-object", "bad_answer")])
def test_a_server_answering_only_non_answers_sends_every_conversation_to_the_errors_file(tmp_path, fault, reason):
    records = chats(5)
    source = write_jsonl(tmp_path / "in.jsonl", records)
    output = tmp_path / "out.jsonl"
    client = ClientConfig(concurrency=4, request_timeout=60.0, attempts=2, backoff=0.01, probe_interval=0.1,
                          failures_to_rest=10**6)
    with echo_servers(("--fault", fault),) as urls:
        stats = regenerate_quietly(source, output, urls, client=client)
    errors = [orjson.loads(line) for line in (tmp_path / "out.jsonl.errors").read_bytes().splitlines()]
    assert not output.read_bytes() and stats["records_out"] == 0
    assert stats["dropped"] == {"failed": 5} and stats["failures"] == {reason: 5}
    assert sorted(e["id"] for e in errors) == [r["id"] for r in records] and {e["reason"] for e in errors} == {reason}


def test_empty_answers_and_other_finish_reasons_are_kept_when_asked(tmp_path):
    records = chats(4, turns=1)
    source = write_jsonl(tmp_path / "in.jsonl", records)
    with echo_servers(("--fault", "empty"),) as urls:
        stats = regenerate_quietly(source, tmp_path / "empty.jsonl", urls, keep_empty_answers=True)
    written = [orjson.loads(line) for line in (tmp_path / "empty.jsonl").read_bytes().splitlines()]
    assert stats["records_out"] == 4 and all(r["conversations"][1]["content"] == "" for r in written)
    with echo_servers(("--fault", "abort"),) as urls:
        stats = regenerate_quietly(source, tmp_path / "abort.jsonl", urls, finish_reasons=("stop", "length", "abort"))
    assert stats["records_out"] == 4 and stats["finish_reasons"] == {"abort": 4}
    with pytest.raises(ValueError, match="finish_reasons is empty"):
        RegenerateConfig("echo", finish_reasons=("", " "))


def test_a_garbage_usage_count_is_unknown_tokens_said_once_never_the_end_of_the_run(tmp_path):
    """Issue 25 class 4: usage.completion_tokens "n/a" on 5% of answers ended the run with
    `invalid literal for int()`; a second choice was taken silently."""
    records = chats(60)
    source = write_jsonl(tmp_path / "in.jsonl", records)
    warnings: list[str] = []
    with echo_servers(("--fault", "bad-usage", "--fault-every", "20"), ("--fault", "two-choices")) as urls:
        stats = regenerate_quietly(source, tmp_path / "out.jsonl", urls, warnings)
    assert_regenerated(tmp_path / "out.jsonl", records)  # choices[0], the echo's answer, every time
    assert stats["dropped"] == {} and 0 < stats["counters"]["tokens_unknown"] <= 120 // 20
    assert stats["counters"]["tokens_generated"] == 8 * (120 - stats["counters"]["tokens_unknown"])
    assert sum("usage.completion_tokens 'n/a'" in w for w in warnings) == 1  # said once, naming the server
    assert any(urls[0] in w and "usage" in w for w in warnings)
    assert sum("choices; the first is taken" in w for w in warnings) == 1


def whole_input(stats: dict) -> dict:
    """The stats that describe the input and output; counters and servers are one run's work."""
    return {k: v for k, v in stats.items() if k not in ("counters", "servers", "wall_seconds")}


def test_stats_after_a_resume_equal_those_of_an_uninterrupted_run(tmp_path):
    """Issue 25 class 5: 120 lines with 20 duplicate ids said `dropped: duplicate_id 20`, and
    `dropped: none`, records in 100, after a resume."""
    records = chats(100)
    lines_in = records + [{**r, "conversations": r["conversations"][:2]} for r in records[:20]]
    source = write_jsonl(tmp_path / "in.jsonl", lines_in)
    with echo_servers((),) as urls:
        whole = regenerate_quietly(source, tmp_path / "whole.jsonl", urls)
        again = regenerate_quietly(source, tmp_path / "whole.jsonl", urls, resume=True)
        output = tmp_path / "cut.jsonl"
        regenerate_quietly(source, output, urls)
        kept = output.read_bytes().splitlines(keepends=True)[:37]
        output.write_bytes(b"".join(kept) + b'{"id": "c9', )  # killed in the middle of a line
        resumed = regenerate_quietly(source, output, urls, resume=True)
    assert whole["records_in"] == 120 and whole["dropped"] == {"duplicate_id": 20}
    assert whole_input(again) == whole_input(whole) and again["counters"]["resumed"] == 100
    assert whole_input(resumed) == whole_input(whole) and resumed["counters"]["resumed"] == 37
    assert orjson.loads((tmp_path / "cut.stats.json").read_bytes()) == resumed
    assert_regenerated(output, records)
