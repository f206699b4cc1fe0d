"""Regeneration against real HTTP servers on 127.0.0.1 (fuelline.serve.echo, whose answers are a known
function of the conversation): every id exactly once, answers conditioned on the regenerated
history, exact resume after SIGKILL, failover when a server dies, fails or stalls.

Most servers run on a thread of the test process (`echo_servers`): real HTTP, without the second a
process takes to start. A server the test kills is a process of its own (`echo_processes`)."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from click.testing import CliRunner

import fuelline.cli
from fuelline.chat.regenerate import RegenerateConfig, regenerate
from fuelline.io import read_records
from fuelline.serve.client import ClientConfig
from fuelline.serve.echo import echo_answer, echo_app

from ..conftest import shared_file

# Fast retries and probes; a generous request timeout: no test here finds a fault by a timeout,
# and on a loaded machine a healthy echo server can take seconds to answer.
FAST_CLIENT = ClientConfig(concurrency=8, request_timeout=60.0, attempts=4, backoff=0.05, probe_interval=0.2,
                           all_down_timeout=20.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_echo(*args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fuelline.serve.echo", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/v1/models", timeout=0.5)
            return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"echo server on port {port} did not start")


@contextmanager
def echo_processes(*configs: tuple[str, ...]):
    """Echo servers as processes, for a test that kills one: (their URLs, their processes)."""
    started = [start_echo(*args) for args in configs]
    try:
        yield [url for _, url in started], [proc for proc, _ in started]
    finally:
        for proc, _ in started:
            proc.kill()
            proc.wait()


@contextmanager
def echo_thread(*args: str, port: int = 0):
    """The app `python -m fuelline.serve.echo ARGS` serves, on a thread of this process and its own event
    loop (port 0: a free one). Its URL; the server stops at the end of the block."""
    app, _ = echo_app(["--port", str(port), *args])
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)  # cuts a stalled answer at the end
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@contextmanager
def echo_servers(*configs: tuple[str, ...]):
    """Echo servers on threads of this process, one per tuple of command-line arguments: their URLs."""
    with ExitStack() as stack:
        yield [stack.enter_context(echo_thread(*args)) for args in configs]


def cli(*args: str):
    """`fuelline ARGS` run in this process (click's runner): its exit code and output, stderr apart."""
    return CliRunner().invoke(fuelline.cli.main, list(args))


@pytest.fixture(scope="module")
def conversations(tmp_path_factory):
    """Multi-turn ShareGPT conversations and GSM8K exchanges, as chat-prepare writes them."""
    from fuelline.chat.prepare import ChatPrepareConfig, ChatPrepareStage
    from fuelline.pipeline.executor import RunOptions, run_stage

    out = tmp_path_factory.mktemp("chats") / "train"
    run_stage(ChatPrepareStage(ChatPrepareConfig(test_size=0.0)), [shared_file("chat/sharegpt_zh_1K.jsonl.zst")],
              out, RunOptions(workers=1, progress=False))
    records = list(read_records(out))[:100]  # with the 50 below, about 560 answers to regenerate
    records += [{"id": f"gsm-{i}", "conversations": [{"role": "system", "content": "Be exact."},
                                                     {"role": "user", "content": f"What is {i} + {i}?"},
                                                     {"role": "assistant", "content": str(2 * i)}]}
                for i in range(50)]
    path = out.parent / "chats.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path, records


def assert_regenerated(output: Path, records: list[dict], model: str = "echo") -> list[dict]:
    """Every input id exactly once; non-assistant turns kept; each answer is the echo of the regenerated history."""
    out = [orjson.loads(line) for line in output.read_bytes().splitlines()]
    ids = [r["id"] for r in out]
    assert sorted(ids) == sorted(r["id"] for r in records) and len(set(ids)) == len(ids)
    by_id = {r["id"]: r for r in records}
    for record in out:
        original = by_id[record["id"]]["conversations"]
        turns = record["conversations"]
        assert [t["role"] for t in turns] == [t["role"] for t in original]
        for k, (turn, before) in enumerate(zip(turns, original)):
            if turn["role"] == "assistant":
                assert turn["content"] == echo_answer(turns[:k]), record["id"]  # the regenerated history
            else:
                assert turn["content"] == before["content"]
        regenerated = record["meta"]["regenerated"]
        assert regenerated["model"] == model
        assert len(regenerated["finish_reasons"]) == sum(t["role"] == "assistant" for t in turns)
    return out


def test_two_servers_every_id_once_conditioned_on_the_regenerated_history(conversations, tmp_path):
    path, records = conversations
    with echo_servers((), ()) as urls:
        stats = regenerate([path], tmp_path / "out.jsonl", urls, RegenerateConfig("echo", preset="qwen3",
                           thinking=False, client=FAST_CLIENT), progress=False)
    assert_regenerated(tmp_path / "out.jsonl", records)
    assert stats["records_in"] == stats["records_out"] == len(records) and stats["dropped"] == {}
    assistant_turns = sum(t["role"] == "assistant" for r in records for t in r["conversations"])
    assert stats["counters"]["requests"] == assistant_turns
    assert all(s["requests"] > assistant_turns / 4 for s in stats["servers"].values())  # both used
    assert orjson.loads((tmp_path / "out.stats.json").read_bytes()) == stats
    assert stats["sampling"] == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "max_tokens": 4096,
                                 "chat_template_kwargs": {"enable_thinking": False}}


