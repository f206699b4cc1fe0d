"""`fuelline cache export --to specforge`: deterministic atomic files, resume after SIGKILL to the
same bytes, refusal of other options, --limit, NaN handling, the manifest and record ids, and the
command's one-line errors. What the files hold is tests/cache/test_specforge.py's."""

import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from fuelline.cache.export_specforge import SpecForgeExportConfig, export_specforge
from fuelline.cache.export_speculators import SpeculatorsExportConfig
from fuelline.cache.export_files import read_journal
from fuelline.cli import main
from fuelline.formats.target_cache import DEEPSPEC_V2, FP8, CacheFormatError, read_index, read_manifest, shard_name
from fuelline.pipeline.config import load_pipeline, run_pipeline
from fuelline.pipeline.options import option_fields
from fuelline.pipeline.workdir import StepOutputMismatch

from . import specforge_reader
from .synthetic import write_cache
from .test_specforge import nan_bytes, poke

ROOT = Path(__file__).resolve().parents[2]


def tree(directory: Path, *, without=("stats.json",)) -> dict[str, bytes]:
    """Every file under `directory` (hidden ones included) by relative path: its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name not in without}


def data_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("rows_*/data_*"))


def test_files_are_the_same_bytes_on_every_run_and_gzip_holds_the_plain_files_bytes(tmp_path):
    write_cache(tmp_path / "cache", hidden_dtype=FP8, num_samples=9)
    config = SpecForgeExportConfig(method="dspark")
    one = export_specforge(tmp_path / "cache", tmp_path / "a", config, workers=1, progress=False)
    two = export_specforge(tmp_path / "cache", tmp_path / "b", config, workers=2, progress=False)
    assert tree(tmp_path / "a") == tree(tmp_path / "b") and len(data_files(tmp_path / "a")) == 9
    assert one["identity"] == two["identity"] and one["export"]["bytes"] == two["export"]["bytes"]
    export_specforge(tmp_path / "cache", tmp_path / "gz", SpecForgeExportConfig(method="dspark", compress=True), workers=2,
                     progress=False)
    for plain in data_files(tmp_path / "a"):
        packed = tmp_path / "gz" / plain.relative_to(tmp_path / "a").with_name(plain.name + ".gz")
        assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
        assert packed.read_bytes()[4:8] == b"\0\0\0\0" and not packed.read_bytes()[3] & 0x08  # mtime 0, no name


def test_the_manifest_record_ids_and_stats_say_what_was_exported_from_which_cache(tmp_path):
    written = write_cache(tmp_path / "cache", hidden_dtype=FP8, num_samples=7, layer_ids=(1, 4, 6))
    stats = export_specforge(tmp_path / "cache", tmp_path / "out", SpecForgeExportConfig(limit=5), progress=False)
    out = tmp_path / "out"
    manifest = orjson.loads((out / "fuelline_export.json").read_bytes())
    assert manifest["method"] == "eagle3" and manifest["samples"] == manifest["exported"] == 5
    assert manifest["skipped"] == [] and manifest["compressed"] is False
    assert manifest["cache"] | {"manifest_digest": None} == {
        "name": "cache", "format": "fuelline", "target_model_name_or_path": "org/target-model",
        "target_layer_ids": [1, 4, 6], "hidden_size": 8, "num_samples": 7, "hidden_dtype": "float8_e4m3fn",
        "widened_from_fp8": True, "exported_dtype": "bfloat16", "manifest_digest": None}
    assert (out / "record_ids.txt").read_text(encoding="utf-8").splitlines() == [s["record_id"] for s in written[:5]]
    assert [p.name for p in data_files(out)] == [f"data_{i}.ckpt" for i in (0, 1, 2, 3, 4)]
    e = stats["export"]
    assert stats["records_in"] == stats["records_out"] == e["files"] == e["written_files"] == 5
    assert e["bytes"] == sum(p.stat().st_size for p in data_files(out)) and e["files_per_second"] > 0
    assert orjson.loads((out / "stats.json").read_bytes())["export"] == e
    again = export_specforge(tmp_path / "cache", out, SpecForgeExportConfig(limit=5), progress=False)
    assert again["resumed"] and again["export"] == e
    whole = export_specforge(tmp_path / "cache", tmp_path / "all", SpecForgeExportConfig(limit=70), progress=False)
    assert whole["records_out"] == 7


def test_a_deepspec_v2_cache_has_no_record_ids_and_the_manifest_says_so(tmp_path):
    write_cache(tmp_path / "cache", fmt=DEEPSPEC_V2, num_samples=4)
    stats = export_specforge(tmp_path / "cache", tmp_path / "out", SpecForgeExportConfig(method="dflash"), progress=False)
    manifest = orjson.loads((tmp_path / "out" / "fuelline_export.json").read_bytes())
    assert not (tmp_path / "out" / "record_ids.txt").exists() and stats["export"]["record_ids"] is None
    assert manifest["record_ids"] is None and manifest["record_ids_note"] == "a deepspec-v2 cache stores no record ids"
    assert manifest["cache"]["widened_from_fp8"] is False and len(data_files(tmp_path / "out")) == 4


def test_other_options_or_another_cache_are_refused_naming_what_differs_and_restart_redoes(tmp_path):
    write_cache(tmp_path / "cache", num_samples=5)
    out = tmp_path / "out"
    export_specforge(tmp_path / "cache", out, SpecForgeExportConfig(), progress=False)
    for config, named in ((SpecForgeExportConfig(method="dspark"), "config.method"), (SpecForgeExportConfig(compress=True), "config.compress"),
                          (SpecForgeExportConfig(limit=2), "config.limit"), (SpecForgeExportConfig(nonfinite="skip"), "config.nonfinite")):
        with pytest.raises(StepOutputMismatch, match=rf"different {named}; pass --restart"):
            export_specforge(tmp_path / "cache", out, config, progress=False)
    write_cache(tmp_path / "cache", num_samples=5, seed=3)  # rebuilt with other states: other record checksums
    with pytest.raises(StepOutputMismatch, match=r"different cache\.index_digest"):
        export_specforge(tmp_path / "cache", out, SpecForgeExportConfig(), progress=False)
    redone = export_specforge(tmp_path / "cache", out, SpecForgeExportConfig(method="dflash", compress=True), restart=True,
                              progress=False)
    assert "resumed" not in redone and [p.name for p in data_files(out)] == [f"data_{i}.ckpt.gz" for i in range(5)]
    stranger = tmp_path / "mine"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("not an export")
    with pytest.raises(StepOutputMismatch, match="is not a fuelline stage output"):
        export_specforge(tmp_path / "cache", stranger, SpecForgeExportConfig(), progress=False)


def test_a_nan_stops_the_export_naming_the_sample_or_is_skipped_and_listed(tmp_path):
    written = write_cache(tmp_path / "cache", num_samples=6)
    poke(tmp_path / "cache", 2, "target_hidden_states", 2, nan_bytes("bfloat16"), reseal=True)
    with pytest.raises(CacheFormatError, match=r"sample 2 \(record id 'source/2·é'\): aux_hidden_state holds 1 NaN") as e:
        export_specforge(tmp_path / "cache", tmp_path / "out", SpecForgeExportConfig(), workers=1, progress=False)
    assert any("--nonfinite skip" in note for note in e.value.__notes__)
    assert not (tmp_path / "out" / "stats.json").exists()
    skip = SpecForgeExportConfig(method="dflash", nonfinite="skip")
    stats = export_specforge(tmp_path / "cache", tmp_path / "out", skip, restart=True, progress=False)
    assert stats["dropped"] == {"nonfinite": 1} and stats["records_out"] == 5
    assert stats["drop_examples"]["nonfinite"] == "sample 2: hidden_states holds 1 NaN or Inf value(s)"
    manifest = orjson.loads((tmp_path / "out" / "fuelline_export.json").read_bytes())
    assert manifest["skipped"] == [{"sample": 2, "record_id": written[2]["record_id"],
                                    "reason": "hidden_states holds 1 NaN or Inf value(s)"}]
    assert sorted(specforge_reader.find_files(tmp_path / "out")) == sorted(
        str(tmp_path / "out" / "rows_0-2000" / f"data_{i}.ckpt") for i in (0, 1, 3, 4, 5))
    again = export_specforge(tmp_path / "cache", tmp_path / "out", skip, progress=False)
    assert again["resumed"] and again["dropped"] == {"nonfinite": 1}


def test_a_damaged_record_stops_the_export_naming_the_sample(tmp_path):
    write_cache(tmp_path / "cache", num_samples=6)
    poke(tmp_path / "cache", 4, "target_hidden_states", 0, b"\x12\x34", reseal=False)
    with pytest.raises(CacheFormatError, match="sample 4: checksum mismatch") as e:
        export_specforge(tmp_path / "cache", tmp_path / "out", SpecForgeExportConfig(), workers=1, progress=False)
    assert "the same command resumes" in e.value.__notes__[-1]
    assert not (tmp_path / "out" / "rows_0-2000" / "data_4.ckpt").exists()


def test_an_export_killed_with_sigkill_resumes_to_the_files_of_an_uninterrupted_one(tmp_path):
    cache, killed = tmp_path / "cache", tmp_path / "killed"
    write_cache(cache, num_samples=400, num_shards=4, hidden_size=64, max_len=128)
    config = SpecForgeExportConfig(method="dspark", compress=True, compression_level=1)
    export_specforge(cache, tmp_path / "whole", config, workers=2, progress=False)
    command = [sys.executable, "-m", "fuelline", "cache", "export", "--to", "specforge", str(cache), "-o", str(killed),
               "--compress", "--compression-level", "1", "--method", "dspark", "--workers", "2", "--quiet"]
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # killed once 10 of the 400 files are there: hundreds to spare on a machine that stalls the test
        deadline = time.monotonic() + 60
        while len(data_files(killed)) < 10 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.002)
    finally:
        process.send_signal(signal.SIGKILL)
        returned = process.wait()
    assert returned == -signal.SIGKILL  # killed mid-way, not finished
    assert 10 <= len(data_files(killed)) < 400 and not (killed / "stats.json").exists()
    kept = len(read_journal(killed)[0])  # files renamed into place but not yet journaled are written again
    stats = export_specforge(cache, killed, config, workers=2, progress=False)
    assert tree(killed) == tree(tmp_path / "whole")  # the same files, byte for byte; no temp file left
    assert len(data_files(killed)) == 400 and kept > 0 and stats["export"]["written_files"] == 400 - kept


def test_the_command_end_to_end_and_its_one_line_errors(tmp_path):
    write_cache(tmp_path / "cache", hidden_dtype=FP8, num_samples=5)
    runner = CliRunner()
    args = ["cache", "export", "--to", "specforge", str(tmp_path / "cache"), "--quiet"]
    result = runner.invoke(main, [*args, "-o", str(tmp_path / "out"), "--method", "dspark", "--limit", "3"])
    assert result.exit_code == 0, result.output
    assert "3 of 3 samples exported for dspark (skipped none)" in result.output
    assert "fp8 hidden states widened to bf16" in result.output and "record_ids.txt" in result.output
    assert len(data_files(tmp_path / "out")) == 3
    again = runner.invoke(main, [*args, "-o", str(tmp_path / "out"), "--method", "dspark", "--limit", "3"])
    assert again.exit_code == 0 and "already exported" in again.output
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    for given, says in (
            (["-o", str(tmp_path / "out")], "different config.limit, config.method; pass --restart"),
            (["-o", str(tmp_path / "file")], "is a file; the export needs a directory"),
            (["-o", str(tmp_path / "o2"), "--limit", "0"], "--limit must be at least 1, found 0"),
            (["-o", str(tmp_path / "o3"), "--compress", "--compression-level", "10"],
             "--compression-level must be between 1 and 9, found 10"),
            (["-o", str(tmp_path / "o4"), "--workers", "0"], "workers must be at least 1")):
        result = runner.invoke(main, [*args, *given])
        assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output, result.output
    result = runner.invoke(main, ["cache", "export", "--to", "specforge", str(tmp_path / "empty"), "-o",
                                  str(tmp_path / "o5")])
    assert result.exit_code == 2 and "manifest.json: missing: not a target cache" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "o5").exists()
    result = runner.invoke(main, ["cache", "export", "--to", "specforge", str(tmp_path / "file"), "-o",
                                  str(tmp_path / "o6")])
    assert result.exit_code == 2 and f"{tmp_path / 'file'}: a file, not a cache directory" in result.output


def test_the_command_and_a_pipeline_step_take_the_same_options(tmp_path):
    command = main.commands["cache"].commands["export"]
    runs = {"to", "cache_dir", "output", "workers", "restart", "verify", "quiet"}
    shown = {p.name for p in command.params if not getattr(p, "hidden", False)}  # hidden: an old spelling refused
    assert shown - runs == {f.name for config in (SpecForgeExportConfig, SpeculatorsExportConfig)
                            for f, _ in option_fields(config)}
    write_cache(tmp_path / "cache", num_samples=4)
    pipeline = tmp_path / "p.toml"
    pipeline.write_text(f'[[step]]\nuse = "specforge-export"\ninput = "{tmp_path / "cache"}"\nmethod = "dflash"\n'
                        'compress = true\n')
    (stats,) = run_pipeline(load_pipeline(pipeline), tmp_path / "run", progress=False)
    assert stats["stage"] == "specforge-export" and stats["records_out"] == 4
    assert len(specforge_reader.find_files(tmp_path / "run" / "01-specforge-export")) == 4


def test_a_rerun_checks_every_file_and_repairs_what_is_missing_short_or_changed(tmp_path):
    """Issue 36 class 5: each kind of damage to a finished export, then the same command: it says what
    it repaired and ends with the files of an undamaged export."""
    write_cache(tmp_path / "cache", num_samples=7)
    out, rows = tmp_path / "out", tmp_path / "out" / "rows_0-2000"
    export_specforge(tmp_path / "cache", out, SpecForgeExportConfig(), workers=1, progress=False)
    whole = tree(out)
    (rows / "data_1.ckpt").unlink()
    (rows / "data_2.ckpt").write_bytes((rows / "data_2.ckpt").read_bytes()[:-5])
    changed = bytearray((rows / "data_3.ckpt").read_bytes())
    changed[200] ^= 1
    (rows / "data_3.ckpt").write_bytes(bytes(changed))  # same size: only its checksum tells
    (rows / "data_4.ckpt").write_bytes((rows / "data_4.ckpt").read_bytes() + b"x")
    (out / "record_ids.txt").unlink()
    (out / "fuelline_export.json").write_bytes((out / "fuelline_export.json").read_bytes()[:40])
    record = read_index(tmp_path / "cache", read_manifest(tmp_path / "cache"))[6]  # its record opens with its id
    with open(tmp_path / "cache" / shard_name(int(record["shard_id"])), "r+b") as f:
        f.seek(int(record["offset"]))  # the cache damaged since: sample 6's id, its file not to be rewritten
        f.write(b"#")
    args = ["cache", "export", "--to", "specforge", str(tmp_path / "cache"), "-o", str(out), "--quiet",
            "--workers", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert ("repaired: rewrote missing data_1; rewrote short data_2; rewrote longer data_4; rewrote changed data_3; "
            "rewrote fuelline_export.json, record_ids.txt (missing)") in result.output
    assert tree(out) == whole and len(specforge_reader.find_files(out)) == 7
    stats = orjson.loads((out / "stats.json").read_bytes())
    assert stats["export"]["written_files"] == 4 and stats["export"]["repaired"]["missing"] == [1]
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and "already exported" in again.output and "repaired" not in again.output
    (rows / "data_0.ckpt").unlink()
    (rows / "data_0.ckpt").mkdir()  # not the export's to delete
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and f"{rows / 'data_0.ckpt'}: not a regular file where the export's file of " \
        "sample 0 goes" in refused.output and (rows / "data_0.ckpt").is_dir()


def test_a_rerun_refuses_a_users_file_the_walker_would_read_and_removes_only_its_own_strays(tmp_path):
    """A rerun deleted every file under OUT that SpecForge's walker would read and no sample names, a
    user's my.ckpt with them. Now one the export did not write refuses the run, every byte kept (the
    damage it would repair too); what lies in the rows_* folders of an unfinished export is its own."""
    write_cache(tmp_path / "cache", num_samples=7)
    out, rows = tmp_path / "out", tmp_path / "out" / "rows_0-2000"
    export_specforge(tmp_path / "cache", out, SpecForgeExportConfig(), workers=1, progress=False)
    whole = tree(out)
    (rows / "data_1.ckpt").unlink()
    (out / "my.ckpt").write_bytes(b"mine")
    (rows / "data_500.ckpt").write_bytes(b"mine too")  # in its folder, but the export finished without it
    args = ["cache", "export", "--to", "specforge", str(tmp_path / "cache"), "-o", str(out), "--quiet"]
    for mine in (out / "my.ckpt", rows / "data_500.ckpt"):
        before = tree(out, without=())
        refused = CliRunner().invoke(main, args)
        assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
        assert f"{mine}: not written by this export, and specforge would read it as training data" in refused.output
        assert tree(out, without=()) == before
        mine.rename(tmp_path / mine.name)
    (rows / "data_500.ckpt").write_bytes(b"left by the unfinished export")
    (out / "stats.json").unlink()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0 and "removed strays rows_0-2000/data_500.ckpt" in result.output, result.output
    assert tree(out) == whole and (tmp_path / "my.ckpt").read_bytes() == b"mine"


def test_a_damaged_journal_is_repaired_and_a_partial_export_with_a_torn_line_resumes(tmp_path):
    write_cache(tmp_path / "cache", num_samples=6)
    out = tmp_path / "out"
    export_specforge(tmp_path / "cache", out, SpecForgeExportConfig(method="dflash"), workers=1, progress=False)
    whole, journal = tree(out), out / "fuelline_export_files.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:2]) + lines[2].replace(b'"bytes":', b'"bytes":1') + lines[3][:-9])
    stats = export_specforge(tmp_path / "cache", out, SpecForgeExportConfig(method="dflash"), workers=1, progress=False)
    assert stats["export"]["repaired"] == {"unjournaled": [2, 3, 4, 5], "rewritten": ["fuelline_export_files.jsonl"]}
    assert tree(out) == whole
    (out / "stats.json").unlink()  # unfinished: a kill while the journal was being appended to
    journal.write_bytes(journal.read_bytes()[:-20])
    (out / "fuelline_export.json").unlink()
    stats = export_specforge(tmp_path / "cache", out, SpecForgeExportConfig(method="dflash"), workers=1, progress=False)
    assert tree(out) == whole and stats["export"]["written_files"] == 1 and stats["export"]["repaired"] == {}


def test_an_export_of_no_file_is_refused_with_the_reason(tmp_path):
    """Issue 36 class 10: every sample skipped is an exit 2 naming why, with no finished output."""
    write_cache(tmp_path / "cache", num_samples=2, num_shards=1)
    for sample in (0, 1):
        poke(tmp_path / "cache", sample, "target_hidden_states", 0, nan_bytes("bfloat16"), reseal=True)
    result = CliRunner().invoke(main, ["cache", "export", "--to", "specforge", str(tmp_path / "cache"), "-o",
                                       str(tmp_path / "out"), "--nonfinite", "skip", "--quiet"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "no file exported: all 2 samples were skipped (the first, sample 0: aux_hidden_state holds" in result.output
    assert not (tmp_path / "out" / "stats.json").exists() and not specforge_reader.find_files(tmp_path / "out")
