"""Regeneration through real models served by `fuelline serve --engine transformers` on this CPU:
a tiny random Qwen3 (~170 requests over two servers) and the real SmolLM2-135M-Instruct."""

import subprocess
import sys

import orjson
import pytest

from fuelline.io import read_records
from fuelline.serve.launcher import ServerGroup, read_servers_file

from ..conftest import shared_file
from ..serve.test_launcher import free_ports, post_chat, wait_for
from ..serve.test_serve_command import launch, stop_launcher


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    """80 GSM8K exchanges and 30 multi-turn ShareGPT conversations (cut to three exchanges)."""
    records = [{"id": f"gsm8k-{i}", "conversations": [{"role": "user", "content": r["question"]},
                                                      {"role": "assistant", "content": r["answer"]}]}
               for i, r in zip(range(80), read_records(shared_file("chat/gsm8k-train.jsonl.zst")))]
    for i, r in zip(range(30), (r for r in read_records(shared_file("chat/sharegpt_zh_1K.jsonl.zst"))
                                if len(r["conversations"]) >= 4)):
        turns = [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"][:300]}
                 for t in r["conversations"][:6]]
        records.append({"id": f"sharegpt-{i}", "conversations": turns[:len(turns) // 2 * 2]})
    path = tmp_path_factory.mktemp("chats") / "chats.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path, records


@pytest.mark.slow
def test_two_served_tiny_models_regenerate_every_id_once_from_the_regenerated_history(tiny_qwen3_dir, chats,
                                                                                        tmp_path):
    path, records = chats
    servers_file = tmp_path / "servers.json"
    log = tmp_path / "launcher.log"
    with open(log, "w") as out:  # a file, not a pipe: a pipe nobody reads can fill and block the launcher
        launcher = launch("--engine", "transformers", "--model", str(tiny_qwen3_dir), "--ports",
                          ",".join(map(str, free_ports(2))), "--log-dir", str(tmp_path / "logs"),
                          "--servers-file", str(servers_file), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: servers_file.exists() or launcher.poll() is not None, 300, "the servers file")
        assert launcher.poll() is None, log.read_text() + "".join(p.read_text() for p in (tmp_path / "logs").glob("*"))
        model, urls = read_servers_file(servers_file)
        output = tmp_path / "out.jsonl"
        result = subprocess.run([sys.executable, "-m", "fuelline.cli", "chat", "regenerate", "-i", str(path), "-o",
                                 str(output), "--servers-file", str(servers_file), "--temperature", "0",
                                 "--max-tokens", "12", "--preset", "qwen3", "--no-thinking", "--concurrency", "2",
                                 "-q"], capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        out = {r["id"]: r for r in read_records(output)}
        assert sorted(out) == sorted(r["id"] for r in records)
        assert output.read_bytes().count(b"\n") == len(records)  # every id exactly once
        stats = orjson.loads((tmp_path / "out.stats.json").read_bytes())
        assert stats["counters"]["requests"] == sum(t["role"] == "assistant" for r in records for t in r["conversations"])
        assert all(s["requests"] > 40 for s in stats["servers"].values())  # both servers worked (~170 requests)
        assert all(s["left_out"] == ["min_p", "top_k"] for s in stats["servers"].values())  # transformers refuses them
        # Greedy answers are a function of the history: asked again with the regenerated history,
        # the server gives the stored third answer of every multi-turn conversation. Asked whole,
        # not streamed: transformers serve runs its response parser only on whole answers, which
        # strips the leading newlines its stream keeps (the tokens are the same).
        for rid, record in out.items():
            turns = record["conversations"]
            if rid.startswith("sharegpt") and len(turns) >= 6:
                status, answer = post_chat(urls[0], {"model": model, "messages": turns[:5], "max_tokens": 12,
                                                     "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}})
                assert status == 200 and answer["choices"][0]["message"]["content"] == turns[5]["content"].lstrip(), rid
    finally:
        stop_launcher(launcher)


@pytest.mark.slow
def test_the_real_smollm2_regenerates_on_two_servers(smollm2_dir, tmp_path):
    from fuelline.chat.regenerate import RegenerateConfig, regenerate
    from fuelline.serve.client import ClientConfig

    questions = ["What is the capital of France?"] + [f"What is {i} plus {i}?" for i in range(11)]
    path = tmp_path / "chats.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"id": f"q{i}", "conversations": [
        {"role": "user", "content": q}, {"role": "assistant", "content": "(to be regenerated)"}]}) + b"\n"
        for i, q in enumerate(questions)))
    with ServerGroup("transformers", str(smollm2_dir), free_ports(2), log_dir=tmp_path / "logs") as group:
        stats = regenerate([path], tmp_path / "out.jsonl", group.urls,
                           RegenerateConfig(group.model, temperature=0.0, max_tokens=10,
                                            client=ClientConfig(concurrency=1)), progress=False)
    out = {r["id"]: r for r in read_records(tmp_path / "out.jsonl")}
    assert sorted(out) == sorted(f"q{i}" for i in range(len(questions))) and stats["dropped"] == {}
    assert "Paris" in out["q0"]["conversations"][1]["content"]
    # Both servers answer: the first two requests go out together, one to each idle server. How
    # the rest split depends on each server's speed on a busy machine (CI once saw 10 and 2).
    served = [s["requests"] for s in stats["servers"].values()]
    assert len(served) == 2 and min(served) >= 1 and sum(served) >= len(questions), stats["servers"]
