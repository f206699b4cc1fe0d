"""`fuelline cache`: build, stream, estimate, verify, info, validate, compare, export, vocab-map."""

from __future__ import annotations

from pathlib import Path

import click

from fuelline.cache.export_specforge import SpecForgeExportConfig
from fuelline.cache.export_speculators import SpeculatorsExportConfig
from fuelline.cache.plan import CacheConfig
from fuelline.cache.stream import StreamConfig
from fuelline.cache.vocab_map import VocabMapConfig
from fuelline.pipeline.stats import dropped_text
from fuelline.cli_options import (at_least, config_params, given, old_progress_option, quiet_option, restart_option,
                                   workers_option)

ESTIMATE_KEYS = {"layers", "chat_template", "max_length", "min_loss_tokens", "format", "hidden_dtype",
                 "partition_samples", "window"}


@click.group()
def cache() -> None:
    """The target cache: a target model's hidden states for draft training."""


@cache.command(params=[
    click.Option(["--input", "-i", "inputs"], multiple=True, required=True, help="chat records (files, dirs, globs)"),
    click.Option(["--output", "-o"], required=True, type=click.Path(file_okay=False), help="the cache directory"),
    *config_params(CacheConfig), restart_option("delete what the output directory holds and build again"),
    quiet_option(), old_progress_option()])
def build(inputs, output, restart, quiet, **values):
    """Run the target over the conversations once and store its hidden states (resumable; torchrun for ranks)."""
    from fuelline.cache.ranks import Ranks
    from fuelline.cache.step import CacheStep
    from fuelline.pipeline.config import build_dataclass
    from fuelline.pipeline.stats import require_kept
    from fuelline.pipeline.workers import RunOptions

    step = CacheStep(build_dataclass(CacheConfig, given(values), "fuelline cache build"))
    step.ranks = ranks = Ranks.from_env()  # torchrun's RANK, WORLD_SIZE, LOCAL_RANK: read here, once
    stats = step.run(list(inputs), output, RunOptions(restart=restart, progress=not quiet), {})
    if ranks.rank != 0:  # under torchrun, rank 0 reports
        return
    click.echo(summary(stats, output))
    require_kept(stats)  # an empty cache trains nothing


@cache.command(params=[
    click.Option(["--input", "-i", "inputs"], multiple=True, required=True, help="chat records (files, dirs, globs)"),
    click.Option(["--output", "-o"], required=True, type=click.Path(file_okay=False), help="the stream directory"),
    *config_params(StreamConfig), restart_option("delete what the stream directory holds and stream again"),
    quiet_option(), old_progress_option()])
def stream(inputs, output, restart, quiet, **values):
    """Build the cache partition by partition into a bounded window on disk while trainers read it
    (StreamingCacheDataset); deletes what every consumer acknowledged (resumable; torchrun for ranks)."""
    from fuelline.cache.ranks import Ranks
    from fuelline.cache.stream import stream_cache
    from fuelline.pipeline.config import build_dataclass
    from fuelline.pipeline.stats import require_kept

    config = build_dataclass(StreamConfig, given(values), "fuelline cache stream")
    ranks = Ranks.from_env()
    stats = stream_cache(config.model, list(inputs), output, config, progress=not quiet, ranks=ranks, restart=restart)
    if ranks.rank != 0:
        return
    from fuelline.cache.estimate import human_bytes

    s = stats["stream"]
    dropped = dropped_text(stats["dropped"])
    click.echo(f"stream     in {stats['records_in']:>10,}  out {stats['records_out']:>10,}  dropped: {dropped}"
               f"{'  (already streamed)' if stats.get('resumed') else ''}\n"
               f"           {s['partitions']} partition(s) over {s['epochs']} epoch(s), every one acknowledged and "
               f"deleted; disk at most {human_bytes(s['high_water_bytes'])} against "
               f"{human_bytes(s['bytes_per_epoch'])} offline ({s['high_water_share']:.1%}); waited for consumers "
               f"{s['waited_seconds']:.1f} s of {stats['wall_seconds']:.1f} s")
    require_kept(stats)


