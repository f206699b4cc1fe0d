"""`fuelline serve` and ServerGroup with real `transformers serve` processes on 127.0.0.1.

A `transformers serve` of the tiny Qwen3 takes about 6-8 s to answer on 2 CPU cores (importing
torch and transformers, most of it), so the tests that only look at a running group share one
module-scoped group of two servers. `fuelline serve` as a process of its own (stopped by SIGINT,
SIGKILLed) is test_serve_command.py: a file apart, so that a second test worker can take it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fuelline.serve import engines
from fuelline.serve.launcher import ServerGroup, ServerStartError, read_servers_file
from fuelline.serve.processes import group_members

# -- helpers ----------------------------------------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """n ports nothing listens on now (held open together, so they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def get_json(url: str, timeout: float = 10.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, json.load(response)


def post_chat(url: str, body: dict, timeout: float = 60.0) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def answers(url: str) -> bool:
    try:
        return get_json(f"{url}/v1/models", timeout=3)[0] == 200
    except OSError:
        return False


def alive(pid: int) -> bool:
    """Whether pid is a running (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def wait_for(condition, timeout: float, what: str, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def check_chat_answer(url: str, model: str) -> dict:
    status, answer = post_chat(url, {"model": model, "max_tokens": 8, "temperature": 0,
                                     "messages": [{"role": "user", "content": "Name a colour."}]})
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["message"]["content"]
    assert choice["finish_reason"] in ("length", "stop")
    usage = answer["usage"]
    assert 0 < usage["completion_tokens"] <= 8 and usage["prompt_tokens"] > 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    return answer


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tiny_qwen3_dir):
    return tiny_qwen3_dir


@pytest.fixture(scope="module")
def group(tiny_model, tmp_path_factory):
    """Two servers of the tiny model, watched by the monitor thread every second."""
    log_dir = tmp_path_factory.mktemp("serve") / "logs"
    with ServerGroup("transformers", str(tiny_model), free_ports(2), log_dir=log_dir) as started:
        started.start_monitor(interval=1.0)
        yield started


# -- command lines, ports, GPUs: pure functions -------------------------------------------------------


def test_command_lines_of_the_three_engines():
    assert engines.server_command("sglang", "/m", "127.0.0.1", 30000) == [
        "python", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "127.0.0.1", "--port", "30000"]
    assert engines.server_command("sglang", "/m", "0.0.0.0", 30001, num_gpus=4, extra_args=["--mem-fraction-static", "0.8"]) == [
        "python", "-m", "sglang.launch_server", "--model-path", "/m", "--host", "0.0.0.0", "--port", "30001",
        "--tp", "4", "--mem-fraction-static", "0.8"]
    assert engines.server_command("vllm", "Qwen/Qwen3-8B", "127.0.0.1", 8000, num_gpus=1) == [
        "vllm", "serve", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "8000"]
    assert engines.server_command("vllm", "/m", "::1", 8000, num_gpus=2, extra_args=("--max-model-len", "4096")) == [
        "vllm", "serve", "/m", "--host", "::1", "--port", "8000", "--tensor-parallel-size", "2",
        "--max-model-len", "4096"]
    assert engines.server_command("transformers", "/m", "127.0.0.1", 9000) == [
        "transformers", "serve", "/m", "--host", "127.0.0.1", "--port", "9000", "--device", "cpu"]
    assert engines.server_command("transformers", "/m", "127.0.0.1", 9000, num_gpus=1, extra_args=["--dtype", "bfloat16"]) == [
        "transformers", "serve", "/m", "--host", "127.0.0.1", "--port", "9000", "--dtype", "bfloat16"]
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        engines.server_command("tgi", "/m", "127.0.0.1", 9000)


def test_programs_resolve_to_this_environment():
    assert engines.resolve_program(["python", "-m", "x"])[0] == sys.executable
    transformers = Path(engines.resolve_program(["transformers", "serve"])[0])
    assert transformers.is_absolute() and transformers.parent == Path(sys.executable).parent


@pytest.mark.parametrize("spec, ports", [
    ("30000-30003", [30000, 30001, 30002, 30003]), ("30000,30005", [30000, 30005]), ("8000", [8000]),
    ("30000-30001, 30010", [30000, 30001, 30010]), ([9000, 9001], [9000, 9001]),
])
def test_port_specs(spec, ports):
    assert engines.parse_ports(spec) == ports


@pytest.mark.parametrize("spec, message", [
    ("30010-30000", "the first port is above the last"), ("abc", "'abc' is not a port or a range"),
    ("30000-", "is not a port or a range"), ("70000", "port 70000 is out of range"),
    ("30000,30000", "ports given more than once: 30000"), ("", "is not a port or a range"),
])
def test_bad_port_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        engines.parse_ports(spec)


def test_gpus_come_from_cuda_visible_devices_and_are_split_consecutively():
    assert engines.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3, 5"}) == ["2", "3", "5"]
    assert engines.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert engines.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,-1,1"}) == ["0"]  # CUDA stops at -1
    assert engines.assign_gpus(2, 2, ["4", "5", "6", "7"]) == [["4", "5"], ["6", "7"]]
    assert engines.assign_gpus(3, 1, ["0", "1", "2", "3"]) == [["0"], ["1"], ["2"]]
    assert engines.assign_gpus(2, 1, []) == [[], []]  # no GPU: CPU servers
    assert engines.assign_gpus(2, 0, ["0", "1"]) == [[], []]  # asked for CPU servers
    with pytest.raises(ValueError, match="need 6 GPUs, but this machine has 4"):
        engines.assign_gpus(3, 2, ["0", "1", "2", "3"])
    with pytest.raises(ValueError, match="has none"):
        engines.assign_gpus(1, 2, [])


def test_servers_on_gpus_see_only_their_own(tmp_path):
    group = ServerGroup("sglang", "/m", "30000-30001", gpus_per_server=2, gpus=["0", "1", "2", "3"], log_dir=tmp_path)
    assert [s.gpus for s in group.servers] == [["0", "1"], ["2", "3"]]
    assert group.servers[1].argv[-2:] == ["--tp", "2"]
    assert group.urls == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]


# -- a running group -----------------------------------------------------------------------------------


def test_group_servers_answer_models_and_chat(group, tiny_model):
    assert len(group.urls) == 2 and len(set(group.urls)) == 2
    assert group.model == str(tiny_model)  # transformers serve lists the forced model as given
    for url in group.urls:
        status, listing = get_json(f"{url}/v1/models")
        assert status == 200 and [m["id"] for m in listing["data"]] == [group.model]
        check_chat_answer(url, group.model)
    assert all(answers(url) for url in group.urls)


def test_transformers_serve_refuses_other_names_and_top_k(group):
    """What a client must know: the forced model's name only, and no top_k/min_p fields."""
    messages = [{"role": "user", "content": "Hi"}]
    status, answer = post_chat(group.urls[0], {"model": "tiny-qwen3", "messages": messages, "max_tokens": 2})
    assert status == 400 and "pinned" in answer["detail"]
    status, answer = post_chat(group.urls[0], {"model": group.model, "messages": messages, "max_tokens": 2,
                                               "top_k": 5, "min_p": 0.1})
    assert status == 422 and "top_k" in answer["detail"] and "min_p" in answer["detail"]
    status, answer = post_chat(group.urls[0], {"messages": messages, "max_tokens": 2})  # no model: the forced one
    assert status == 200 and answer["model"] == group.model


def test_servers_file_lists_the_running_servers(group):
    model, urls = read_servers_file(group.servers_file)
    assert (model, urls) == (group.model, group.urls)
    content = json.loads(group.servers_file.read_text())
    assert content["format"] == "fuelline.servers" and content["version"] == 1
    assert content["engine"] == "transformers" and content["host"] == "127.0.0.1"
    assert content["started"].endswith("+00:00")
    assert [s["pid"] for s in content["servers"]] == [p.pid for p in group.processes]
    assert [s["port"] for s in content["servers"]] == group.ports
    assert all(s["gpus"] == [] for s in content["servers"])  # no GPU here: CPU servers


def test_each_server_logs_to_its_own_file(group):
    for server in group.servers:
        assert server.log == group.log_dir / f"server-{server.port}.log"
        text = server.log.read_text()
        assert f"start 1 of the server on port {server.port}" in text
        assert f"Uvicorn running on http://127.0.0.1:{server.port}" in text
        assert f"--port {server.port}" in text and "--device cpu" in text


def test_a_killed_server_is_restarted_on_its_port(group):
    old_pid = group.processes[1].pid
    os.kill(old_pid, signal.SIGKILL)  # server 1's process only, as a crash would
    wait_for(lambda: group.servers[1].state == "healthy" and group.processes[1].pid != old_pid, 90,
             "the monitor to restart server 1")
    assert not alive(old_pid)
    check_chat_answer(group.urls[1], group.model)
    file_pids = [s["pid"] for s in json.loads(group.servers_file.read_text())["servers"]]
    assert file_pids == [p.pid for p in group.processes] and old_pid not in file_pids
    assert any(f"server {group.ports[1]}: process exited with signal SIGKILL" in e for e in group.events)
    assert group.servers[1].log.read_text().count("of the server on port") == 2  # appended, not replaced
    # The monitor thread's end must not take the server it restarted along (parent-death signal).
    group.stop_monitor()
    time.sleep(1.0)
    assert alive(group.processes[1].pid) and answers(group.urls[1])
    group.start_monitor(interval=1.0)


def test_stopping_the_group_stops_only_its_own_processes(group, tmp_path):
    """Run last in this module: it stops the shared group (the fixture's stop is then a no-op)."""
    bystander = subprocess.Popen(["sleep", "300"])
    (other_port,) = free_ports(1)
    other_server = subprocess.Popen([sys.executable, "-m", "http.server", str(other_port), "--bind", "127.0.0.1",
                                     "--directory", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: _http_ok(f"http://127.0.0.1:{other_port}/"), 20, "the bystander HTTP server")
        ours = [p.pid for p in group.processes]
        ours += [pid for leader in list(ours) for pid in group_members(leader)]  # and anything they started
        assert all(alive(pid) for pid in ours)
        group.stop()
        assert not any(alive(pid) for pid in ours)
        assert all(p.returncode is not None for p in group.processes)
        assert not any(answers(url) for url in group.urls)
        assert bystander.poll() is None and alive(bystander.pid)
        assert other_server.poll() is None and _http_ok(f"http://127.0.0.1:{other_port}/")
        assert not group.servers_file.exists()  # its own servers file goes, the logs stay
        assert all(s.log.exists() for s in group.servers)
    finally:
        for process in (bystander, other_server):
            process.kill()
            process.wait()


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status == 200
    except OSError:
        return False


def check_failed_start(group: ServerGroup, model: Path, server_says: str) -> None:
    """The start fails naming the server, its exit and its log's last lines, and leaves nothing behind."""
    started = time.monotonic()
    with pytest.raises(ServerStartError) as failure:
        group.start()
    message = str(failure.value)
    assert f"server of {model} on port" in message and "exited with exit code 1 while starting" in message
    assert "last lines of" in message and server_says in message.split("last lines of", 1)[1]  # from the log
    assert time.monotonic() - started < 60
    assert all(p is not None and p.returncode is not None for p in group.processes)  # both stopped and reaped
    assert not any(group_members(p.pid) for p in group.processes)
    assert not group.servers_file.exists()


def test_a_server_that_exits_while_starting_fails_the_start_with_its_log(tmp_path):
    """Servers whose interpreter cannot start (PYTHONHOME pointing nowhere, as in a broken install)
    exit at once; `transformers serve` failing on an empty model directory is the slow test below."""
    not_a_model = tmp_path / "empty-model-dir"
    not_a_model.mkdir()
    group = ServerGroup("transformers", str(not_a_model), free_ports(2), log_dir=tmp_path / "logs",
                        env={"PYTHONHOME": str(tmp_path / "no-python-here")})
    check_failed_start(group, not_a_model, "No module named 'encodings'")


@pytest.mark.slow
def test_transformers_serve_of_an_empty_model_dir_fails_the_start_with_its_log(tmp_path):
    not_a_model = tmp_path / "empty-model-dir"
    not_a_model.mkdir()
    group = ServerGroup("transformers", str(not_a_model), free_ports(2), log_dir=tmp_path / "logs")
    check_failed_start(group, not_a_model, str(not_a_model))


def test_servers_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no servers file here"):
        read_servers_file(tmp_path / "servers.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        read_servers_file(bad)
    bad.write_text(json.dumps({"format": "fuelline.tokens", "version": 1}))
    with pytest.raises(ValueError, match="format 'fuelline.tokens', expected 'fuelline.servers'"):
        read_servers_file(bad)
    bad.write_text(json.dumps({"format": "fuelline.servers", "version": 2, "model": "m", "servers": []}))
    with pytest.raises(ValueError, match="version 2"):
        read_servers_file(bad)
    bad.write_text(json.dumps({"format": "fuelline.servers", "version": 1, "model": "m", "servers": []}))
    with pytest.raises(ValueError, match="lists no servers"):
        read_servers_file(bad)


# -- the test models ------------------------------------------------------------------------------------------


def test_tiny_qwen3_renders_qwen3_chat_with_and_without_thinking(tiny_model):
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    config = AutoConfig.from_pretrained(tiny_model)
    assert config.vocab_size == len(tokenizer) and config.num_hidden_layers == 2 and config.hidden_size == 64
    assert tokenizer.eos_token == "<|im_end|>" and config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    render = tokenizer.apply_chat_template
    assert render(chat, tokenize=False, add_generation_prompt=True) == prompt
    assert render(chat, tokenize=False, add_generation_prompt=True, enable_thinking=True) == prompt
    assert render(chat, tokenize=False, add_generation_prompt=True, enable_thinking=False) == (
        prompt + "<think>\n\n</think>\n\n")
    history = chat + [{"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello"},
                      {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye!"}]
    assert render(history, tokenize=False) == (  # earlier thinking dropped; the last answer gets its block
        prompt + "Hello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nBye!<|im_end|>\n")


@pytest.mark.slow
def test_smollm2_served_answers_paris(smollm2_dir, tmp_path_factory):
    """The real SmolLM2-135M-Instruct, rebuilt from its GGUF file and served on CPU."""
    with ServerGroup("transformers", str(smollm2_dir), free_ports(1), log_dir=tmp_path_factory.mktemp("smol-logs")) as group:
        status, answer = post_chat(group.urls[0], {
            "model": group.model, "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert status == 200 and "Paris" in answer["choices"][0]["message"]["content"]
    assert answer["choices"][0]["finish_reason"] == "stop"
