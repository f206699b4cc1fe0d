"""Where a model the user names lives: a local directory, or a Hub id found as `from_pretrained` finds it.

One resolution for every command that takes a model (`cache build --model`, `fuelline serve
--model`, a pipeline's `model` and `serve_model`), run before anything is started: a typo costs
a second and one line, not an engine's start-up timeout (`transformers serve nosuch-dir`
retries the Hub for minutes, then prints ~20 lines of name-resolution errors). A name that is a
path (absolute, or starting with `.` or `~`) is never looked up on the Hub. A Hub id goes
through the Hugging Face cache (offline with HF_HUB_OFFLINE=1), downloading the files asked
for when it is online and they are not cached yet.
"""

from __future__ import annotations

import os
from pathlib import Path

# What a cache build reads of a Hub model: configs, weights, the tokenizer and its chat template.
MODEL_FILES = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken"]
# Enough to know that a Hub id names a model, for a server that fetches the rest itself.
CONFIG_ONLY = ["config.json"]


def resolve_model(model: str | os.PathLike, files: list[str] = MODEL_FILES) -> tuple[str, Path]:
    """(name, directory) of a model: a local directory as it is, or a Hub id's snapshot holding `files`.

    The name is the directory's absolute path, or the Hub id as given (what a cache's manifest
    records as `target_model_name_or_path`). Raises FileNotFoundError, with one line, when it is
    neither, and ValueError for an empty name or a file."""
    if not os.fspath(model):  # Path("") is the working directory
        raise ValueError("no model: give --model (its directory or a Hub id), or 'model' in a pipeline step")
    name = os.fspath(model)
    path = Path(name).expanduser()
    if path.is_dir():
        return os.fspath(path.resolve()), path
    if path.exists():
        raise ValueError(f"{name}: a file; give the model's directory or a Hub id such as Qwen/Qwen3-4B")
    if path.is_absolute() or name.startswith((".", "~")):
        raise FileNotFoundError(f"{name}: no such model directory")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, HfHubHTTPError
    except ImportError:
        raise FileNotFoundError(f"{name}: no such model directory (huggingface_hub, which finds Hub ids, is not "
                                f"installed: pip install 'fuelline[cache]')") from None
    try:
        directory = snapshot_download(name, allow_patterns=files)
    except HFValidationError:
        raise FileNotFoundError(f"{name}: no such model directory (and not a Hub id such as Qwen/Qwen3-4B)") from None
    except (HfHubHTTPError, OSError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FileNotFoundError(f"{name}: no such model directory, and not found as a Hub id ({first_line})") from None
    return name, Path(directory)