def summary(stats: dict, output) -> str:
    """What a build did, in three lines (also printed by the chat demo)."""
    dropped = dropped_text(stats["dropped"])
    from fuelline.io.stage_layout import REJECTS_DIR

    rejects = Path(output) / REJECTS_DIR
    return "\n".join([
        f"cache      in {stats['records_in']:>10,}  out {stats['records_out']:>10,}  dropped: {dropped}"
        f"{'  (already built)' if stats.get('resumed') else ''}"
        f"{f'  (rejected records in {rejects}/)' if stats['dropped'] and rejects.is_dir() else ''}",
        f"           {cache_numbers(stats)}",
        f"           open it with fuelline.cache.CacheDataset({str(output)!r})"])


def cache_numbers(stats: dict) -> str:
    """A build's numbers in one line: tokens, supervised share, bytes, shards, padding, forward time
    (also the cache step's line in `fuelline run`'s summary)."""
    from fuelline.cache.estimate import human_bytes

    c = stats["cache"]
    return (f"{c['tokens']:,} tokens ({c['supervised_share']:.1%} supervised), {human_bytes(c['bytes'])} in "
            f"{c['shards']} shard(s), {c['bytes_per_token']:,.1f} bytes/token, padding {c['padding_share']:.1%}, "
            f"forward {c['forward_seconds']:.1f}s of {stats['wall_seconds']:.1f}s")


@cache.command(params=[
    click.Option(["--model"], type=click.Path(exists=True),
                 help="the target model's directory or config.json (its tokenizer is needed with --input)"),
    click.Option(["--hidden-size"], type=int, callback=at_least(1), help="instead of --model: the target's hidden size"),
    click.Option(["--input", "-i", "inputs"], multiple=True, help="chat records: count their tokens exactly"),
    click.Option(["--tokens"], type=float, callback=at_least(1), help="instead of --input: the number of tokens (e.g. 1.56e9)"),
    click.Option(["--samples"], type=float, default=0, callback=at_least(0), help="with --tokens: the number of conversations"),
    click.Option(["--tokens-per-second"], type=float, callback=at_least(1),
                 help="the target's forward throughput (a build's stats say it): the time a stream partition takes"),
    *config_params(StreamConfig, ESTIMATE_KEYS), quiet_option(shows_progress=False)])
def estimate(model, hidden_size, inputs, tokens, samples, tokens_per_second, **values):
    """Print the bytes a cache will take, for each format and hidden dtype, before any forward pass, and
    what a stream of it (`fuelline cache stream`) holds on disk at most."""
    from fuelline.cache.estimate import estimate_from_counts, estimate_from_inputs, format_streaming, format_table
    from fuelline.cache.plan import model_config
    from fuelline.formats.target_cache import HIDDEN_DTYPES
    from fuelline.pipeline.config import build_dataclass

    config = build_dataclass(StreamConfig, given(values), "fuelline cache estimate")
    if model:
        _, text = model_config(model)
        from fuelline.cache.capture import check_layer_ids

        check_layer_ids(config.layers, text.num_hidden_layers)
        hidden_size = text.hidden_size
    if not hidden_size:
        raise click.UsageError("give --model (a directory or config.json) or --hidden-size")
    if inputs:
        if not model or not Path(model).is_dir():
            raise click.UsageError("--input needs --model as a directory with the tokenizer")
        estimates, counts = estimate_from_inputs(model, list(inputs), config, hidden_size)
        dropped = dropped_text(counts["dropped"])
        click.echo(f"{counts['samples']:,} of {counts['records_in']:,} conversations kept (dropped: {dropped}), "
                   f"{counts['tokens']:,} tokens")
    elif tokens:
        estimates = estimate_from_counts(len(config.layers), hidden_size, int(tokens), int(samples))
        click.echo(f"{int(tokens):,} tokens in {int(samples):,} conversations")
    else:
        raise click.UsageError("give --input (exact) or --tokens [--samples]")
    click.echo(f"{len(config.layers)} layer(s) ({','.join(map(str, config.layers))}) of hidden size {hidden_size:,}")
    chosen = (config.format, HIDDEN_DTYPES[config.hidden_dtype])
    click.echo(format_table(estimates, chosen))
    if inputs:
        tokens, samples = counts["tokens"], counts["samples"]
    if samples:
        click.echo(format_streaming(next(e for e in estimates if (e.format, e.hidden_dtype) == chosen), int(tokens),
                                    int(samples), config, tokens_per_second))


