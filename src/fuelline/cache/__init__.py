"""The target cache: a target model's hidden states, captured once, read by draft training.

`fuelline cache build` writes it (`fuelline.cache.build`); `CacheDataset`, `CacheCollator`,
`LengthGroupedBatchSampler` and `widen_hidden` read it, `StreamingCacheDataset` reads a stream
while `fuelline cache stream` builds it (`fuelline.cache.stream`), and `SpecForgeDataset` and
`SpeculatorsDataset` read it as SpecForge's and speculators' offline datasets do (imported on first
use: they need torch, which the CLI does not load until a command needs it); the byte layout is
`fuelline.formats.target_cache`.
"""

READERS = ("CacheCollator", "CacheDataset", "LengthGroupedBatchSampler", "widen_hidden")
__all__ = [*READERS, "SpecForgeDataset", "SpeculatorsDataset", "StreamingCacheDataset"]


def __getattr__(name: str):
    if name in READERS:
        from fuelline.cache import dataset

        return getattr(dataset, name)
    if name == "StreamingCacheDataset":
        from fuelline.cache import stream_dataset

        return stream_dataset.StreamingCacheDataset
    if name == "SpecForgeDataset":
        from fuelline.cache import specforge

        return specforge.SpecForgeDataset
    if name == "SpeculatorsDataset":
        from fuelline.cache import speculators

        return speculators.SpeculatorsDataset
    raise AttributeError(f"module 'fuelline.cache' has no attribute {name!r}")
