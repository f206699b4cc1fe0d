"""JSON whose integers survive: orjson's speed, and the standard library where orjson rounds.

orjson reads an integer literal outside [-2**63, 2**64) as the nearest double
(123456789012345678901234567890 → 1.2345678901234568e+29, -9223372036854775809 →
-9.223372036854776e+18) and refuses to write such a Python int. Every literal it rounds has
at least 19 digits in a row, so `loads` parses with orjson and, only when the text holds such a
run (rare: ids, hashes and timestamps are shorter, and a run inside a string costs one more
parse, nothing else), parses it again with the standard library, whose integers are exact and
whose floats are the same doubles. `dumps` writes with orjson and falls back, for a value that
holds such an integer, to the standard library in orjson's compact form.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

LONG_DIGITS = re.compile(rb"\d{19}")
_ORJSON_INT_LIMIT = "Integer exceeds 64-bit range"


def loads(data: bytes | str) -> Any:
    """`orjson.loads(data)`, with integers beyond 64 bits exact; raises `orjson.JSONDecodeError` as it does."""
    value = orjson.loads(data)
    if LONG_DIGITS.search(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")):
        return json.loads(data)  # orjson accepted it: valid JSON, the same value but for those integers
    return value


def dumps(value: Any) -> bytes:
    """`orjson.dumps(value)`; a value with an integer beyond 64 bits is written exactly, as compact."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as e:
        if _ORJSON_INT_LIMIT not in str(e):
            raise
        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError, RecursionError) as fallback:  # raised as orjson raises what it cannot write
            raise orjson.JSONEncodeError(f"{e}, and {fallback}") from None
