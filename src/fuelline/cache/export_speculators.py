"""`fuelline cache export --to speculators`: a target cache as vLLM speculators' offline training data.

Two layouts (what each file holds: `fuelline.cache.speculators`):

- `--layout files` (its `SampleFileDataset`): sample i becomes `OUT/data_{i}.pt`, one `torch.save`
  dict, and `OUT/sample_lengths.json` maps "i" to its length. Its reader walks OUT for every name
  ending in `pt`, at any depth, and looks for sample_lengths.json beside the first file it lists,
  taking each file's index from the digits after the last `_` of its stem (without the json, or
  with a file it does not name, it guesses lengths from file sizes). So every file lies in OUT
  itself, and any other name ending in pt under OUT is a stray: removed when the export wrote it,
  refused when it did not (a user's `token_freq.pt`). Bytes as SpecForge's: torch.save into a file
  object.
- `--layout arrow` (its `ArrowDataset`): OUT is a `datasets.save_to_disk` directory
  (`fuelline.formats.hf_dataset`, written with pyarrow; in torch format, as its preparation saves
  it: its reader takes each row's loss_mask as a tensor) with one row per exported sample,
  `input_ids`, `loss_mask` (int64 lists), `seq_len` and `source_index` (the cache's sample index),
  and `OUT/hidden_states/hs_{i}.safetensors` holds sample i's `token_ids` and `hidden_states`. Its
  reader opens row r's file as `hs_{r}` (plus its split's offset), so row r must be sample r: a
  skipped sample would move every later row onto another file (which its reader then drops with a
  warning, the token ids differing), and `--nonfinite skip` is refused here. safetensors' header is
  sorted, so the bytes depend on the sample only. The table is made at the end, from what the
  export checked: each row's ids are read back from its file's token_ids (a few bytes of each
  file), its loss mask from its journal line (packed bits); in memory it costs 16 bytes a token.

Journal, resume, repair, threads and the refusal of other options are the export's
(`fuelline.cache.export`); sample i's record id is line i + 1 of record_ids.txt in both layouts.
"""

from __future__ import annotations

import base64
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from fuelline.cache.export import ExportOptions, ExportTarget, TrainerExportStep, export_cache
from fuelline.formats.hf_dataset import BATCH_ROWS, DATA_FILE, INFO_FILE, STATE_FILE, dataset_files
from fuelline.pipeline.options import option

LAYOUTS = ("files", "arrow")
SAMPLE_LENGTHS = "sample_lengths.json"
HIDDEN_STATES = "hidden_states"  # the Arrow layout's folder of per-sample files


@dataclass
class SpeculatorsExportConfig(ExportOptions):
    """The options of `fuelline cache export --to speculators`; all of them decide the files."""

    layout: str = option("files", "files: data_{i}.pt and sample_lengths.json (speculators' sample files); "
                                  "arrow: a datasets directory with hidden_states/hs_{i}.safetensors (its Arrow "
                                  "layout)", choices=LAYOUTS)

    def __post_init__(self):
        super().__post_init__()
        if self.layout == "arrow" and self.nonfinite == "skip":
            raise ValueError("--nonfinite skip cannot go with --layout arrow: speculators reads row r's states from "
                             "hidden_states/hs_{r}, so a sample left out would move every later row onto another "
                             "sample's file; use --layout files (each file names its sample) or --nonfinite error")


