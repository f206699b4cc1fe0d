"""`fuelline cache export --to specforge`: a target cache as SpecForge's offline hidden-state files.

Sample i of the cache becomes `OUT/rows_{g}-{g+2000}/data_{i}.ckpt` (`.ckpt.gz` with
`--compress`), g = (i // 2000) * 2000, the layout and dict SpecForge's `prepare_hidden_states.py`
writes (`fuelline.cache.specforge` has the keys per method). The bytes depend on the sample and
the options only: `torch.save` into a file object names its archive `archive` and derives its
serialization id from the content (saved to a *path*, the archive is named after the file, so the
temp name would show), and gzip is written with mtime 0 and no file name. Journal, resume, repair
and threads are the export's (`fuelline.cache.export`).
"""

from __future__ import annotations

import gzip
import io
import os
from dataclasses import dataclass
from pathlib import Path

from fuelline.cache.export import ExportOptions, ExportTarget, TrainerExportStep, export_cache
from fuelline.formats.specforge import METHODS
from fuelline.pipeline.options import option

GROUP = 2000  # files per folder: SpecForge's --file-group-size default
SPECFORGE_FORMAT = "specforge_hidden_states_v1"  # what SpecForge calls the offline files it reads
SUFFIXES = (".ckpt", ".ckpt.gz")  # what SpecForge's offline walker takes from a directory tree


@dataclass
class SpecForgeExportConfig(ExportOptions):
    """The options of `fuelline cache export --to specforge`; all of them decide the files."""

    method: str = option("eagle3", "the SpecForge method the files are for (eagle3: aux_hidden_state and "
                                   "hidden_state; dspark: hidden_states and target_last_hidden_states; "
                                   "dflash: hidden_states)", choices=METHODS)
    compress: bool = option(False, "gzip each file (.ckpt.gz), as SpecForge's --compress")
    compression_level: int = option(6, "gzip level, 1 (fast) to 9 (small), with --compress", min=1, max=9)

    @property
    def extension(self) -> str:
        return ".ckpt.gz" if self.compress else ".ckpt"


def file_path(output: Path, sample: int, extension: str) -> Path:
    """Where SpecForge's preparation puts sample i: rows_{g}-{g+2000}/data_{i}{extension}."""
    group = sample // GROUP * GROUP
    return output / f"rows_{group}-{group + GROUP}" / f"data_{sample}{extension}"


class SpecForgeFiles(ExportTarget):
    """SpecForge's rows_*/data_i.ckpt(.gz) files (see the module docstring)."""

    trainer, export_format = "specforge", "fuelline.specforge-export"
    config: SpecForgeExportConfig

    def file_path(self, output: Path, sample: int) -> Path:
        return file_path(output, sample, self.config.extension)

    def writes(self) -> tuple[str, ...]:
        return ("rows_*",)

    def is_data_file(self, output: Path, path: Path) -> bool:
        """A name SpecForge's walker takes (.ckpt, .ckpt.gz, at any depth), or any file of a rows_* folder."""
        in_rows = path.parent.name.startswith("rows_") and path.parent.parent == output
        return in_rows or path.name.endswith(SUFFIXES)

    def file_bytes(self, item: dict, where: tuple[Path, int]) -> tuple[memoryview, dict]:
        import torch

        from fuelline.cache.specforge import specforge_record

        record = specforge_record(item, self.config.method, where=where)
        buffer = io.BytesIO()
        if self.config.compress:  # mtime 0 and no file name: the same bytes on every run
            with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=self.config.compression_level,
                               mtime=0) as stream:
                torch.save(record, stream)
        else:
            torch.save(record, buffer)
        return buffer.getbuffer(), {}

    def manifest_head(self) -> dict:
        config = self.config
        return {"specforge_format": SPECFORGE_FORMAT, "method": config.method, "compressed": config.compress,
                "compression_level": config.compression_level if config.compress else None}

    def files_note(self) -> str:
        return (f"rows_{{g}}-{{g+{GROUP}}}/data_{{i}}{self.config.extension}: i is the cache's sample index, "
                f"g = i // {GROUP} * {GROUP}")

    def details(self) -> dict:
        return {"method": self.config.method, "compressed": self.config.compress}

    def summary(self) -> str:
        return f"for {self.config.method}"


class SpecForgeExportStep(TrainerExportStep):
    """Export a target cache (the step's one input) as SpecForge's offline hidden-state files."""

    name, Config, Target = "specforge-export", SpecForgeExportConfig, SpecForgeFiles


def export_specforge(cache: str | os.PathLike, output: str | os.PathLike, config: SpecForgeExportConfig,
                     **run) -> dict:
    """`export_cache` for SpecForge; `run`: its workers, progress, restart and verify."""
    return export_cache(cache, output, SpecForgeFiles(config), step=SpecForgeExportStep.name, **run)