def _report(problems: list[str], ok: str) -> None:
    """Each problem on stderr and exit 1, or the `ok` line."""
    for problem in problems:
        click.echo(f"problem: {problem}", err=True)
    if problems:
        raise click.exceptions.Exit(1)
    click.echo(ok)


@cache.command(params=[quiet_option(shows_progress=False)])
@click.argument("path", type=click.Path(exists=True, file_okay=False))
def verify(path):
    """Check manifest, index, bounds and every record's checksum (of every published partition of a
    stream); exit 1 when anything is wrong, 2 when PATH is no cache."""
    from fuelline.cache.inspect import verify_cache

    _report(verify_cache(path), f"ok: {path}")


@cache.command(params=[quiet_option(shows_progress=False)])
@click.argument("path", type=click.Path(exists=True, file_okay=False))
def info(path):
    """Summarize a cache: format, samples, tokens, bytes, layers, model; a stream: its partitions'
    states and its consumers."""
    from fuelline.cache.inspect import cache_info, format_info, stream_info
    from fuelline.formats.target_stream import STREAM_MANIFEST

    click.echo(stream_info(path) if (Path(path) / STREAM_MANIFEST).exists() else format_info(cache_info(path)))


@cache.command(params=[quiet_option(shows_progress=False)])
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--draft-config", required=True, type=click.Path(exists=True, dir_okay=False),
              help="the draft model's config (JSON or TOML) with target_layer_ids, hidden_size, "
                   "target_model_name_or_path")
@click.option("--target-model", default=None, help="the target model the training run uses (default: the config's)")
def validate(path, draft_config, target_model):
    """Check that the cache fits a draft model's configuration (layers, hidden size, target model)."""
    from fuelline.cache.inspect import validate_for_draft

    _report(validate_for_draft(path, draft_config, target_model=target_model), f"ok: {path} fits {draft_config}")


@cache.command(params=[quiet_option(shows_progress=False)])
@click.argument("first", type=click.Path(exists=True, file_okay=False))
@click.argument("second", type=click.Path(exists=True, file_okay=False))
def compare(first, second):
    """Check that two builds share their plan (samples, ids, masks, layout) and measure how far their
    hidden states are apart; exit 1 when the plans differ."""
    from fuelline.cache.compare import compare_caches, format_comparison

    result = compare_caches(first, second)
    click.echo(format_comparison(result))
    if result["differences"]:
        raise click.exceptions.Exit(1)


EXPORT_CONFIGS = {"specforge": SpecForgeExportConfig, "speculators": SpeculatorsExportConfig}


def _export_params() -> list[click.Option]:
    """The options of every trainer's Config, each once (--limit and --nonfinite are every export's)."""
    params = {}
    for config in EXPORT_CONFIGS.values():
        params.update({p.name: p for p in config_params(config) if p.name not in params})
    return list(params.values())


@cache.command(params=[
    click.Option(["--to"], type=click.Choice(list(EXPORT_CONFIGS)), required=True,
                 help="the trainer's format: specforge (SpecForge's offline hidden-state files) or speculators "
                      "(vLLM speculators' sample files, or its Arrow dataset with --layout arrow)"),
    click.Argument(["cache_dir"], metavar="CACHE"),
    click.Option(["--output", "-o"], required=True, type=click.Path(), help="the export directory"),
    *_export_params(), workers_option(),
    restart_option("delete what the output directory holds and export again"),
    click.Option(["--verify/--no-verify"], default=True, show_default=True,
                 help="on a rerun, check every file's checksum against the export's journal (--no-verify: sizes "
                      "only) and rewrite what is missing, short or changed"),
    quiet_option(), old_progress_option()])
