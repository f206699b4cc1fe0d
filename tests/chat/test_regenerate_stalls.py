"""Stalled, slow and non-streaming servers under regeneration (issue 36 class 9), against echo
servers on threads of the test process: a server that lists its model and never answers ends the
run at the stall timeout, saying so while it waits; a slow answer that keeps streaming is never
cut; a server that stops in the middle of an answer is a stall, retried; servers that answer
whole, or refuse to stream, get whole-answer requests."""

import time

import pytest

from fuelline.chat.regenerate import RegenerateConfig, regenerate
from fuelline.serve.client import ClientConfig

from .test_regenerate_faults import chats, write_jsonl
from .test_regenerate import assert_regenerated, echo_servers


def quick(stall: float, **options) -> ClientConfig:
    return ClientConfig(**{"concurrency": 4, "request_timeout": 60.0, "stall_timeout": stall, "attempts": 4,
                           "backoff": 0.01, "probe_interval": 0.1, "all_down_timeout": 2.0, **options})


def test_a_server_that_lists_its_model_and_never_answers_ends_the_run_at_the_stall_timeout(tmp_path):
    """The reproducer: `--request-timeout 600` x `--attempts 5` kept such a run silent for up to ~50
    minutes. Now the one-token check finds it within the stall timeout (60 s by default), and the
    terminal names the server and how long it has been silent meanwhile."""
    assert ClientConfig().stall_timeout == 60
    source = write_jsonl(tmp_path / "in.jsonl", chats(3))
    warnings: list[str] = []
    with echo_servers(("--fault", "stall"),) as [url]:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="answered no one-token completion within --stall-timeout 1 s"):
            regenerate([source], tmp_path / "out.jsonl", [url], RegenerateConfig("echo", client=quick(1.0)),
                       progress=False, warn=warnings.append)
        assert time.monotonic() - started < 10
    assert any(w.startswith(f"waiting: {url} has sent nothing for") and "one-token" in w for w in warnings), warnings


def test_a_slow_answer_that_keeps_streaming_is_never_cut(tmp_path):
    """Each chunk 0.15 s after the last: a 1.5 s answer, longer than the stall timeout (0.6 s) and
    than a whole answer's --request-timeout (1 s), taken whole."""
    records = chats(2, turns=1)
    source = write_jsonl(tmp_path / "in.jsonl", records)
    with echo_servers(("--chunk-delay", "0.15"),) as urls:
        started = time.monotonic()
        stats = regenerate([source], tmp_path / "out.jsonl", urls,
                           RegenerateConfig("echo", client=quick(0.6, request_timeout=1.0)), progress=False)
    assert time.monotonic() - started > 1.2  # the answers really took longer than both limits
    assert_regenerated(tmp_path / "out.jsonl", records)
    server = stats["servers"][urls[0]]
    assert stats["dropped"] == {} and server["stalls"] == 0 and server["streamed"] is True
    assert stats["counters"]["tokens_generated"] == 8 * 2  # usage from the stream's last chunk


def test_a_server_stopping_in_the_middle_of_answers_is_a_stall_retried_elsewhere(tmp_path):
    records = chats(20)
    source = write_jsonl(tmp_path / "in.jsonl", records)
    warnings: list[str] = []
    with echo_servers(("--fault", "stall-midway", "--fault-every", "3"), ()) as urls:
        stats = regenerate([source], tmp_path / "out.jsonl", urls, RegenerateConfig("echo", client=quick(
            0.5, attempts=8, all_down_timeout=30.0)), progress=False, warn=warnings.append)
    assert_regenerated(tmp_path / "out.jsonl", records)  # no half answer written
    assert stats["dropped"] == {} and stats["servers"][urls[0]]["stalls"] > 0
    assert any(f"{urls[0]} sent nothing for 0.5 s" in w and "resting it until it answers" in w for w in warnings)


def test_servers_that_answer_whole_or_refuse_to_stream_get_whole_answer_requests(tmp_path):
    records = chats(10)
    source = write_jsonl(tmp_path / "in.jsonl", records)
    warnings: list[str] = []
    with echo_servers(("--stream", "never"), ("--stream", "refuse")) as urls:
        stats = regenerate([source], tmp_path / "out.jsonl", urls, RegenerateConfig("echo", client=quick(5.0)),
                           progress=False, warn=warnings.append)
    assert_regenerated(tmp_path / "out.jsonl", records)
    assert stats["dropped"] == {} and [stats["servers"][u]["streamed"] for u in urls] == [False, False]
    assert all(stats["servers"][u]["requests"] > 0 and stats["servers"][u]["failed"] == 0 for u in urls)
    assert any(f"{urls[0]} answers a streamed request whole" in w and "--request-timeout 60 s" in w for w in warnings)
    assert any(f"{urls[1]} refuses to stream (400" in w for w in warnings)
