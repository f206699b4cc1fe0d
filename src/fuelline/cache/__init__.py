"""The target cache: a target model's hidden states, captured once, read by draft training.

`fuelline cache build` writes it (`fuelline.cache.build`); `CacheDataset`, `CacheCollator` and
`LengthGroupedBatchSampler` read it; the byte layout is `fuelline.formats.target_cache`.
"""
