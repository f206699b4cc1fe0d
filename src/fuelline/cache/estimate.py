"""How many bytes a cache will take, before any forward pass: tokens × bytes per token.

Bytes per token follow from the layout alone (layers × hidden size × hidden bytes, plus ids and
masks, plus fp8 scales); with the inputs at hand the count is exact (each conversation encoded
with the model's tokenizer and chat template, each record sized as the build will write it),
otherwise it is the given token count times the per-token bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fuelline.formats.target_cache import BF16, DEEPSPEC_V2, FP8, FUELLINE, Layout

# Every layout a build can write, for the comparison table.
CHOICES = ((DEEPSPEC_V2, BF16), (FUELLINE, BF16), (FUELLINE, FP8))


@dataclass(frozen=True)
class Estimate:
    format: str
    hidden_dtype: str
    bytes_per_token: float
    total_bytes: int


def human_bytes(n: float, binary: bool = False) -> str:
    """`n` bytes in the largest unit it reaches: KB, MB, … (powers of 1000) or, `binary`, KiB, MiB, …"""
    step, units = (1024, ("B", "KiB", "MiB", "GiB", "TiB")) if binary else (1000, ("B", "KB", "MB", "GB", "TB", "PB"))
    for unit in units:
        if abs(n) < step or unit == units[-1]:
            break
        n /= step
    return f"{int(n):,} B" if unit == "B" else f"{n:,.1f} {unit}"


def estimate_from_counts(layers: int, hidden_size: int, tokens: int, samples: int) -> list[Estimate]:
    """Each layout's bytes (shards and index) for `tokens` tokens in `samples` records; fuelline's
    per-record id and alignment padding counted at their average (64 bytes, half an alignment per field)."""
    out = []
    for fmt, dtype in CHOICES:
        layout = Layout(fmt, layers, hidden_size, dtype)
        per_record = (64 + 32 * len(layout.fields)) if fmt == FUELLINE else 0
        total = int(tokens * layout.bytes_per_token() + samples * (per_record + layout.index_dtype().itemsize))
        out.append(Estimate(fmt, dtype, total / tokens if tokens else 0.0, total))
    return out


def estimate_from_inputs(model: str | os.PathLike, inputs: list[str], config, hidden_size: int,
                         progress: bool = True) -> tuple[list[Estimate], dict]:
    """Exact bytes for each layout: the inputs encoded as the build would, every record sized."""
    from fuelline.cache.plan import encode_inputs, record_sizes
    from fuelline.io.rejects import Rejects

    encoded = encode_inputs(inputs, model, config, _Discard(), _Discard(), Rejects(), progress)
    tokens = int(encoded.samples["length"].sum())
    out = []
    for fmt, dtype in CHOICES:
        layout = Layout(fmt, len(config.layers), hidden_size, dtype)
        total = int(record_sizes(layout, encoded.samples, encoded.record_ids).sum()) + \
            len(encoded.samples) * layout.index_dtype().itemsize
        out.append(Estimate(fmt, dtype, total / tokens if tokens else 0.0, total))
    return out, {"records_in": encoded.records_in, "samples": len(encoded.samples), "tokens": tokens,
                 "dropped": encoded.dropped}


class _Discard:
    """A file that keeps nothing: estimating needs only the lengths."""

    def write(self, data) -> int:
        return len(data)


def format_table(estimates: list[Estimate], chosen: tuple[str, str] | None = None) -> str:
    base = next(e for e in estimates if e.format == DEEPSPEC_V2)
    lines = [f"{'format':<12} {'hidden':<14} {'bytes/token':>12} {'total':>12}  vs deepspec-v2"]
    for e in estimates:
        mark = "  <- this build" if chosen == (e.format, e.hidden_dtype) else ""
        lines.append(f"{e.format:<12} {e.hidden_dtype:<14} {e.bytes_per_token:>12,.1f} {human_bytes(e.total_bytes):>12}"
                     f"  {e.total_bytes / base.total_bytes:.3f}x{mark}")
    return "\n".join(lines)


def format_streaming(chosen: Estimate, tokens: int, samples: int, config, tokens_per_second: float | None) -> str:
    """What a stream of this cache holds on disk at most: `window` + 1 partitions of `partition_samples`
    average samples (a partition differs from that by at most one forward batch), against the whole cache."""
    per_sample = chosen.total_bytes / samples
    partitions = -(-samples // config.partition_samples)
    partition = per_sample * min(config.partition_samples, samples)
    high_water = partition * min(config.window + 1, partitions)
    line = (f"streamed (fuelline cache stream --partition-samples {config.partition_samples:,} --window "
            f"{config.window}): {partitions:,} partition(s) of about {human_bytes(partition)} "
            f"({tokens * min(config.partition_samples, samples) // samples:,} tokens); the disk holds at most "
            f"{human_bytes(high_water)}, {high_water / chosen.total_bytes:.2%} of {human_bytes(chosen.total_bytes)}")
    if tokens_per_second:
        seconds = tokens / partitions / tokens_per_second
        line += f"; a partition takes about {seconds:,.0f} s at {tokens_per_second:,.0f} tokens/s"
    return line
