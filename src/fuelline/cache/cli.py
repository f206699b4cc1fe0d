"""`fuelline cache`: build, estimate, verify, info, validate, compare."""

from __future__ import annotations

from pathlib import Path

import click

from fuelline.formats.target_cache import FORMATS, FUELLINE


def _layers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated layer ids such as 1,9,17, not {text!r}") from None


class _Size(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):
        from fuelline.cache.estimate import parse_size

        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def _config_options(f):
    """The options that decide what is cached, shared by build and estimate."""
    options = [
        click.option("--layers", required=True, help="layer ids to capture, ascending (e.g. 1,9,17,25,33); "
                     "-1 is the embedding output; the final decoder layer is not allowed"),
        click.option("--chat-template", default="auto", show_default=True,
                     help="chatml, qwen, qwen3, llama3, gemma4, FILE.toml[:NAME], or auto (the tokenizer's own)"),
        click.option("--max-length", type=int, default=4096, show_default=True,
                     help="longest conversation in tokens; longer ones are cut at a turn boundary"),
        click.option("--min-loss-tokens", type=int, default=14, show_default=True,
                     help="drop conversations with fewer supervised tokens"),
        click.option("--format", "fmt", type=click.Choice(FORMATS), default=FUELLINE, show_default=True,
                     help="deepspec-v2: DeepSpec's version 2, byte for byte; fuelline: checksums, ids, fp8"),
        click.option("--hidden-dtype", type=click.Choice(["bf16", "fp8"]), default="bf16", show_default=True,
                     help="fp8: e4m3 with a scale per token and layer (fuelline format), half the bytes"),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.group()
def cache() -> None:
    """The target cache: a target model's hidden states for draft training."""


@cache.command()
@click.option("--model", required=True,
              help="the target model: its directory (config, weights, tokenizer), or a Hub id (Qwen/Qwen3-4B) "
                   "found through the Hugging Face cache as from_pretrained finds it (HF_HUB_OFFLINE=1: cache only)")
@click.option("--input", "-i", "inputs", multiple=True, required=True, help="chat records (files, dirs, globs)")
@click.option("--output", "-o", required=True, type=click.Path(file_okay=False), help="the cache directory")
@_config_options
@click.option("--batch-tokens", type=int, default=16384, show_default=True,
              help="padded tokens per forward batch (batch size x longest sequence)")
@click.option("--max-shard-bytes", type=_Size(), default="64GiB", show_default=True, help="largest shard file")
@click.option("--min-shards", type=int, default=8, show_default=True,
              help="at least this many shards, so that several ranks share the work")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="auto: this rank's GPU when there is one, else the cpu; cuda: fail without a GPU")
@click.option("--force", is_flag=True, help="start even when the disk has less free space than the cache needs")
@click.option("--queue-bytes", type=_Size(), default="4GiB", show_default=True,
              help="host memory for batches waiting for the writer thread")
@click.option("--inline-writes", is_flag=True, help="write on the main thread (no overlap; for measurements)")
@click.option("--progress/--no-progress", default=True, show_default=True, help="progress bars")
def build(model, inputs, output, layers, chat_template, max_length, min_loss_tokens, fmt, hidden_dtype, batch_tokens,
          max_shard_bytes, min_shards, device, force, queue_bytes, inline_writes, progress):
    """Run the target over the conversations once and store its hidden states (resumable; torchrun for ranks)."""
    from fuelline.cache.build import build_cache
    from fuelline.cache.plan import CacheConfig
    from fuelline.cache.ranks import Ranks

    config = CacheConfig(layers=_layers(layers), chat_template=chat_template, max_length=max_length,
                         min_loss_tokens=min_loss_tokens, format=fmt, hidden_dtype=hidden_dtype,
                         max_shard_bytes=max_shard_bytes, min_shards=min_shards, batch_tokens=batch_tokens,
                         device=device, force=force, writer_thread=not inline_writes, queue_bytes=queue_bytes)
    ranks = Ranks.from_env()  # torchrun's RANK, WORLD_SIZE, LOCAL_RANK: read here, once
    stats = build_cache(model, list(inputs), output, config, progress=progress, ranks=ranks)
    if ranks.rank != 0:  # under torchrun, rank 0 reports
        return
    click.echo(summary(stats, output))


