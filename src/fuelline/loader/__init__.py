"""Feeding the GPU: memory-mapped token datasets, resumable sampling, loss, prefetching."""

from fuelline.loader.dataset import IGNORE_INDEX, TokenDataset
from fuelline.loader.loader import ResumableLoader, make_loader, make_mixture_loader
from fuelline.loader.mixture import MixtureDataset, MixtureSampler
from fuelline.loader.loss import AlignmentError, causal_lm_loss, check_alignment
from fuelline.loader.prefetch import CUDAPrefetcher
from fuelline.loader.sampler import WindowSampler

__all__ = ["IGNORE_INDEX", "AlignmentError", "CUDAPrefetcher", "MixtureDataset", "MixtureSampler", "ResumableLoader",
           "TokenDataset", "WindowSampler", "causal_lm_loss", "check_alignment", "make_loader", "make_mixture_loader"]
