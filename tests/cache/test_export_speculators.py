"""`fuelline cache export --to speculators`, both layouts: every exported sample read with speculators'
reader rule (tests/cache/speculators_reader.py) equals the arrays the cache was written from (both
cache formats, bf16 and fp8, through its collator's max-length cut), the same bytes on every run,
resume after SIGKILL to the same bytes, damaged records named and never substituted, skipped
samples left out of sample_lengths.json and the Arrow table, other options refused, and reruns that
repair. The machinery both trainers share is tested once, on SpecForge's files, in test_export.py."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import torch
from click.testing import CliRunner

from fuelline.cache.export_specforge import SpecForgeExportConfig, export_specforge
from fuelline.cache.export_speculators import SpeculatorsExportConfig, export_speculators
from fuelline.cli import main
from fuelline.formats.target_cache import BF16, DEEPSPEC_V2, FP8, FUELLINE, CacheFormatError
from fuelline.pipeline.config import load_pipeline, run_pipeline
from fuelline.pipeline.workdir import StepOutputMismatch

from . import speculators_reader as reader
from .synthetic import write_cache
from .test_export import tree
from .test_specforge import nan_bytes, poke
from .test_speculators import assert_same, expected_item

ROOT = Path(__file__).resolve().parents[2]
KINDS = [(FUELLINE, BF16), (FUELLINE, FP8), (DEEPSPEC_V2, BF16)]
LAYOUTS = ("files", "arrow")


@pytest.fixture(scope="module", params=KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def cache(request, tmp_path_factory):
    fmt, dtype = request.param
    path = tmp_path_factory.mktemp(f"{fmt}-{dtype}")
    return path, dtype, write_cache(path, fmt=fmt, hidden_dtype=dtype, num_samples=12, num_shards=3)


def index_of(path: str) -> int:
    return int(re.search(r"data_(\d+)\.pt$", path).group(1))


def read(out: Path, layout: str) -> dict[int, dict | None]:
    """Sample index -> speculators' dataset item, through its reader rule for `layout`."""
    if layout == "files":
        return {index_of(path): item for path, item in reader.read_sample_files(out).items()}
    return dict(enumerate(reader.read_arrow(out)))  # row r is sample r (its reader opens hs_{r})


