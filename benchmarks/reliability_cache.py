"""Reliability family: target caches with damaged bytes, and (issue 25, family (c)) manifest and
index edits, read by every reader; a reader either returns the original samples or raises
CacheFormatError naming the cache.

Edits: every field of the manifest (and of its shard entries) and of one index record, in a
fuelline (fp8) and a deepspec-v2 cache built by `fuelline cache build`, each changed to
plausible lies: ±1, doubled, zero, another valid value (another dtype, a permuted or shifted
layer list, another record's value, swapped shard files), removed. Readers: `CacheDataset`
(mmap, pread, and without record checksums in the fuelline format), the training path
(LengthGroupedBatchSampler → DataLoader → CacheCollator → CUDAPrefetcher with widen_hidden)
and `fuelline cache verify`. A read is ok when it returns exactly what the unedited cache
returns, metadata included (lengths, layer ids, hidden size, the manifest); verify is ok when it
reports a problem or the edit changed nothing a reader returns.

Called by benchmarks/reliability.py; `scenarios()` is its entry point.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import orjson

from common import SHARED_DATA
from trials import Tally, cli, damage_file, isolated, judged, run


REMOVED = object()  # an edit that deletes the field


def scenarios(work: Path, *, full: bool, seed: int) -> list[Tally]:
    examples = 200 if full else 40
    fuelline = build_target_cache(work)
    deepspec = build_target_cache(work, "deepspec-v2")
    return [fuzz_target_cache(work, fuelline, examples, seed),
            *(edit_target_cache(work, cache, full, seed) for cache in (fuelline, deepspec))]


def fuzz_target_cache(work: Path, cache_dir: Path, examples: int, seed: int) -> Tally:
    """A damaged target cache: `verify_cache` lists a problem, or every sample reads back equal."""
    import numpy as np
    import torch
    from hypothesis import given, settings, strategies as st
    from hypothesis import seed as hypothesis_seed

    from fuelline.cache.dataset import CacheDataset
    from fuelline.cache.inspect import verify_cache
    from fuelline.formats.target_cache import CacheFormatError

    def reader(directory: Path):
        def read() -> dict:
            problems = verify_cache(directory)
            if problems:
                raise CacheFormatError(directory, problems[0])
            dataset = CacheDataset(directory)
            return {f"{k}.{name}": np.array(value) if isinstance(value, str)
                    else value.contiguous().view(torch.uint8).numpy()  # bf16, fp8: compared by their bytes
                    for k in range(len(dataset)) for name, value in dataset[k].items()}
        return read

    original = reader(cache_dir)()
    names = sorted(p.relative_to(cache_dir).as_posix() for p in cache_dir.rglob("*") if p.is_file())
    tally = Tally("fuzz: target cache (manifest, index, shards)")

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None)
    @given(st.sampled_from(["truncate", "flip"]), st.sampled_from(names), st.floats(0, 1), st.integers(1, 255))
    def trial(kind, name, where, value) -> None:
        directory = work / "fuzz-cache"
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(cache_dir, directory)
        damage_file(directory / name, kind, where, value)
        outcome, note = isolated(lambda: judged(reader(directory), original, CacheFormatError, str(directory)))
        tally.add(outcome, f"{kind} {name} {where:.3f}: {note}")

    trial()
    return tally


def cache_inputs(work: Path) -> tuple[Path, Path]:
    """(conversations, model) of the cache families: 40 conversations of the ShareGPT sample and a
    tiny local chat model trained on them, made once under `work`."""
    from fuelline.io import read_records
    from fuelline.models import tiny_chat_model

    chats, model = work / "cache-chats", work / "cache-model"
    if not (work / "cache-in.jsonl").exists():
        code, stderr = run(cli("chat", "prepare", "-i", SHARED_DATA / "chat" / "sharegpt_zh_1K.jsonl.zst",
                               "--train-output", chats, "--eval-output", work / "cache-eval", "-q"))
        if code != 0:
            sys.exit(f"setup failed: {stderr[-2000:]}")
        records = [r for _, r in zip(range(40), read_records(chats))]
        (work / "cache-in.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        tiny_chat_model(model, [t["content"] for r in records for t in r["conversations"]])
    return work / "cache-in.jsonl", model


def build_target_cache(work: Path, fmt: str = "fuelline") -> Path:
    """A small real cache: a tiny local chat model over 40 conversations of the ShareGPT sample;
    fp8 in the fuelline format, bf16 in deepspec-v2 (which has no scaled fp8)."""
    chats, model = cache_inputs(work)
    out = work / ("cache" if fmt == "fuelline" else f"cache-{fmt}")
    code, stderr = run(cli("cache", "build", "--model", model, "-i", chats, "-o", out,
                           "--layers", "0,1", "--max-length", 384, "--min-shards", 2, "--format", fmt,
                           "--hidden-dtype", "fp8" if fmt == "fuelline" else "bf16", "--quiet"))
    if code != 0:
        sys.exit(f"setup failed: {stderr[-2000:]}")
    return out


def edit_target_cache(work: Path, cache_dir: Path, full: bool, seed: int) -> Tally:
    """Family (c): each edit of `edits`, read by every reader of `readers` (one forked child per
    edit, so a crash or hang is that edit's outcome for every reader)."""
    import random

    import click.testing  # noqa: F401 - imported once here, not in every forked child
    import fuelline.cli  # noqa: F401

    manifest = orjson.loads((cache_dir / "manifest.json").read_bytes())
    fmt = "fuelline" if manifest.get("format") == "fuelline.target-cache" else "deepspec-v2"
    modes = readers(fmt)
    original = {name: read(cache_dir) for name, read in modes.items() if name != "cache verify"}
    chosen = edits(cache_dir, manifest)
    if not full:  # the reduced run: three lies of each field, every field still edited
        rng, by_field = random.Random(seed), {}
        for edit in chosen:
            by_field.setdefault(edit[0], []).append(edit)
        chosen = [e for group in by_field.values() for e in rng.sample(group, min(3, len(group)))]
    tally = Tally(f"edits: {fmt} manifest and index fields ({len(chosen)} edits x {len(modes)} readers)")
    directory = work / f"edited-{fmt}"
    for field, label, apply in chosen:
        edited_copy(cache_dir, directory, apply)
        outcome, detail = isolated(lambda: {name: judged_mode(name, read, directory, original)
                                            for name, read in modes.items()})
        results = outcome if isinstance(outcome, dict) else {name: (outcome, detail) for name in modes}
        for name, (result, note) in results.items():
            tally.add(result, f"{field} {label}, {name}: {note}")
    shutil.rmtree(directory, ignore_errors=True)
    return tally


def judged_mode(name: str, read, directory: Path, original: dict) -> tuple[str, str]:
    """One reader's outcome on an edited cache, with a note when it is not ok or a clear error."""
    import traceback

    from fuelline.formats.target_cache import CacheFormatError

    try:
        if name == "cache verify":
            return verify_outcome(directory, original["CacheDataset"]), ""
        return judged(lambda: read(directory), original[name], CacheFormatError, str(directory)), ""
    except Exception:  # noqa: BLE001 - an unexpected exception is the finding
        return "crash", traceback.format_exc()[-600:]


def verify_outcome(directory: Path, original: dict) -> str:
    """`fuelline cache verify`, in process: a problem reported is a clear error; `ok` on an edit
    after which the default reader returns anything else than the original is silent_wrong."""
    from click.testing import CliRunner

    from fuelline.cli import main

    result = CliRunner().invoke(main, ["cache", "verify", str(directory)])
    if result.exit_code == 1 and "problem: " in result.output:
        return "clear_error"
    if result.exit_code != 0:
        raise RuntimeError(f"cache verify exited {result.exit_code}: {result.output[-400:]}") from result.exception
    # verify says ok: right only if the reader returns the original (a reader that refuses what
    # verify passes is a wrong answer from verify too)
    return "ok" if judged(lambda: read_dataset(directory), original, Exception, "") == "ok" else "silent_wrong"


def readers(fmt: str) -> dict:
    modes = {"CacheDataset": read_dataset, "CacheDataset pread": lambda d: read_dataset(d, io="pread"),
             "DataLoader + collator + prefetcher": read_loader, "cache verify": None}
    if fmt == "fuelline":
        modes["CacheDataset unchecked"] = lambda d: read_dataset(d, verify_checksums=False)
    return modes


def _bytes(value):
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):  # bf16, fp8: compared by their bytes, shape kept
        return value.contiguous().view(torch.uint8).numpy().copy()
    if isinstance(value, (list, tuple, str)):
        return np.frombuffer(orjson.dumps(value), np.uint8)
    return np.asarray(value)


