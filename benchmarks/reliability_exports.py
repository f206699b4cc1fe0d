"""Reliability family (g), issue 36: what is made from a target cache, rerun or read after damage.

- **Export reruns.** A finished `fuelline cache export` of a real cache (built by `fuelline cache
  build` from a tiny local model, reliability_cache.py's), for SpecForge (eagle3 plain, dspark
  gzipped) and speculators (sample files, Arrow layout), then one damage per trial to the export:
  a file deleted, truncated at a random byte or with a byte flipped (every data file drawn from,
  `record_ids.txt`, `fuelline_export.json`, the journal, stats.json, `_plan.json`, and the
  trainer's own small files: `sample_lengths.json`; the Arrow table, dataset_info.json,
  state.json), a data file replaced by another's or by a directory, and strays (SpecForge:
  `data_500.ckpt`, a `.ckpt.gz` beside a `.ckpt`, a file in a `rows_*` folder of no sample, a
  `.ckpt` at the top; speculators' sample files: `data_500.pt`, a `token_freq.pt` at the top and
  a `.pt` one folder down, which its walker reads alike; its Arrow layout: `hs_500.safetensors`
  and a note in `hidden_states/`); and a record of the cache changed after the export (its id,
  its states) with the export's file of it deleted. The same command again: ok when it ends with
  exactly the undamaged export's files (stats.json aside) and says so; a clear error when it
  refuses in one line naming the output or the cache (exit 2, no traceback), as it must for a
  stray (the finished export did not write it, so it is a user's file, never deleted);
  silent_wrong when it exits 0 leaving other files (the files the trainer's walker would read
  included).
- **vocab-map on damage.** `build_vocab_mapping` over a copy of the fuelline cache and of a
  pack output (a synthetic chat token dataset in `train/`) with one file truncated or one byte
  flipped (hypothesis): ok when the mapping and counts equal the undamaged source's, a clear
  error when a FormatError or ValueError names the source and nothing is written, silent_wrong
  when another mapping is written; the cache also with `--for speculators` (d2t.npy, t2d.npy, and
  their bytes). (A deepspec-v2 cache has no checksums: a changed id there is
  not detectable by any reader, CacheDataset included, so it is not fuzzed here.)

Called by benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from trials import Tally, damage_file, isolated, judged

BOOKKEEPING = ("stats.json", "_plan.json")  # the seconds of the run that wrote it; the identity it began with
DRAFT_VOCAB = 64


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    from reliability_cache import build_target_cache

    cache = build_target_cache(work)
    tallies = [export_reruns(work, cache, kind, full, seed) for kind in EXPORTS]
    tallies.append(vocab_map_on_damage(work, cache, "fuelline cache", 200 if full else 40, seed))
    tallies.append(vocab_map_on_damage(work, cache, "fuelline cache", 100 if full else 20, seed, "speculators"))
    tallies.append(vocab_map_on_damage(work, chat_tokens(work / "vm-pack"), "pack output", 200 if full else 40, seed))
    return tallies


# --- export reruns -----------------------------------------------------------------------------

@dataclass
class ExportKind:
    """One export to damage: its command's options, where its data files are, and its own small files."""

    label: str
    options: list[str]  # after `--to`
    data: str  # the glob of its data files under OUT
    small: tuple[str, ...] = ()  # the trainer's files beside, besides every export's

    def sample_file(self, export: Path, sample: int) -> list[Path]:
        return [p for p in export.glob(self.data) if p.name.split(".")[0].rsplit("_", 1)[-1] == str(sample)]


EXPORTS = [
    ExportKind("specforge eagle3", ["specforge"], "rows_*/data_*"),
    ExportKind("specforge --compress --method dspark", ["specforge", "--compress", "--method", "dspark"],
               "rows_*/data_*"),
    ExportKind("speculators sample files", ["speculators"], "data_*.pt", ("sample_lengths.json",)),
    ExportKind("speculators --layout arrow", ["speculators", "--layout", "arrow"], "hidden_states/hs_*",
               ("data-00000-of-00001.arrow", "dataset_info.json", "state.json")),
]