@pytest.mark.parametrize("layout", LAYOUTS)
def test_speculators_reader_reads_every_exported_sample_as_the_written_arrays(cache, layout, tmp_path):
    path, dtype, written = cache
    out = tmp_path / "out"
    stats = export_speculators(path, out, SpeculatorsExportConfig(layout=layout), workers=2, progress=False)
    items = read(out, layout)
    assert sorted(items) == list(range(len(written))) and stats["export"]["layout"] == layout
    for i, item in items.items():
        assert_same(item, expected_item(written[i], dtype))
    lengths = [len(w["input_ids"]) for w in written]
    if layout == "files":  # the sampler's lengths come from sample_lengths.json (sizes would guess otherwise)
        files = reader.find_sample_files(out)
        assert reader.sample_lengths(files) == [lengths[index_of(f)] for f in files]
        assert json.loads((out / "sample_lengths.json").read_bytes()) == {str(i): n for i, n in enumerate(lengths)}
    else:
        assert reader.arrow_lengths(out) == lengths
    for max_len in (1, 7, 40):  # its collator packs a batch and cuts it at max_len
        batch = [3, 1, 0, 7]
        assert_same(reader.collate([items[i] for i in batch], max_len),
                    reader.collate([expected_item(written[i], dtype) for i in batch], max_len))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_files_are_the_same_bytes_on_every_run_and_the_manifest_says_what_they_are(layout, tmp_path):
    written = write_cache(tmp_path / "cache", hidden_dtype=FP8, num_samples=9)
    config = SpeculatorsExportConfig(layout=layout)
    one = export_speculators(tmp_path / "cache", tmp_path / "a", config, workers=1, progress=False)
    two = export_speculators(tmp_path / "cache", tmp_path / "b", config, workers=2, progress=False)
    assert tree(tmp_path / "a") == tree(tmp_path / "b") and one["identity"] == two["identity"]
    manifest = orjson.loads((tmp_path / "a" / "fuelline_export.json").read_bytes())
    assert manifest["format"] == "fuelline.speculators-export" and manifest["layout"] == layout
    assert manifest["cache"]["widened_from_fp8"] is True and manifest["exported"] == 9
    name = "hidden_states/hs_i.safetensors" if layout == "arrow" else "data_i.pt"
    assert manifest["record_ids_note"] == f"line i + 1 holds the record id of sample i ({name})"
    assert (tmp_path / "a" / "record_ids.txt").read_text(encoding="utf-8").splitlines() == [
        w["record_id"] for w in written]
    e = one["export"]
    assert e["files"] == e["written_files"] == 9 and e["bytes"] == sum(
        (tmp_path / "a" / name.replace("_i", f"_{i}")).stat().st_size for i in range(9))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_nan_sample_is_named_or_skipped_and_left_out_of_the_lengths_and_the_table(layout, tmp_path):
    written = write_cache(tmp_path / "cache", num_samples=6)
    poke(tmp_path / "cache", 2, "target_hidden_states", 2, nan_bytes(BF16), reseal=True)
    with pytest.raises(CacheFormatError, match=r"sample 2 \(record id 'source/2·é'\): hidden_states \(captured "
                                               r"layers\) holds 1 NaN"):
        export_speculators(tmp_path / "cache", tmp_path / "out", SpeculatorsExportConfig(layout=layout), workers=1,
                           progress=False)
    if layout == "arrow":  # its reader takes row r's states from hs_{r}: a row left out would shift the others
        with pytest.raises(ValueError, match="--nonfinite skip cannot go with --layout arrow"):
            SpeculatorsExportConfig(layout=layout, nonfinite="skip")
        return
    config = SpeculatorsExportConfig(layout=layout, nonfinite="skip")
    stats = export_speculators(tmp_path / "cache", tmp_path / "out", config, restart=True, progress=False)
    assert stats["dropped"] == {"nonfinite": 1} and stats["records_out"] == 5
    items = read(tmp_path / "out", layout)
    assert sorted(items) == [0, 1, 3, 4, 5]
    for i, item in items.items():
        assert_same(item, expected_item(written[i], BF16))
    assert sorted(json.loads((tmp_path / "out" / "sample_lengths.json").read_bytes())) == ["0", "1", "3", "4", "5"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_damaged_record_stops_the_export_naming_the_sample_and_has_no_file(layout, tmp_path):
    write_cache(tmp_path / "cache", num_samples=6)
    poke(tmp_path / "cache", 4, "target_hidden_states", 0, b"\x12\x34", reseal=False)
    with pytest.raises(CacheFormatError, match="sample 4: checksum mismatch") as e:
        export_speculators(tmp_path / "cache", tmp_path / "out", SpeculatorsExportConfig(layout=layout), workers=1,
                           progress=False)
    assert "the same command resumes" in e.value.__notes__[-1]
    out = tmp_path / "out"
    assert not (out / "data_4.pt").exists() and not (out / "hidden_states" / "hs_4.safetensors").exists()
    assert not (out / "sample_lengths.json").exists() and not (out / "state.json").exists()


def test_other_options_another_trainer_or_another_cache_are_refused(tmp_path):
    write_cache(tmp_path / "cache", num_samples=4)
    out = tmp_path / "out"
    export_speculators(tmp_path / "cache", out, SpeculatorsExportConfig(), progress=False)
    for config, named in ((SpeculatorsExportConfig(layout="arrow"), "config.layout"),
                          (SpeculatorsExportConfig(limit=2), "config.limit"),
                          (SpeculatorsExportConfig(nonfinite="skip"), "config.nonfinite")):
        with pytest.raises(StepOutputMismatch, match=rf"different {named}; pass --restart"):
            export_speculators(tmp_path / "cache", out, config, progress=False)
    with pytest.raises(StepOutputMismatch, match=r"different (config\.\w+, )*task"):
        export_specforge(tmp_path / "cache", out, SpecForgeExportConfig(), progress=False)
    write_cache(tmp_path / "cache", num_samples=4, seed=3)
    with pytest.raises(StepOutputMismatch, match=r"different cache\.index_digest"):
        export_speculators(tmp_path / "cache", out, SpeculatorsExportConfig(), progress=False)
    redone = export_speculators(tmp_path / "cache", out, SpeculatorsExportConfig(layout="arrow"), restart=True,
                                progress=False)
    assert "resumed" not in redone and not list(out.glob("*.pt")) and len(reader.arrow_rows(out)) == 4


def test_a_rerun_refuses_a_users_file_the_walker_would_read_then_repairs_damaged_files(tmp_path):
    """Its walker takes every name ending in pt at any depth: a rerun deleted a user's notes.pt.
    Now such a file refuses the rerun, every byte kept, until it is moved away."""
    write_cache(tmp_path / "cache", num_samples=5)
    out = tmp_path / "out"
    export_speculators(tmp_path / "cache", out, SpeculatorsExportConfig(), workers=1, progress=False)
    whole = tree(out)
    changed = bytearray((out / "data_3.pt").read_bytes())
    changed[-300] ^= 1
    (out / "data_3.pt").write_bytes(bytes(changed))
    (out / "sample_lengths.json").write_text('{"0": 1}')
    (out / "sub").mkdir()
    (out / "sub" / "data_9.pt").write_bytes(b"at any depth")
    args = ["cache", "export", "--to", "speculators", str(tmp_path / "cache"), "-o", str(out), "--quiet"]
    for mine in (out / "notes.pt", out / "sub" / "data_9.pt"):
        mine.touch()
        before = tree(out, without=())
        refused = CliRunner().invoke(main, args)
        assert refused.exit_code == 2 and f"{mine}: not written by this export" in refused.output, refused.output
        assert tree(out, without=()) == before
        (out / "stats.json").unlink()  # nor is it the export's in an unfinished one: not a name it writes
        refused = CliRunner().invoke(main, args)
        assert refused.exit_code == 2 and f"{mine}: not written by this export" in refused.output, refused.output
        (out / "stats.json").write_bytes(before["stats.json"])
        mine.unlink()
    (out / "sub").rmdir()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "repaired: rewrote changed data_3.pt; rewrote sample_lengths.json" in result.output
    assert tree(out) == whole


def test_a_rerun_of_the_arrow_layout_rewrites_its_table_and_its_files(tmp_path):
    write_cache(tmp_path / "cache", hidden_dtype=FP8, num_samples=5)
    out = tmp_path / "out"
    config = SpeculatorsExportConfig(layout="arrow")
    export_speculators(tmp_path / "cache", out, config, workers=1, progress=False)
    whole = tree(out)
    (out / "hidden_states" / "hs_2.safetensors").unlink()
    (out / "hidden_states" / "hs_70.safetensors").write_bytes(b"not ours")
    (out / "data-00000-of-00001.arrow").write_bytes(b"torn")
    with pytest.raises(ValueError, match="hs_70.safetensors: not written by this export"):  # it finished without it
        export_speculators(tmp_path / "cache", out, config, workers=1, progress=False)
    (out / "stats.json").unlink()  # unfinished: hidden_states/ is its own
    stats = export_speculators(tmp_path / "cache", out, config, workers=1, progress=False)
    assert stats["export"]["repaired"] == {"strays_removed": ["hidden_states/hs_70.safetensors"],
                                           "rewritten": ["data-00000-of-00001.arrow"]}
    assert tree(out) == whole


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_export_killed_with_sigkill_resumes_to_the_files_of_an_uninterrupted_one(layout, tmp_path):
    cache, killed = tmp_path / "cache", tmp_path / "killed"
    write_cache(cache, hidden_dtype=FP8, num_samples=300, num_shards=3, hidden_size=64, max_len=128)
    config = SpeculatorsExportConfig(layout=layout)
    export_speculators(cache, tmp_path / "whole", config, workers=2, progress=False)
    files = (lambda: list((killed / "hidden_states").glob("hs_*"))) if layout == "arrow" else (
        lambda: list(killed.glob("data_*.pt")))
    command = [sys.executable, "-m", "fuelline", "cache", "export", "--to", "speculators", str(cache), "-o",
               str(killed), "--layout", layout, "--workers", "2", "--quiet"]
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # killed once 10 of the 300 files are there
        deadline = time.monotonic() + 60
        while (not killed.exists() or len(files()) < 10) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.002)
    finally:
        process.send_signal(signal.SIGKILL)
        returned = process.wait()
    assert returned == -signal.SIGKILL and 10 <= len(files()) < 300 and not (killed / "stats.json").exists()
    stats = export_speculators(cache, killed, config, workers=2, progress=False)
    assert tree(killed) == tree(tmp_path / "whole") and len(files()) == 300
    assert 0 < stats["export"]["written_files"] < 300


