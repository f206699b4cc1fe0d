"""vLLM speculators' offline reader, restated from its described behaviour for the tests (not our code's
rule, and no code of speculators'): which files it finds, the lengths its sampler is given, how it
opens a sample in either layout, what its dataset makes of it, and what its collator and EAGLE-3's
per-sample shift make of a batch for a given max_len (its --total-seq-len).

Sample files: every file under the root (os.walk, in walk order) whose name ends in "pt", each
`torch.load`ed memory-mapped with weights_only; the lengths from `sample_lengths.json` beside the
first file, keyed by the text after the last "_" of each file's stem (a missing key or a bad file:
lengths guessed from file sizes, scaled by sample 0's). Arrow layout: a `datasets.save_to_disk`
directory in torch format (its rows' input_ids and loss_mask come out as int64 tensors) with
input_ids, loss_mask and seq_len columns; row i's states in hidden_states/hs_{i}.safetensors (by
row number alone, whatever other columns the table has), a row whose token_ids differ from its input_ids dropped (its reader warns and returns None). `datasets` is
not installed here, so `arrow_rows` reads the directory as `load_from_disk` does: state.json's data
files, each an Arrow IPC stream, concatenated.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pyarrow as pa
import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def find_sample_files(root) -> list[str]:
    """Files under `root` whose name ends in "pt", in os.walk's order (directory listing order: not sorted)."""
    found = []
    for folder, _, names in os.walk(root):
        found += [os.path.join(folder, name) for name in names if name.endswith("pt")]
    return found


def sample_lengths(files: list[str]) -> list[int]:
    """Each file's length for the sampler: `sample_lengths.json` beside the first file, else from sizes."""
    table = Path(files[0]).parent / "sample_lengths.json"
    if table.exists():
        try:
            lengths = json.loads(table.read_text())
            return [lengths[Path(name).stem.split("_")[-1]] for name in files]
        except (KeyError, ValueError):
            pass
    first = int(load_sample_file(files[0])["input_ids"].shape[0])
    size = os.path.getsize(files[0])
    return [math.ceil(os.path.getsize(name) / size * first) for name in files]


def load_sample_file(path) -> dict:
    """One sample file, standardized: the captured layers side by side, the list's last element the
    verifier's state."""
    data = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    return {"hidden_states": torch.cat(data["hidden_states"][:-1], dim=-1), "input_ids": data["input_ids"],
            "verifier_last_hidden_states": data["hidden_states"][-1], "loss_mask": data["loss_mask"]}


def arrow_rows(root) -> list[dict]:
    """The rows `load_from_disk(root)` gives in torch format: int64 tensors, seq_len a 0-d tensor."""
    state = json.loads((Path(root) / "state.json").read_text())
    assert state["_format_type"] == "torch", state["_format_type"]  # its reader compares rows with torch.equal
    tables = [pa.ipc.open_stream(pa.memory_map(str(Path(root) / entry["filename"]))).read_all()
              for entry in state["_data_files"]]
    table = pa.concat_tables(tables)
    assert {"input_ids", "loss_mask", "seq_len"} <= set(table.column_names), table.column_names
    return [{key: torch.tensor(row[key], dtype=torch.int64) for key in ("input_ids", "loss_mask", "seq_len")}
            for row in table.to_pylist()]


def arrow_lengths(root) -> list[int]:
    """The sampler's lengths: the seq_len column."""
    return [int(row["seq_len"]) for row in arrow_rows(root)]


def load_arrow_sample(root, index: int, row: dict) -> dict | None:
    """Row `index`'s sample, standardized; None where its file's token_ids differ from the row's ids."""
    loaded = load_file(Path(root) / "hidden_states" / f"hs_{index}.safetensors")
    if not torch.equal(loaded["token_ids"], row["input_ids"]):
        return None
    return {"hidden_states": loaded["hidden_states"][:, :-1].flatten(1), "input_ids": loaded["token_ids"],
            "verifier_last_hidden_states": loaded["hidden_states"][:, -1], "loss_mask": row["loss_mask"]}


def dataset_item(raw: dict, hidden_states_dtype=torch.bfloat16) -> dict:
    """Its dataset's item (no transform): every key naming hidden_states cast to the training dtype,
    `lengths` [T] and `position_ids` 0..T-1 added."""
    item = {key: value.to(hidden_states_dtype) if "hidden_states" in key else value for key, value in raw.items()}
    n = item["input_ids"].shape[0]
    return {**item, "lengths": torch.tensor([n], dtype=torch.long), "position_ids": torch.arange(n, dtype=torch.long)}


def eagle3_shift(item: dict) -> dict:
    """EAGLE-3's per-sample preprocessing: token t+1 and its target state paired with the captured
    layers at t (ids, mask, target and positions drop their first entry, the layers their last)."""
    return {"input_ids": item["input_ids"][1:], "hidden_states": item["hidden_states"][:-1],
            "verifier_last_hidden_states": item["verifier_last_hidden_states"][1:],
            "loss_mask": item["loss_mask"][1:], "lengths": item["lengths"] - 1,
            "position_ids": item["position_ids"][1:]}


def collate(items: list, max_len: int, preprocess=eagle3_shift) -> dict:
    """Its collator: None items dropped, `preprocess` applied to each, every field concatenated along
    the tokens, cut or zero-padded to max_len with a batch dim; the lengths kept while they fit, the
    last kept cut to fill max_len; `document_ids` each position's sample, -1 on padding."""
    items = [preprocess(item) if preprocess else item for item in items if item is not None]
    batch = {}
    for key in items[0]:
        joined = torch.cat([item[key] for item in items], dim=0)
        if key == "lengths":
            batch[key] = joined
            continue
        cut = joined[:max_len]
        batch[key] = F.pad(cut, [0, 0] * (cut.dim() - 1) + [0, max_len - cut.shape[0]]).unsqueeze(0)
    kept, total = [], 0
    for length in batch.pop("lengths").tolist():
        if length + total >= max_len:
            kept.append(max_len - total)
            break
        kept.append(length)
        total += length
    documents = torch.repeat_interleave(torch.arange(len(kept)), torch.tensor(kept, dtype=torch.long))
    batch["document_ids"] = torch.cat([documents, torch.full((max_len - len(documents),), -1)]).unsqueeze(0)
    return batch


def read_sample_files(root, hidden_states_dtype=torch.bfloat16) -> dict[str, dict]:
    """Every sample file under `root`, in its order: path -> its dataset item."""
    return {path: dataset_item(load_sample_file(path), hidden_states_dtype) for path in find_sample_files(root)}


def read_arrow(root, hidden_states_dtype=torch.bfloat16) -> list[dict | None]:
    """Every row of an Arrow layout, in row order: its dataset item, or None for a dropped row (its
    file is hs_{row})."""
    items = []
    for i, row in enumerate(arrow_rows(root)):
        raw = load_arrow_sample(root, i, row)
        items.append(None if raw is None else dataset_item(raw, hidden_states_dtype))
    return items