def export(to, cache_dir, output, workers, restart, verify, quiet, **values):
    """Write a cache as a trainer's offline data: SpecForge's rows_*/data_*.ckpt files, or speculators'
    data_*.pt files or Arrow dataset (resumable; a rerun checks every file and repairs what it finds)."""
    from fuelline.pipeline.config import build_dataclass
    from fuelline.pipeline.options import flag_of, option_fields
    from fuelline.pipeline.registry import make_step
    from fuelline.pipeline.workers import RunOptions

    config_cls, chosen = EXPORT_CONFIGS[to], given(values)
    own = {f.name: f for f, _ in option_fields(config_cls)}
    if others := [name for name in chosen if name not in own]:
        flags = ", ".join(flag_of(f) for name in others for f, _ in option_fields(_config_with(name)) if f.name == name)
        raise click.UsageError(f"{flags}: not an option of --to {to} (it takes "
                               f"{', '.join(flag_of(f) for f in own.values())})")
    step = make_step(f"{to}-export", build_dataclass(config_cls, chosen, "fuelline cache export"))
    step.verify = verify
    stats = step.run([cache_dir], output, RunOptions(workers=workers, restart=restart, progress=not quiet), {})
    click.echo(export_summary(stats, output, step.Target(step.config)))


def _config_with(name: str) -> type:
    """The trainer Config that declares option `name`."""
    from fuelline.pipeline.options import option_fields

    return next(c for c in EXPORT_CONFIGS.values() if any(f.name == name for f, _ in option_fields(c)))


def export_summary(stats: dict, output, target) -> str:
    """What an export did, in three lines; `target`: the export's `ExportTarget`."""
    from fuelline.cache.estimate import human_bytes

    e = stats["export"]
    skipped = (f"skipped {stats['dropped']['nonfinite']:,} with NaN/Inf, listed in the manifest" if stats["dropped"]
               else "skipped none")
    run = ("already exported" if stats.get("resumed") else
           f"wrote {e['written_files']:,} files in {e['seconds']:.1f}s: {e['files_per_second']:,.1f} files/s, "
           f"{e['gb_per_second']:.3f} GB/s, {e['workers']} worker(s)")
    ids = f"line i + 1 of {e['record_ids']} is its record id" if e["record_ids"] else "the cache stores no record ids"
    repaired = [f"{_REPAIRS.get(kind, kind)} {_listed(items, target)}"
                for kind, items in (e.get("repaired") or {}).items()]
    if repaired and not stats.get("resumed"):  # found again, the stats are of the run that repaired
        run += "\n           repaired: " + "; ".join(repaired)
    pad = " " * (len(target.trainer) + 2)
    return "\n".join([
        f"{target.trainer}  {e['files']:,} of {stats['records_in']:,} samples exported {target.summary()} ({skipped})",
        f"{pad}{human_bytes(e['bytes'])}{' gzipped' if e.get('compressed') else ''}, "
        f"{'fp8 hidden states widened to bf16' if e['widened_from_fp8'] else 'bf16 hidden states'}; {run}",
        f"{pad}{target.sample_name.format(i='i')} is sample i of the cache ({ids}); "
        f"{output}/fuelline_export.json says which cache"])


_REPAIRS = {"missing": "rewrote missing", "short": "rewrote short", "size": "rewrote longer", "changed": "rewrote changed",
            "unjournaled": "rewrote unjournaled", "strays_removed": "removed strays", "rewritten": "rewrote"}


def _listed(items: list, target) -> str:
    """Samples by their file's name (data_7), file names as they are."""
    return ", ".join(target.sample_name.format(i=i) if isinstance(i, int) else str(i) for i in items)


@cache.command("vocab-map", params=[
    click.Argument(["source"], metavar="CACHE_OR_PACK", type=click.Path(exists=True, file_okay=False)),
    click.Option(["--output", "-o"], required=True, type=click.Path(dir_okay=False),
                 help="the mapping file to write (vocab_mapping.pt; --for speculators: d2t.npy, t2d.npy beside it); "
                      "its counts and stats go beside it"),
    *config_params(VocabMapConfig), workers_option(),
    restart_option("delete the mapping, its counts and stats, and count again"), quiet_option(), old_progress_option()])
def vocab_map(source, output, workers, quiet, restart, **values):
    """SpecForge's draft vocabulary (vocab_mapping.pt: d2t, t2d), or speculators' (--for speculators: d2t.npy,
    t2d.npy), from the supervised tokens of a cache or a `pack --template chat` token dataset, with the share
    of supervised tokens it covers."""
    import os

    from fuelline.cache.vocab_map import build_vocab_mapping, format_summary

    stats = build_vocab_mapping(source, output, **given(values), workers=workers or len(os.sched_getaffinity(0)),
                                progress=not quiet, restart=restart)
    click.echo(format_summary(stats))
