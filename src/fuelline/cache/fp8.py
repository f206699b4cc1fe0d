"""Hidden states as float8 e4m3 with a float32 scale per token (and layer): half the bytes of bf16.

Each row of H values (one token at one layer) is divided by s = max|x| / 448 so its largest
value lands on e4m3's largest finite number, then rounded to e4m3. The error bound is in
`fuelline.formats.target_cache`'s docstring and `error_bound` computes it. Quantizing runs on the
device that holds the hidden states (before the copy to the host: half the bytes cross PCIe);
widening runs wherever the batch is (`dequantize`), normally on the GPU after the prefetcher's copy.
"""

from __future__ import annotations

from fuelline.formats.target_cache import FP8_MAX


def quantize(hidden, groups: int):
    """[..., groups·H] float → (e4m3 [..., groups·H], float32 scales [..., groups]).

    A row of zeros gets scale 1 (stored exactly). Non-finite values cannot be scaled: ValueError."""
    import torch

    values = hidden.float().unflatten(-1, (groups, -1))
    amax = values.abs().amax(dim=-1)
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("hidden states hold inf or NaN: they cannot be stored as fp8 (the target model "
                         "overflowed in its dtype); use --hidden-dtype bf16 to keep them as they are")
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    quantized = (values / scales.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return quantized.flatten(-2), scales


def dequantize(quantized, scales, dtype=None):
    """The inverse of `quantize`, in `dtype` (default bfloat16)."""
    import torch

    groups = scales.shape[-1]
    values = quantized.float().unflatten(-1, (groups, -1)) * scales.float().unsqueeze(-1)
    return values.flatten(-2).to(dtype or torch.bfloat16)


def error_bound(hidden, scales):
    """The largest |x̂ − x| the format allows for each value, before widening to bf16: |x|/16 + s/1024."""
    groups = scales.shape[-1]
    values = hidden.float().unflatten(-1, (groups, -1))
    return (values.abs() / 16 + scales.float().unsqueeze(-1) / 1024).flatten(-2)
