"""JSON whose integers survive: orjson's speed, and the standard library where orjson rounds.

orjson reads an integer literal outside [-2**63, 2**64) as the nearest double
(123456789012345678901234567890 → 1.2345678901234568e+29, -9223372036854775809 →
-9.223372036854776e+18) and refuses to write such a Python int. Every literal it rounds has
at least 19 digits in a row, so `loads` parses with orjson and, only when the text holds such a
run (rare: ids, hashes and timestamps are shorter), again with the standard library, whose
integers are exact and whose floats are the same doubles. The test for a run (`may_round`)
costs a tenth of orjson's time on the poetry corpus's 360-byte lines, so the JSONL reader asks
it once per 256 KiB block and per line only in a block that has one. `dumps` falls back the
same way, for a value that holds such an integer, in orjson's compact form.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_DIGITS_AS_ZERO = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_RUN = b"0" * 19
_ORJSON_INT_LIMIT = "Integer exceeds 64-bit range"


def may_round(data: bytes) -> bool:
    """Whether `data` holds 19 digits in a row: an integer orjson may round, or digits in a string."""
    return _RUN in data.translate(_DIGITS_AS_ZERO)


def loads(data: bytes | str) -> Any:
    """`orjson.loads(data)`, with integers beyond 64 bits exact; raises `orjson.JSONDecodeError` as it does."""
    value = orjson.loads(data)
    if may_round(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")):
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