def export_args(cache: Path, output: Path, kind: ExportKind) -> list[str]:
    return ["cache", "export", "--to", *kind.options[:1], str(cache), "-o", str(output), "--quiet", "--workers", "1",
            *kind.options[1:]]


def files(directory: Path) -> dict[str, bytes]:
    """Every file of an export but its bookkeeping (its lock sits beside it)."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name not in BOOKKEEPING}


def export_reruns(work: Path, cache: Path, kind: ExportKind, full: bool, seed: int) -> Tally:
    from click.testing import CliRunner

    from fuelline.cli import main

    reference = work / f"export-ref-{kind.label.replace(' ', '')}"
    shutil.rmtree(reference, ignore_errors=True)
    done = CliRunner().invoke(main, export_args(cache, reference, kind))
    if done.exit_code != 0:
        raise SystemExit(f"setup failed: {done.output[-2000:]}")
    expected = files(reference)
    chosen = damages(reference, kind, random.Random(seed), full)
    tally = Tally(f"export reruns: {kind.label} export (or its cache) damaged, then rerun")
    directory = work / "export-damaged"
    for label, apply in chosen:
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(reference, directory)
        apply(directory)
        result, detail = isolated(lambda: rerun_outcome(cache, directory, kind, expected))
        outcome, note = result if isinstance(result, tuple) else (result, detail)  # a crash or hang of the child
        tally.add(outcome, f"{label}: {note}")
    damaged_cache = work / "export-cache-damaged" / cache.name  # the manifest names the cache by its folder
    for label, apply in cache_damages(cache, kind):  # the cache changed since the export, its index as it was
        for path in (directory, damaged_cache):
            shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(reference, directory)
        shutil.copytree(cache, damaged_cache)
        apply(damaged_cache, directory)
        result, detail = isolated(lambda: rerun_outcome(damaged_cache, directory, kind, expected))
        outcome, note = result if isinstance(result, tuple) else (result, detail)
        tally.add(outcome, f"{label}: {note}")
    for path in (directory, damaged_cache.parent):
        shutil.rmtree(path, ignore_errors=True)
    return tally


def cache_damages(cache: Path, kind: ExportKind) -> list[tuple[str, object]]:
    """(label, apply(cache copy, export copy)): a record of the cache changed after the export, with a
    file of the export to write again: the rerun must not copy the damage into the export."""
    import numpy as np

    from fuelline.formats.target_cache import read_index, read_manifest

    index = np.asarray(read_index(cache, read_manifest(cache)))
    shard = read_manifest(cache)["shards"][int(index["shard_id"][3])]["file_name"]
    start, end = int(index["offset"][3]), int(index["offset"][3] + index["nbytes"][3])

    def poke(at: int, rewrite: bool):
        def apply(copy: Path, export: Path) -> None:
            with open(copy / shard, "r+b") as f:
                f.seek(at)
                byte = f.read(1)
                f.seek(at)
                f.write(bytes([byte[0] ^ 0x20]))
            for name in ("record_ids.txt", "fuelline_export.json"):
                (export / name).unlink()
            for data in kind.sample_file(export, 3) if rewrite else ():
                data.unlink()
        return apply

    return [("cache: sample 3's record id changed since, record_ids.txt deleted", poke(start, False)),
            ("cache: sample 3's record id changed since, its file deleted", poke(start, True)),
            ("cache: sample 3's states changed since, its file deleted", poke((start + end) // 2, True))]


def rerun_outcome(cache: Path, directory: Path, kind: ExportKind, expected: dict[str, bytes]) -> tuple[str, str]:
    from click.testing import CliRunner

    from fuelline.cli import main

    result = CliRunner().invoke(main, export_args(cache, directory, kind))
    if result.exit_code == 0:
        got = files(directory)
        if any(".tmp-" in name for name in got):
            return "leftover", ", ".join(n for n in got if ".tmp-" in n)
        if got != expected:
            differ = sorted(n for n in got.keys() | expected.keys() if got.get(n) != expected.get(n))
            return "silent_wrong", f"exit 0, files differ: {', '.join(differ[:5])}"
        return "ok", ""
    said = result.output
    if result.exit_code == 2 and "Traceback" not in said and (str(directory) in said or str(cache) in said):
        return "clear_error", ""
    return "crash", f"exit {result.exit_code}: {said[-400:]} {result.exception!r}"


def damages(export: Path, kind: ExportKind, rng: random.Random, full: bool) -> list[tuple[str, object]]:
    """(label, apply(directory)) for the damages of the module docstring."""
    data = sorted(p.relative_to(export).as_posix() for p in export.glob(kind.data))
    small = ["record_ids.txt", "fuelline_export.json", "fuelline_export_files.jsonl", "stats.json", "_plan.json",
             *kind.small]
    targets = (data if full else rng.sample(data, 3)) + small
    found = []
    for name in targets:
        found.append((f"{name} deleted", lambda d, n=name: (d / n).unlink()))
        for _ in range(3 if full else 1):
            where, value = rng.random(), rng.randint(1, 255)
            found.append((f"{name} truncated at {where:.3f}",
                          lambda d, n=name, w=where, v=value: damage_file(d / n, "truncate", w, v)))
            found.append((f"{name} byte {where:.3f} ^ {value}",
                          lambda d, n=name, w=where, v=value: damage_file(d / n, "flip", w, v)))
    first, second = data[0], data[1]

    def swapped(d: Path) -> None:
        a, b = (d / first).read_bytes(), (d / second).read_bytes()
        (d / first).write_bytes(b)
        (d / second).write_bytes(a)

    def a_directory(d: Path) -> None:
        (d / first).unlink()
        (d / first).mkdir()

    found += [(f"{first} and {second} swapped", swapped), (f"{first} a directory", a_directory),
              *strays(first, kind),
              ("stats.json and _plan.json deleted", lambda d: [(d / n).unlink() for n in ("stats.json",
                                                                                           "_plan.json")])]
    return found


def strays(first: str, kind: ExportKind) -> list[tuple[str, object]]:
    """(label, apply(directory)): files the trainer would read, or that lie in the export's folders,
    of no sample of the export; `first`: a data file of it, copied."""
    def copy(name: str):
        return lambda d: (d / name).parent.mkdir(parents=True, exist_ok=True) or shutil.copy(d / first, d / name)

    if kind.options[0] == "speculators" and "arrow" in kind.options:
        return [("stray hs_500", copy("hidden_states/hs_500.safetensors")),
                ("stray note in hidden_states/", lambda d: (d / "hidden_states" / "notes.txt").write_text("mine"))]
    if kind.options[0] == "speculators":
        return [("stray data_500.pt", copy("data_500.pt")), ("stray token_freq.pt", copy("token_freq.pt")),
                ("stray sub/data_7.pt one folder down", copy("sub/data_7.pt"))]
    folder = Path(first).parent.as_posix()
    suffix = ".ckpt.gz" if first.endswith(".gz") else ".ckpt"
    twin = first[: -len(suffix)] + (".ckpt" if suffix == ".ckpt.gz" else ".ckpt.gz")
    return [("stray data_500", lambda d: (d / folder / f"data_500{suffix}").write_bytes(b"stray")),
            (f"stray twin {twin}", lambda d: shutil.copy(d / first, d / twin)),
            ("stray rows_2000-4000/data_2001", copy(f"rows_2000-4000/data_2001{suffix}")),
            ("stray top-level .ckpt", copy("extra.ckpt"))]


# --- vocab-map on damaged sources ----------------------------------------------------------------

def chat_tokens(pack: Path) -> Path:
    """A pack output whose train/ split is a chat token dataset: 300 documents of ids below 5,000
    with prompt tokens masked out, as `pack --template chat` writes one."""
    import numpy as np

    from fuelline.formats.tokens import TokenDatasetWriter

    if (pack / "train" / "manifest.json").exists():
        return pack
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, 300)
    ids = (rng.zipf(1.3, int(lengths.sum())) % 5000).astype(np.int64)
    mask = rng.random(int(lengths.sum())) < 0.6
    writer = TokenDatasetWriter(pack / "train", dtype="uint16", vocab_size=5000, bos_id=None, eos_id=None,
                                tokenizer={}, with_mask=True)
    writer.add_documents(ids, lengths, mask)
    writer.close()
    return pack


def vocab_map_on_damage(work: Path, source: Path, label: str, examples: int, seed: int,
                        trainer: str = "specforge") -> Tally:
    from hypothesis import given, settings, strategies as st
    from hypothesis import seed as hypothesis_seed

    from fuelline.formats.errors import FormatError

    target_vocab = 5000 if label == "pack output" else model_vocab(work)
    original = mapping(source, work / f"vm-reference-{label.replace(' ', '-')}-{trainer}", target_vocab, trainer)
    names = sorted(p.relative_to(source).as_posix() for p in source.rglob("*")
                   if p.is_file() and not p.name.startswith(".") and p.name != "stats.json")
    tally = Tally(f"vocab-map{' --for speculators' * (trainer == 'speculators')}: damaged {label} ({examples} cases)")

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None)
    @given(st.sampled_from(["truncate", "flip"]), st.sampled_from(names), st.floats(0, 1), st.integers(1, 255))
    def trial(kind, name, where, value) -> None:
        directory, out = work / "vm-damaged", work / "vm-out"
        for path in (directory, out):
            shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(source, directory)
        damage_file(directory / name, kind, where, value)

        def outcome() -> str:
            result = judged(lambda: mapping(directory, out, target_vocab, trainer), original, (FormatError, ValueError),
                            str(directory))
            if result == "clear_error" and out.exists() and any(not p.name.startswith(".") for p in out.iterdir()):
                return "leftover"  # refused, yet a mapping was written (a hidden plan marker is no mapping)
            return result

        result, note = isolated(outcome)
        tally.add(result, f"{kind} {name} {where:.3f}: {note}")

    trial()
    return tally


def model_vocab(work: Path) -> int:
    """The tiny target model's config vocab_size."""
    import orjson

    from fuelline.cache.inspect import find_key

    return find_key(orjson.loads((work / "cache-model" / "config.json").read_bytes()), "vocab_size")[1]