class SpeculatorsFiles(ExportTarget):
    """speculators' sample files or Arrow layout (see the module docstring)."""

    trainer, export_format = "speculators", "fuelline.speculators-export"
    config: SpeculatorsExportConfig

    def __init__(self, config: SpeculatorsExportConfig):
        super().__init__(config)
        self.arrow = config.layout == "arrow"
        self.sample_name = f"{HIDDEN_STATES}/hs_{{i}}.safetensors" if self.arrow else "data_{i}.pt"

    def file_path(self, output: Path, sample: int) -> Path:
        return output / self.sample_name.format(i=sample)

    def writes(self) -> tuple[str, ...]:
        return HIDDEN_STATES, DATA_FILE, INFO_FILE, STATE_FILE, "data_*.pt", SAMPLE_LENGTHS  # either layout

    def is_data_file(self, output: Path, path: Path) -> bool:
        """Arrow: any file of hidden_states/; files: any name ending in pt, at any depth (its walker's rule)."""
        return path.parent == output / HIDDEN_STATES if self.arrow else path.name.endswith("pt")

    def file_bytes(self, item: dict, where: tuple[Path, int]) -> tuple[memoryview | bytes, dict]:
        import torch

        from fuelline.cache.speculators import speculators_arrow_tensors, speculators_record

        if not self.arrow:
            buffer = io.BytesIO()
            torch.save(speculators_record(item, where=where), buffer)
            return buffer.getbuffer(), {}
        from safetensors.torch import save

        data = save(speculators_arrow_tensors(item, where=where))
        return data, {"loss_mask": _packed_mask(item["loss_mask"].numpy(), where)}

    def small_files(self, output: Path, dataset, entries: dict[int, dict], exported: list[int]) -> dict[str, bytes]:
        if not self.arrow:
            lengths = {str(i): int(dataset.lengths[i]) for i in exported}
            return {SAMPLE_LENGTHS: orjson.dumps(lengths) + b"\n"}
        return dataset_files(_table(output, self, entries, exported), format_type="torch")

    def manifest_head(self) -> dict:
        return {"layout": self.config.layout, "hidden_dtype": "bfloat16"}

    def files_note(self) -> str:
        if self.arrow:
            return (f"{self.sample_name}: i is the cache's sample index, the source_index of its row in the "
                    "datasets table (data-00000-of-00001.arrow)")
        return f"{self.sample_name}: i is the cache's sample index; {SAMPLE_LENGTHS} maps \"i\" to its length"

    def details(self) -> dict:
        return {"layout": self.config.layout}

    def summary(self) -> str:
        return "as an Arrow dataset with safetensors files" if self.arrow else "as sample files"


def _packed_mask(mask: np.ndarray, where: tuple[Path, int]) -> str:
    """A loss mask of 0s and 1s as base64 of its bits (np.packbits, its length is the sample's)."""
    if mask.size and mask.max() > 1:
        raise ValueError(f"{where[0]}: sample {where[1]}: its loss mask holds {int(mask.max())}, not only 0 and 1")
    return base64.b64encode(np.packbits(mask.astype(bool))).decode("ascii")


def _table(output: Path, target: SpeculatorsFiles, entries: dict[int, dict], exported: list[int]):
    """The Arrow layout's rows, one per exported sample in sample order: its ids from its file's
    token_ids, its mask from its journal line (both checked by this run: `export_files.check_files`)."""
    import pyarrow as pa
    from safetensors import safe_open

    ids, masks, lengths = [], [], []
    for i in exported:
        path = target.file_path(output, i)
        with safe_open(path, framework="numpy") as f:
            tokens = f.get_tensor("token_ids")
        mask = np.unpackbits(np.frombuffer(base64.b64decode(entries[i]["loss_mask"]), np.uint8), count=len(tokens))
        ids.append(tokens.astype(np.int64, copy=False))
        masks.append(mask.astype(np.int64))
        lengths.append(len(tokens))
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])

    def column(parts: list[np.ndarray]):
        """A list<int64> column in chunks of BATCH_ROWS rows, whose 32-bit offsets cannot overflow."""
        values = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        chunks = [pa.ListArray.from_arrays(pa.array(offsets[a:b + 1] - offsets[a], pa.int32()),
                                           values[offsets[a]:offsets[b]])
                  for a, b in ((a, min(a + BATCH_ROWS, len(lengths))) for a in range(0, len(lengths), BATCH_ROWS))]
        return pa.chunked_array(chunks, pa.list_(pa.int64()))

    return pa.table({"input_ids": column(ids), "loss_mask": column(masks),
                     "seq_len": pa.array(lengths, pa.int64()), "source_index": pa.array(exported, pa.int64())})


class SpeculatorsExportStep(TrainerExportStep):
    """Export a target cache (the step's one input) as vLLM speculators' offline training data."""

    name, Config, Target = "speculators-export", SpeculatorsExportConfig, SpeculatorsFiles


def export_speculators(cache: str | os.PathLike, output: str | os.PathLike, config: SpeculatorsExportConfig,
                       **run) -> dict:
    """`export_cache` for speculators; `run`: its workers, progress, restart and verify."""
    return export_cache(cache, output, SpeculatorsFiles(config), step=SpeculatorsExportStep.name, **run)