def summary(stats: dict, output) -> str:
    """What a build did, in three lines (also printed by pipelines and the chat demo)."""
    from fuelline.cache.estimate import human_bytes

    c = stats["cache"]
    dropped = ", ".join(f"{k} {v:,}" for k, v in stats["dropped"].items()) or "none"
    return "\n".join([
        f"cache      in {stats['records_in']:>10,}  out {stats['records_out']:>10,}  dropped: {dropped}"
        f"{'  (already built)' if stats.get('resumed') else ''}",
        f"           {c['tokens']:,} tokens ({c['supervised_share']:.1%} supervised), {human_bytes(c['bytes'])} in "
        f"{c['shards']} shard(s), {c['bytes_per_token']:,.1f} bytes/token, padding {c['padding_share']:.1%}, "
        f"forward {c['forward_seconds']:.1f}s of {stats['wall_seconds']:.1f}s",
        f"           open it with fuelline.cache.CacheDataset({str(output)!r})"])


@cache.command()
@click.option("--model", type=click.Path(exists=True),
              help="the target model's directory or config.json (its tokenizer is needed with --input)")
@click.option("--hidden-size", type=int, help="instead of --model: the target's hidden size")
@click.option("--input", "-i", "inputs", multiple=True, help="chat records: count their tokens exactly")
@click.option("--tokens", type=float, help="instead of --input: the number of tokens (e.g. 1.56e9)")
@click.option("--samples", type=float, default=0, help="with --tokens: the number of conversations")
@_config_options
def estimate(model, hidden_size, inputs, tokens, samples, layers, chat_template, max_length, min_loss_tokens, fmt,
             hidden_dtype):
    """Print the bytes a cache will take, for each format and hidden dtype, before any forward pass."""
    from fuelline.cache.estimate import estimate_from_counts, estimate_from_inputs, format_table
    from fuelline.cache.plan import CacheConfig, model_config
    from fuelline.formats.target_cache import HIDDEN_DTYPES

    config = CacheConfig(layers=_layers(layers), chat_template=chat_template, max_length=max_length,
                         min_loss_tokens=min_loss_tokens, format=fmt, hidden_dtype=hidden_dtype)
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
        dropped = ", ".join(f"{k} {v:,}" for k, v in counts["dropped"].items()) or "none"
        click.echo(f"{counts['samples']:,} of {counts['records_in']:,} conversations kept (dropped: {dropped}), "
                   f"{counts['tokens']:,} tokens")
    elif tokens:
        estimates = estimate_from_counts(len(config.layers), hidden_size, int(tokens), int(samples))
        click.echo(f"{int(tokens):,} tokens in {int(samples):,} conversations")
    else:
        raise click.UsageError("give --input (exact) or --tokens [--samples]")
    click.echo(f"{len(config.layers)} layer(s) ({','.join(map(str, config.layers))}) of hidden size {hidden_size:,}")
    click.echo(format_table(estimates, (fmt, HIDDEN_DTYPES[hidden_dtype])))


@cache.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False))
def verify(path):
    """Check manifest, index, bounds and every record's checksum; exit 1 when anything is wrong."""
    from fuelline.cache.inspect import verify_cache

    problems = verify_cache(path)
    for problem in problems:
        click.echo(f"problem: {problem}", err=True)
    if problems:
        raise click.exceptions.Exit(1)
    click.echo(f"ok: {path}")


@cache.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False))
def info(path):
    """Summarize a cache: format, samples, tokens, bytes, layers, model."""
    from fuelline.cache.inspect import cache_info, format_info

    click.echo(format_info(cache_info(path)))


@cache.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--draft-config", required=True, type=click.Path(exists=True, dir_okay=False),
              help="the draft model's config (JSON or TOML) with target_layer_ids, hidden_size, "
                   "target_model_name_or_path")
@click.option("--target-model", default=None, help="the target model the training run uses (default: the config's)")
def validate(path, draft_config, target_model):
    """Check that the cache fits a draft model's configuration (layers, hidden size, target model)."""
    from fuelline.cache.inspect import validate_for_draft

    problems = validate_for_draft(path, draft_config, target_model=target_model)
    for problem in problems:
        click.echo(f"problem: {problem}", err=True)
    if problems:
        raise click.exceptions.Exit(1)
    click.echo(f"ok: {path} fits {draft_config}")


@cache.command()
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