def test_the_command_refuses_another_trainers_options_and_a_pipeline_step_exports(tmp_path):
    write_cache(tmp_path / "cache", num_samples=3)
    runner = CliRunner()
    for to, given, says in (("speculators", ["--method", "dflash"], "--method: not an option of --to speculators"),
                            ("specforge", ["--layout", "arrow"], "--layout: not an option of --to specforge")):
        result = runner.invoke(main, ["cache", "export", "--to", to, str(tmp_path / "cache"), "-o",
                                      str(tmp_path / "o"), *given])
        assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "o").exists()
    result = runner.invoke(main, ["cache", "export", "--to", "speculators", str(tmp_path / "cache"), "-o",
                                  str(tmp_path / "o"), "--layout", "arrow", "--quiet"])
    assert result.exit_code == 0 and "speculators  3 of 3 samples exported as an Arrow dataset" in result.output
    assert "hidden_states/hs_i.safetensors is sample i of the cache" in result.output
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[[step]]\nuse = "speculators-export"\ninput = "{tmp_path / "cache"}"\nlimit = 2\n')
    (stats,) = run_pipeline(load_pipeline(pipeline), tmp_path / "run", progress=False)
    assert stats["stage"] == "speculators-export" and stats["records_out"] == 2
    assert sorted(read(tmp_path / "run" / "01-speculators-export", "files")) == [0, 1]
    assert torch.load(tmp_path / "run" / "01-speculators-export" / "data_1.pt", weights_only=True)["input_ids"].dtype \
        == torch.int64