def test_fields_a_server_refuses_are_left_out_for_it_and_recorded(conversations, tmp_path):
    path, records = conversations
    with echo_servers((), ("--reject-fields", "top_k,min_p")) as urls:
        stats = regenerate([path], tmp_path / "out.jsonl", urls, RegenerateConfig("echo", preset="qwen3",
                           client=FAST_CLIENT), progress=False, warn=lambda m: None)
    out = assert_regenerated(tmp_path / "out.jsonl", records)
    assert stats["servers"][urls[1]]["left_out"] == ["min_p", "top_k"] and stats["servers"][urls[0]]["left_out"] == []
    assert stats["dropped"] == {}
    assert any(r["meta"]["regenerated"].get("left_out") == ["min_p", "top_k"] for r in out)


def write(path: Path, records: list[dict]) -> Path:
    """`records` as a JSONL file at `path` (the input of a regenerate test)."""
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def read(path: Path) -> dict[str, dict]:
    """A regenerate output's records by id."""
    return {r["id"]: r for r in map(orjson.loads, path.read_bytes().splitlines())}


def regenerate_args(path: Path, output: Path, urls: list[str], *extra: str) -> list[str]:
    """`fuelline chat regenerate`'s arguments for PATH → OUTPUT on URLS."""
    args = ["chat", "regenerate", "-i", str(path), "-o", str(output), "--model", "echo", "-q", "--concurrency", "4",
            "--request-timeout", "5", *extra]
    for url in urls:
        args += ["--server", url]
    return args


