"""`fuelline demo chat`: the distillation pipeline end to end on a CPU, with nothing downloaded.

A small deterministic chat sample (arithmetic, unit conversions and capitals in ShareGPT,
OpenAI and Alpaca shapes, with the dirt real chat data has: empty turns, a conversation that
starts with the assistant, an unknown role, a record of no known schema) and a tiny chat model
(a Qwen3 of 3 layers over a BPE vocabulary trained on the sample) go through the pipeline of
configs/chat.toml: `chat-prepare` → `regenerate` (a `transformers serve` server on 127.0.0.1,
started and stopped by the run) → `cache` (the model's hidden states) → `report`. Needs the
extras `torch` and `serve`; without them it says so.
"""

from __future__ import annotations

import importlib.util
import random
import socket
import tempfile
from pathlib import Path

import orjson

from fuelline.io.atomic import write_bytes_atomic

CONVERSATIONS = 200
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Kenya": "Nairobi", "Peru": "Lima",
            "Norway": "Oslo", "Egypt": "Cairo", "Chile": "Santiago", "Spain": "Madrid", "Canada": "Ottawa"}

DEMO_PIPELINE = """\
# The chat demo: configs/chat.toml on a tiny local model, served on the CPU.
[defaults]
on_error = "skip"

[[step]]
use = "chat-prepare"
test_size = 0.05

[[step]]
use = "regenerate"
input = "@chat-prepare"
serve_model = "{model}"
serve_engine = "transformers"
serve_ports = "{port}"
serve_gpus_per_server = 0
max_tokens = 12
temperature = 0.0
concurrency = 8

[[step]]
use = "cache"
model = "{model}"
layers = [-1, 0, 1]
chat_template = "auto"
max_length = 512
min_loss_tokens = 4
hidden_dtype = "fp8"
batch_tokens = 4096
min_shards = 2
device = "cpu"

[[step]]
use = "report"
"""


def _exchange(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}."
    if kind == 1:
        km = rng.randint(1, 40)
        return f"How many meters are in {km} kilometers?", f"{km} kilometers are {km * 1000} meters."
    country = rng.choice(sorted(CAPITALS))
    return f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}."


def sample_records(count: int = CONVERSATIONS, seed: int = 0) -> list[dict]:
    """`count` chat records in three schemas, about 3% of them broken in ways chat-prepare names."""
    rng = random.Random(seed)
    records = []
    for k in range(count):
        turns = [_exchange(rng) for _ in range(rng.choice((1, 1, 2)))]
        shape = k % 3
        if shape == 0:
            records.append({"id": f"sg-{k}", "conversations": [
                {"from": who, "value": text} for q, a in turns for who, text in (("human", q), ("gpt", a))]})
        elif shape == 1:
            records.append({"id": f"oa-{k}", "messages": [
                {"role": role, "content": text} for q, a in turns for role, text in (("user", q), ("assistant", a))]})
        else:
            records.append({"id": f"al-{k}", "instruction": turns[0][0], "input": "", "output": turns[0][1]})
    broken = [
        {"id": "empty-turn", "conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "Hi."}]},
        {"id": "assistant-first", "messages": [{"role": "assistant", "content": "Hello."},
                                               {"role": "user", "content": "Hi?"}]},
        {"id": "odd-role", "messages": [{"role": "narrator", "content": "Once."}, {"role": "user", "content": "?"}]},
        {"id": "no-schema", "text": "a document, not a conversation"},
    ]
    for k, record in enumerate(broken * max(1, count // 120)):
        records.insert((k * 37) % len(records), {**record, "id": f"{record['id']}-{k}"})
    return records


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _require_extras() -> None:
    if any(importlib.util.find_spec(module) is None for module in ("torch", "transformers", "fastapi", "uvicorn")):
        raise RuntimeError("fuelline demo chat runs a model: install the extras torch and serve "
                           "(pip install 'fuelline[torch,serve]')")


def run_chat_demo(directory: str | None, conversations: int = CONVERSATIONS,
                  progress: bool = True) -> tuple[Path, list[dict]]:
    """Write the sample and the model under `directory` (default: a new temporary one), run the
    pipeline into DIR/run, and return (run directory, the steps' stats)."""
    _require_extras()
    from fuelline.models import tiny_chat_model
    from fuelline.pipeline.config import load_pipeline, run_pipeline

    base = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="fuelline-chat-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    records = sample_records(conversations)
    sample, data = base / "chat-sample.jsonl", b"".join(orjson.dumps(r) + b"\n" for r in records)
    if not sample.exists() or sample.read_bytes() != data:  # rewritten, it would look like a new input
        write_bytes_atomic(sample, data)
    texts = [" ".join(str(v) for turn in r.get("conversations", r.get("messages", [])) for v in turn.values())
             or f"{r.get('instruction', '')} {r.get('output', '')}" for r in records]
    model = tiny_chat_model(base / "model", texts)
    pipeline = base / "chat.toml"
    write_bytes_atomic(pipeline, DEMO_PIPELINE.format(model=model.resolve(), port=_free_port()).encode())
    run_dir = base / "run"
    stats = run_pipeline(load_pipeline(pipeline), run_dir, input=[str(sample)], progress=progress)
    return run_dir, stats
