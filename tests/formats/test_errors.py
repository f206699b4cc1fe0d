"""Both formats' errors are one FormatError: a user can catch either format's, or all of them."""

import pytest

from fuelline.formats.errors import FormatError
from fuelline.formats.target_cache import CacheFormatError, read_manifest
from fuelline.formats.tokens import TokenFiles, TokenFormatError


def test_both_format_errors_are_one_format_error(tmp_path):
    with pytest.raises(FormatError, match="no manifest.json") as tokens:
        TokenFiles(tmp_path)
    with pytest.raises(FormatError, match="missing: not a target cache") as cache:
        read_manifest(tmp_path)
    assert type(tokens.value) is TokenFormatError and type(cache.value) is CacheFormatError
    assert not isinstance(tokens.value, CacheFormatError) and isinstance(cache.value, ValueError)
    assert str(cache.value).startswith(f"{tmp_path}/manifest.json: ")