def run_cli(path: Path, output: Path, urls: list[str], *extra: str) -> subprocess.Popen:
    """`fuelline chat regenerate` as a process of its own, for a test that kills it."""
    return subprocess.Popen([sys.executable, "-m", "fuelline.cli", *regenerate_args(path, output, urls, *extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait_for_lines(output: Path, count: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until `output` holds `count` lines; a run that ended or stalled fails the test, saying so."""
    deadline = time.monotonic() + timeout
    while lines(output) < count:
        assert proc.poll() is None, f"regenerate ended after {lines(output)} lines: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"regenerate wrote {lines(output)} of {count} lines in {timeout} s"
        time.sleep(0.02)


@contextmanager
def stopped_at_exit(proc: subprocess.Popen):
    """The process, killed at the end of the block if it still runs: a failing test leaves nothing behind."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@contextmanager
def after_lines(output: Path, count: int, action):
    """`action` on a thread once `output` holds `count` lines, while the block (a regeneration) runs;
    the block ending first, or the action failing, fails the test."""
    done, failures = threading.Event(), []

    def watch():
        try:
            while lines(output) < count and not done.wait(0.01):
                pass
            if done.is_set():
                raise AssertionError(f"the run ended ({lines(output)} lines) before the action due at {count} lines")
            action()
        except BaseException as e:
            failures.append(e)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=60)
    if failures:
        raise failures[0]


def test_sigkill_mid_run_then_resume_gives_every_id_exactly_once(conversations, tmp_path):
    path, records = conversations
    output = tmp_path / "out.jsonl"
    # At most 8 answers in flight, 0.02 s each: the run takes over a second however fast the machine.
    with echo_servers(("--delay", "0.02"), ("--delay", "0.02")) as urls:
        with stopped_at_exit(run_cli(path, output, urls)) as proc:
            wait_for_lines(output, len(records) // 3, proc)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        partial = lines(output)
        assert 0 < partial < len(records)
        with open(output, "ab") as f:  # as if killed in the middle of a write
            f.write(b'{"id": "torn", "conversations": [')
        again = cli(*regenerate_args(path, output, urls, "--resume"))
    assert again.exit_code == 0, again.stderr
    assert f"({partial:,} resumed)" in again.stdout
    assert_regenerated(output, records)


def test_an_output_regenerate_did_not_begin_is_refused_and_kept(conversations, tmp_path):
    path, records = conversations
    output = tmp_path / "out.jsonl"
    output.write_text('{"id": "x"}\n')
    result = cli(*regenerate_args(path, output, ["127.0.0.1:9"]))
    assert result.exit_code == 2 and "is not a fuelline stage output" in result.stderr and "Traceback" not in result.stderr
    assert output.read_text() == '{"id": "x"}\n'


def test_damaged_output_is_refused_on_resume(conversations, tmp_path):
    path, _ = conversations
    output = tmp_path / "out.jsonl"
    output.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(ValueError, match=r"out.jsonl:2: not a JSON line"):
        regenerate([path], output, ["127.0.0.1:9"], RegenerateConfig("echo", client=FAST_CLIENT), resume=True,
                   progress=False)


def test_a_server_killed_mid_run_loses_nothing(conversations, tmp_path):
    path, records = conversations
    output = tmp_path / "out.jsonl"
    # At most 8 answers in flight, 0.02 s each: the run takes over a second however fast the machine.
    four_at_a_time = replace(FAST_CLIENT, concurrency=4)
    with echo_servers(("--delay", "0.02"),) as [good], echo_processes(("--delay", "0.02"),) as ([doomed], [process]):
        with after_lines(output, len(records) // 4, process.kill):
            stats = regenerate([path], output, [good, doomed], RegenerateConfig("echo", client=four_at_a_time),
                               progress=False, warn=lambda m: None)
        assert process.poll() == -signal.SIGKILL
    assert_regenerated(output, records)
    assert stats["dropped"] == {} and stats["servers"][doomed]["failed"] > 0 and stats["counters"]["retried"] > 0


def test_a_server_that_comes_back_is_used_again(conversations, tmp_path):
    """Stopped mid-run (its socket closed, its connections cut), rested by the client, started again
    on its port: probed and used again. (A server SIGKILLed mid-run: the test above.)"""
    path, records = conversations
    output = tmp_path / "out.jsonl"
    warnings: list[str] = []
    with echo_servers(("--delay", "0.02"),) as [good], ExitStack() as victim_running:
        victim = victim_running.enter_context(echo_thread("--delay", "0.02"))

        def stop_then_bring_back():
            victim_running.close()
            deadline = time.monotonic() + 60
            while not any(victim in w and "resting it" in w for w in warnings):
                assert time.monotonic() < deadline, "the client never rested the stopped server"
                time.sleep(0.01)
            victim_running.enter_context(echo_thread("--delay", "0.02", port=int(victim.rsplit(":", 1)[1])))

        # Two requests in flight per server at 0.02 s each: the run outlasts the server's absence.
        two_at_a_time = replace(FAST_CLIENT, concurrency=2)
        with after_lines(output, len(records) // 5, stop_then_bring_back):
            regenerate([path], output, [good, victim], RegenerateConfig("echo", client=two_at_a_time),
                       progress=False, warn=warnings.append)
    assert any(victim in w and "back in rotation" in w for w in warnings)
    assert_regenerated(output, records)


@pytest.mark.parametrize("fault", [("--fault", "http500"), ("--fault", "drop"), ("--fault", "stall", "--fault-every", "7")])
def test_a_faulty_server_beside_a_good_one_loses_nothing(conversations, tmp_path, fault):
    path, records = conversations
    # The stall timeout is what finds a stalled answer: 2 s, each stall holding a request that long, and
    # an answer of the good server slowed past it by a loaded machine is only retried (8 attempts).
    # Otherwise it is generous: a timeout of the good server would be no fault of its own.
    stall = 2.0 if "stall" in fault else 60.0
    config = RegenerateConfig("echo", client=ClientConfig(concurrency=8, request_timeout=60.0, stall_timeout=stall,
                                                          attempts=8, backoff=0.05, probe_interval=0.2))
    with echo_servers((), fault) as urls:
        stats = regenerate([path], tmp_path / "out.jsonl", urls, config, progress=False, warn=lambda m: None)
    assert_regenerated(tmp_path / "out.jsonl", records)
    assert stats["dropped"] == {} and stats["servers"][urls[1]]["failed"] > 0
    assert not (tmp_path / "out.jsonl.errors").read_bytes()


def test_requests_that_fail_for_good_go_to_the_errors_file_and_are_retried_on_resume(conversations, tmp_path):
    path, records = conversations
    output = tmp_path / "out.jsonl"
    config = RegenerateConfig("echo", client=ClientConfig(concurrency=8, request_timeout=1.0, attempts=2,
                                                          backoff=0.01, probe_interval=0.1, failures_to_rest=10**6))
    with echo_servers(("--fault", "http500", "--fault-every", "3"),) as urls:
        stats = regenerate([path], output, urls, config, progress=False, warn=lambda m: None)
    errors = [orjson.loads(line) for line in (tmp_path / "out.jsonl.errors").read_bytes().splitlines()]
    assert stats["dropped"]["failed"] == len(errors) > 0
    assert stats["records_in"] == len(records) == stats["records_out"] + len(errors)
    assert {e["reason"] for e in errors} == {"http_500"} and all("answered 500" in e["detail"] for e in errors)
    assert not {e["id"] for e in errors} & {r["id"] for r in read_records(output)}
    with echo_servers((),) as urls:
        again = regenerate([path], output, urls, config, resume=True, progress=False)
    assert again["counters"]["regenerated"] == len(errors) and again["dropped"] == {}
    assert_regenerated(output, records)


def test_truncated_answers_keep_their_finish_reason_or_are_dropped(conversations, tmp_path):
    path, records = conversations
    with echo_servers((),) as urls:
        kept = regenerate([path], tmp_path / "kept.jsonl", urls,
                          RegenerateConfig("echo", max_tokens=3, client=FAST_CLIENT), progress=False)
        dropped = regenerate([path], tmp_path / "dropped.jsonl", urls,
                             RegenerateConfig("echo", max_tokens=3, drop_truncated=True, client=FAST_CLIENT),
                             progress=False)
    out = list(read_records(tmp_path / "kept.jsonl"))
    assert len(out) == len(records) and kept["truncated_answers_kept"] == len(records)
    assert all(set(r["meta"]["regenerated"]["finish_reasons"]) == {"length"} for r in out)
    assert dropped["records_out"] == 0 and dropped["dropped"] == {"truncated": len(records)}
    assert not (tmp_path / "dropped.jsonl").read_bytes()


def test_no_server_answers_is_a_clear_error(conversations, tmp_path):
    path, _ = conversations
    result = cli(*regenerate_args(path, tmp_path / "out.jsonl", [f"127.0.0.1:{free_port()}"]))
    assert result.exit_code == 2 and "none of the 1 server(s) answers" in result.stderr
    assert "Traceback" not in result.stderr


def test_malformed_input_names_file_and_line(tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_text('{"id": "a", "conversations": [{"role": "user", "content": "q"}]}\n{"id": 3}\n')
    with echo_servers((),) as urls:
        with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a chat record"):
            regenerate([source], tmp_path / "out.jsonl", urls, RegenerateConfig("echo", client=FAST_CLIENT),
                       progress=False)
    assert not (tmp_path / "out.jsonl").exists()  # refused before the record before it was sent


@pytest.mark.parametrize("bad, message", [
    (b'{"id": "last", "conversations": [{"role": "user", "content": "q", "tool_calls": []}]}',
     "turn 0: tool_calls belongs on an assistant turn, not on a user turn (misplaced_field)"),
    (b'{"id": "last", "conversations": [', "invalid JSON"),
])
def test_a_bad_record_at_the_end_fails_the_run_before_any_request(conversations, tmp_path, bad, message):
    """The whole input is checked first: a bad last record does not cost the server time of every record before it."""
    path, records = conversations
    source = tmp_path / "in.jsonl"
    source.write_bytes(path.read_bytes() + bad + b"\n")
    log = tmp_path / "requests.jsonl"
    with echo_servers(("--log-requests", str(log)),) as urls:
        result = cli(*regenerate_args(source, tmp_path / "out.jsonl", urls))
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert f"in.jsonl:{len(records) + 1}: " in result.stderr and message in result.stderr
    assert not log.exists() or not log.read_bytes()  # no request was sent
    assert not (tmp_path / "out.jsonl").exists()


def test_pipeline_step_prepares_regenerates_reports_and_skips_when_done(tmp_path):
    from fuelline.pipeline.config import load_pipeline, run_pipeline
    from fuelline.pipeline.workdir import StepOutputMismatch
    from fuelline.report.funnel import format_funnel, load_funnel

    source = shared_file("chat/gsm8k-train.jsonl.zst")
    with echo_servers((), ("--fault", "http500", "--fault-every", "5")) as urls:
        pipeline = tmp_path / "chat.toml"
        pipeline.write_text('[[step]]\nuse = "chat-prepare"\ntest_size = 0.98\n\n'
                            f'[[step]]\nuse = "regenerate"\nmodel = "echo"\nservers = {orjson.dumps(urls).decode()}\n'
                            'preset = "qwen3"\nconcurrency = 8\n')
        first = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(source)], progress=False)
        again = run_pipeline(load_pipeline(pipeline), tmp_path / "run", input=[str(source)], progress=False)
    prepared, regenerated = first
    assert regenerated["records_in"] == prepared["outputs"]["train"] == regenerated["records_out"]
    assert again[1]["resumed"] is True and again[1]["original_wall_seconds"] == regenerated["wall_seconds"]
    same = {k: v for k, v in again[1].items() if k not in ("resumed", "original_wall_seconds", "wall_seconds")}
    assert same == {k: v for k, v in regenerated.items() if k != "wall_seconds"}  # finished: skipped, not redone
    records = list(read_records(tmp_path / "run" / "02-regenerate"))
    assert len(records) == regenerated["records_out"]
    assert_regenerated(tmp_path / "run" / "02-regenerate" / "regenerated.jsonl", records)
    funnel = load_funnel(tmp_path / "run")
    assert [s["name"] for s in funnel["steps"]] == ["chat-prepare", "regenerate"]
    assert funnel["steps"][1]["adds_up"] and "regenerate" in format_funnel(funnel)
    other = tmp_path / "other.toml"  # other sampling: refused (the servers are gone; nothing is asked of them)
    other.write_text(pipeline.read_text().replace('preset = "qwen3"', 'preset = "qwen3"\nmax_tokens = 64'))
    with pytest.raises(StepOutputMismatch, match="different config.max_tokens; pass --restart"):
        run_pipeline(load_pipeline(other), tmp_path / "run", input=[str(source)], progress=False)
    (tmp_path / "run" / "02-regenerate" / "stats.json").unlink()  # as if stopped before its end
    with pytest.raises(StepOutputMismatch, match="different config.max_tokens; pass --restart"):
        run_pipeline(load_pipeline(other), tmp_path / "run", input=[str(source)], progress=False)


def test_reasoning_returned_separately_never_enters_the_answer(conversations, tmp_path):
    path, records = conversations
    with echo_servers(("--reasoning",),) as urls:
        regenerate([path], tmp_path / "out.jsonl", urls, RegenerateConfig("echo", client=FAST_CLIENT), progress=False)
    assert b"REASONING" not in (tmp_path / "out.jsonl").read_bytes()
    assert_regenerated(tmp_path / "out.jsonl", records)