def read_dataset(directory: Path, **options) -> dict:
    """Every sample, and what the dataset says about the cache."""
    from fuelline.cache.dataset import CacheDataset

    dataset = CacheDataset(directory, **options)
    out = {"lengths": dataset.lengths.copy(), "layers": _bytes(dataset.target_layer_ids),
           "hidden_size": _bytes(dataset.hidden_size),
           "manifest": _bytes(orjson.dumps(dataset.manifest, option=orjson.OPT_SORT_KEYS).decode())}
    for k in range(len(dataset)):
        out.update({f"{k}.{name}": _bytes(value) for name, value in dataset[k].items()})
    return out


def read_loader(directory: Path) -> dict:
    """The training path of docs/cache.md: length-grouped batches, collated, widened."""
    import torch

    from fuelline.cache.dataset import CacheCollator, CacheDataset, LengthGroupedBatchSampler, widen_hidden
    from fuelline.loader import CUDAPrefetcher

    dataset = CacheDataset(directory)
    sampler = LengthGroupedBatchSampler(dataset.lengths, max_tokens=512, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=CacheCollator())
    return {f"{b}.{key}": _bytes(value) for b, batch in enumerate(CUDAPrefetcher(loader, device="cpu",
                                                                                   transform=widen_hidden))
            for key, value in batch.items()}


