"""Regeneration against servers that go wrong (issue 25): every server gone, answers that are
not answers, bookkeeping fields that are garbage, and stats that must describe the whole input
after a resume. Real HTTP servers on 127.0.0.1: fuelline.serve.echo and its fault modes."""

import asyncio
import signal
import threading
import time

import orjson
import pytest

from fuelline.chat.regenerate import RegenerateConfig, regenerate
from fuelline.serve.client import ClientConfig, NoServerError, ServerPool

from .test_regenerate import FAST_CLIENT, assert_regenerated, echo_servers, free_port, lines

QUESTION = [{"role": "user", "content": "q"}]


def abandoning(coro, seconds: float):
    """(finished, result) of `coro` run on its own loop for at most `seconds`. A task still
    pending then is abandoned, never awaited: a hang fails the test instead of hanging it."""
    loop = asyncio.new_event_loop()

    async def bounded():
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait([task], timeout=seconds)
        return (True, task.result()) if done else (False, None)

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
                done, pending = await asyncio.wait(tasks, timeout=30)
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


def test_every_server_killed_mid_run_ends_with_the_documented_error(tmp_path):
    """The probe's run: two servers answering, both sent SIGTERM after ~100 conversations."""
    source = write_jsonl(tmp_path / "in.jsonl", chats(600))
    output = tmp_path / "out.jsonl"
    config = RegenerateConfig("echo", client=ClientConfig(concurrency=8, request_timeout=60, attempts=4,
                                                          backoff=0.05, probe_interval=0.2, all_down_timeout=2))
    with echo_servers(("--delay", "0.01"), ("--delay", "0.01")) as (urls, procs):
        def kill_after_100():
            deadline = time.monotonic() + 120
            while lines(output) < 100 and time.monotonic() < deadline:
                time.sleep(0.01)
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
        threading.Thread(target=kill_after_100, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="no server has answered for 2 s.*rerun with --resume"):
            regenerate([source], output, urls, config, progress=False, warn=lambda m: None)
    assert time.monotonic() - started < 60
    assert 100 <= lines(output) < 600
