"""`fuelline serve` as a process of its own, with real `transformers serve` servers of the tiny
Qwen3 on 127.0.0.1: served until SIGINT (also when started with SIGINT ignored), servers gone with
a SIGKILLed launcher. One server each (a group of two is test_launcher.py's). The command line's
refusals run in this process (click's runner): they stop before any server starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fuelline.cli import main as fuelline_main
from fuelline.serve.launcher import read_servers_file
from fuelline.serve.processes import group_members

from .test_launcher import alive, answers, check_chat_answer, free_ports, wait_for


def fuelline(*args, env: dict[str, str] | None = None):
    """`fuelline ARGS` run in this process (click's runner): its exit code and output, stderr apart."""
    return CliRunner().invoke(fuelline_main, list(args), env=env)


def launch(*args, **kwargs) -> subprocess.Popen:
    """`fuelline serve ARGS` in the background, its output in files (a pipe could fill and block it)."""
    return subprocess.Popen([sys.executable, "-m", "fuelline.cli", "serve", *args], **kwargs)


def stop_launcher(launcher: subprocess.Popen, timeout: float = 60) -> int:
    """Ctrl-C for a `fuelline serve` launcher; SIGKILL when it has not stopped in time (its servers
    then get their parent-death signal), so that a failing test leaves nothing running."""
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()
    return launcher.returncode


def ignoring_sigint() -> None:
    """For preexec_fn: start a process as a shell starts `cmd &` from a script, with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# -- served until stopped -------------------------------------------------------------------------


def test_cli_serves_until_sigint_even_when_started_with_sigint_ignored(tiny_qwen3_dir, tmp_path):
    """`fuelline serve … &` in a script inherits SIGINT ignored; Ctrl-C (kill -INT) must still stop it."""
    ports, log_dir = free_ports(1), tmp_path / "logs"
    servers_file = tmp_path / "servers.json"
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        launcher = launch("--engine", "transformers", "--model", str(tiny_qwen3_dir), "--ports", str(ports[0]),
                          "--log-dir", str(log_dir), "--servers-file", str(servers_file), "--", "--dtype", "float32",
                          stdout=out, stderr=err, preexec_fn=ignoring_sigint)
    try:
        wait_for(lambda: servers_file.exists() or launcher.poll() is not None, 120, "the servers file")
        assert launcher.poll() is None, (tmp_path / "err").read_text()
        model, urls = read_servers_file(servers_file)
        assert model == str(tiny_qwen3_dir) and urls == [f"http://127.0.0.1:{p}" for p in ports]
        for url in urls:
            check_chat_answer(url, model)
        pids = [s["pid"] for s in json.loads(servers_file.read_text())["servers"]]
        assert all(alive(pid) for pid in pids)
        assert stop_launcher(launcher) == 0
    finally:
        stop_launcher(launcher)
    output = (tmp_path / "out").read_text() + (tmp_path / "err").read_text()
    assert "1 transformers server(s) of" in output and "stopped; logs kept in" in output
    assert "Traceback" not in output
    assert not any(alive(pid) for pid in pids)
    assert not servers_file.exists()
    assert sorted(p.name for p in log_dir.iterdir()) == [f"server-{p}.log" for p in sorted(ports)]
    log = (log_dir / f"server-{ports[0]}.log").read_text()
    assert "Application startup complete" in log
    assert f"--port {ports[0]} --device cpu --dtype float32\n" in log  # the engine arguments after --, at the end


def test_servers_die_with_a_sigkilled_launcher(tiny_qwen3_dir, tmp_path):
    servers_file = tmp_path / "servers.json"
    launcher = launch("--engine", "transformers", "--model", str(tiny_qwen3_dir), "--ports", str(free_ports(1)[0]),
                      "--log-dir", str(tmp_path / "logs"), "--servers-file", str(servers_file),
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: servers_file.exists() or launcher.poll() is not None, 120, "the servers file")
        (server,) = json.loads(servers_file.read_text())["servers"]
        assert alive(server["pid"])
    finally:
        launcher.kill()  # SIGKILL: no chance to stop anything itself
        launcher.wait()
    try:
        wait_for(lambda: not alive(server["pid"]) and not group_members(server["pid"]), 10,
                 "the parent-death signal to stop the server")
        assert not answers(server["url"])
    finally:  # a failure must not leave the orphaned server running
        if alive(server["pid"]):
            os.killpg(server["pid"], signal.SIGKILL)


# -- refused before anything starts ----------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_missing_engine_is_refused_with_its_install_hint(engine, tmp_path):
    if importlib.util.find_spec(engine) is not None:
        pytest.skip(f"{engine} is installed here")
    result = fuelline("serve", "--engine", engine, "--model", "/m", "--ports", str(free_ports(1)[0]),
                      "--log-dir", str(tmp_path / "logs"))
    assert result.exit_code == 2
    assert f"error: {engine} is not installed; pip install {engine}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "logs").exists()  # refused before anything started


@pytest.mark.parametrize("ports, message", [
    ("30010-30000", "the first port is above the last"), ("3o000", "'3o000' is not a port or a range"),
    ("1-70000", "port 65536 is out of range"),
])
def test_cli_refuses_bad_ports(ports, message, tmp_path):
    result = fuelline("serve", "--engine", "transformers", "--model", str(tmp_path), "--ports", ports)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_cli_refuses_a_port_in_use_and_too_many_gpus(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = fuelline("serve", "--engine", "transformers", "--model", str(tmp_path), "--ports", str(port),
                          "--log-dir", str(tmp_path / "logs"))
    assert result.exit_code == 2 and f"127.0.0.1:{port}: the port is in use" in result.stderr
    result = fuelline("serve", "--engine", "transformers", "--model", str(tmp_path), "--ports", "30000-30002",
                      env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert result.exit_code == 2 and "need 3 GPUs, but this machine has 2 (0, 1)" in result.stderr


def test_cli_names_a_model_path_that_does_not_exist(tmp_path):
    missing = tmp_path / "no-such-model"
    result = fuelline("serve", "--engine", "transformers", "--model", str(missing), "--ports", str(free_ports(1)[0]),
                      "--log-dir", str(tmp_path / "logs"))
    assert result.exit_code == 2 and f"error: {missing}: no such model directory\n" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "logs").exists()


def test_cli_refuses_a_model_that_is_neither_a_directory_nor_a_hub_model_at_once(tmp_path, monkeypatch):
    """`serve --model nosuch-dir` waited out its 600 s start-up timeout while `transformers serve`
    retried the Hub, then printed ~20 lines; refused now in one line before any server starts,
    by the resolution cache build uses (the Hub seen offline here, so nothing is fetched)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    result = fuelline("serve", "--engine", "transformers", "--model", "nosuch-dir", "--ports", str(free_ports(1)[0]),
                      "--log-dir", str(tmp_path / "logs"), "--startup-timeout", "600")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: nosuch-dir: no such model directory, and not found as a Hub id")
    assert not (tmp_path / "logs").exists()


def test_a_pipeline_whose_regenerate_step_serves_a_missing_model_is_refused_when_loaded(tmp_path, monkeypatch):
    """Before any step runs (chat-prepare first would run for nothing): at load, naming the step."""
    import huggingface_hub.constants

    from fuelline.pipeline.config import load_pipeline

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    pipeline = tmp_path / "p.toml"
    pipeline.write_text('[[step]]\nuse = "chat-prepare"\n\n[[step]]\nuse = "regenerate"\n'
                        f'serve_model = "{tmp_path / "no-model"}"\n')
    with pytest.raises(FileNotFoundError, match=r"p.toml \[\[step\]\] #2 \(regenerate\): .*no-model: no such model"):
        load_pipeline(pipeline)
    result = fuelline("run", str(pipeline), "--run-dir", str(tmp_path / "run"), "-i", str(pipeline))
    assert result.exit_code == 2 and "no such model directory" in result.stderr
    assert not (tmp_path / "run").exists()