def edited_copy(cache_dir: Path, directory: Path, apply) -> None:
    """`directory`: the cache with its small files copied and `apply`-ed, its shards hard links."""
    import os

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    for path in cache_dir.iterdir():
        if path.name.startswith("shard-"):
            os.link(path, directory / path.name)
        elif path.is_file():
            shutil.copy(path, directory / path.name)
    apply(directory)


def edits(cache_dir: Path, manifest: dict) -> list[tuple[str, str, object]]:
    """(field, lie, apply(directory)) for every manifest field, shard entry field and index field."""
    import numpy as np

    from fuelline.formats.target_cache import layout_of

    found = []
    for key, value in manifest.items():
        for label, lie in lies(key, value):
            found.append((f"manifest.{key}", label, _manifest_edit(lambda m, key=key, lie=lie: _set(m, key, lie))))
    for key, value in manifest["shards"][0].items():
        for label, lie in lies(key, value):
            found.append((f"manifest.shards[0].{key}", label,
                          _manifest_edit(lambda m, key=key, lie=lie: _set(m["shards"][0], key, lie))))
    if len(manifest["shards"]) > 1:
        def swap(m):
            a, b = m["shards"][0], m["shards"][1]
            a["file_name"], b["file_name"] = b["file_name"], a["file_name"]
        found.append(("manifest.shards", "first two files swapped", _manifest_edit(swap)))
    dtype = layout_of(manifest).index_dtype()
    index = np.fromfile(cache_dir / "samples.idx", dtype=dtype)
    k = len(index) // 2
    for name in dtype.names:
        value, other = int(index[name][k]), int(index[name][k + 1])
        for label, lie in [("+1", value + 1), ("-1", value - 1), ("doubled", value * 2), ("zero", 0),
                           ("another record's", other)]:
            if lie != value and 0 <= lie < 2 ** (8 * dtype[name].itemsize):
                found.append((f"samples.idx[{k}].{name}", label, _index_edit(dtype, k, name, lie)))
    found.append((f"samples.idx[{k}]", "removed", _index_edit(dtype, k, None, None)))
    return found


def lies(key: str, value) -> list[tuple[str, object]]:
    """Plausible wrong values for one manifest field, and its removal."""
    out = [("removed", REMOVED)]
    if isinstance(value, bool):
        out.append(("negated", not value))
    elif isinstance(value, int):
        out += [("+1", value + 1), ("-1", value - 1), ("doubled", value * 2), ("zero", 0)]
    elif isinstance(value, str):
        others = {"hidden_dtype": ["bfloat16", "float8_e4m3fn", "float8_e5m2"], "token_dtype": ["int64", "uint32"],
                  "mask_dtype": ["bool", "int32"], "scale_dtype": ["float16"], "checksum": ["xxh3_128"],
                  "format": ["deepspec-v2"]}.get(key, [value + "-other", ""])
        out += [(f"= {o!r}", o) for o in others]
    elif value is None:
        out += [("= 'float32'", "float32"), ("zero", 0)]
    elif isinstance(value, list) and value and all(isinstance(x, int) for x in value):
        out += [("reversed", value[::-1]), ("last +1", value[:-1] + [value[-1] + 1]), ("one fewer", value[:-1]),
                ("one more", value + [value[-1] + 1]), ("doubled", [2 * x for x in value]), ("empty", []),
                ("shifted", [x + 1 for x in value])]
    elif isinstance(value, list):
        out += [("one fewer", value[:-1]), ("repeated", value + value), ("empty", [])]
    return [(label, lie) for label, lie in out if lie is REMOVED or lie != value]


def _set(target: dict, key: str, lie) -> None:
    if lie is REMOVED:
        target.pop(key)
    else:
        target[key] = lie


def _manifest_edit(change):
    def apply(directory: Path) -> None:
        manifest = orjson.loads((directory / "manifest.json").read_bytes())
        change(manifest)
        (directory / "manifest.json").write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return apply


def _index_edit(dtype, k: int, name: str | None, lie):
    import numpy as np

    def apply(directory: Path) -> None:
        index = np.fromfile(directory / "samples.idx", dtype=dtype)
        if name is None:
            index = np.delete(index, k)
        else:
            index[name][k] = lie
        index.tofile(directory / "samples.idx")
    return apply