def mapping(source: Path, out: Path, target_vocab: int, trainer: str = "specforge") -> dict:
    """The mapping and counts vocab-map writes for `source`, as arrays (speculators': with the bytes of both files)."""
    import numpy as np
    import torch

    from fuelline.cache.vocab_map import build_vocab_mapping, companion_paths

    if trainer == "speculators":
        path = out / "d2t.npy"
        build_vocab_mapping(source, path, draft_vocab_size=DRAFT_VOCAB, target_vocab_size=target_vocab,
                            trainer=trainer)
        t2d = companion_paths(path, trainer)["t2d"]
        return {"d2t": np.load(path), "t2d": np.load(t2d), "counts": np.load(companion_paths(path)["counts"]),
                "bytes": np.frombuffer(path.read_bytes() + t2d.read_bytes(), np.uint8)}
    path = out / "vocab_mapping.pt"
    build_vocab_mapping(source, path, draft_vocab_size=DRAFT_VOCAB, target_vocab_size=target_vocab)
    saved = torch.load(path)
    return {"d2t": saved["d2t"].numpy(), "t2d": saved["t2d"].numpy(),
            "counts": np.load(companion_paths(path)["counts"]), "bytes": np.frombuffer(path.read_bytes(), np.uint8)}


if __name__ == "__main__":  # this family alone: python benchmarks/reliability_exports.py [--reduced]
    import sys
    import tempfile

    from trials import table

    work = Path(tempfile.mkdtemp(prefix="fuelline-reliability-exports-"))
    os.environ["FUELLINE_CACHE_DIR"] = str(work / "fuelline-cache")
    try:
        rows = [t.row() for t in scenarios(work, full="--reduced" not in sys.argv, seed=0)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    for row in rows:
        for note in row["notes"]:
            print(f"{row['scenario']}: {note}")
