"""Lone surrogate escapes in a JSON byte stream, found before the JSON array parser sees them.

A `\\udXXX` escape is half of a UTF-16 pair; alone it encodes no character. orjson refuses it
(a JSONL line with one is rejected), but ijson's C parser turns an unpaired high half into "?"
and an unpaired low half into bytes that fail to decode with no element named. So the stream
given to that parser passes through `SurrogateGuard`: each lone escape is replaced by
`\\ufffd` and reported to a callback *between* two reads. ijson asks for more bytes only when
it has handed out every event of the bytes it has, so the element being parsed at that moment
is the one holding the escape, and the reader can refuse exactly that element.

Cost: a `bytes.find` per chunk when the chunk has no `\\u` escape of a surrogate (the usual
case: UTF-8 corpora escape nothing, emoji written as escapes are valid pairs).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import IO

# A run of backslashes, then u and a surrogate's hex: an escape when the run has odd length.
_SURROGATE = re.compile(rb"(\\+)u([dD][89abAB]|[dD][c-fC-F])([0-9a-fA-F]{2})")
_HOLD_BACK = 12  # a high escape and the low escape that may follow it
READ_BYTES = 1 << 16  # ijson's own read size


class SurrogateGuard:
    """`head` (bytes already read to sniff the format), then the rest of `stream`, with lone
    surrogate escapes replaced; `found(escape)` is called for each one when every byte before it
    has been read by the caller."""

    def __init__(self, head: bytes, stream: IO[bytes], found: Callable[[str], None]):
        self.stream, self.found = stream, found
        self.pending = head  # not yet handed out
        self.lone_at_start: str | None = None  # `pending` opens with this lone escape
        self.eof = False

    def read(self, n: int = -1) -> bytes:
        if n == 0:  # ijson probes with read(0) to learn bytes vs str
            return b""
        while True:
            if self.lone_at_start is not None:  # the caller has read every byte before it
                self.found(self.lone_at_start)
                self.lone_at_start = None
                self.pending = b"\\ufffd" + self.pending[6:]
            out = self._judged() if self.eof or len(self.pending) > _HOLD_BACK else b""
            if out or (self.eof and self.lone_at_start is None):
                return out
            if self.lone_at_start is None:
                more = self.stream.read(READ_BYTES)
                self.eof = not more
                self.pending += more

    def _judged(self) -> bytes:
        """Hands out the pending bytes before the first lone escape, or all that can be judged:
        a tail is held back so that an escape, a pair or a run of backslashes cut by a read is
        judged whole."""
        data = self.pending
        cut = len(data)
        if not self.eof:
            cut -= _HOLD_BACK
            while cut > 0 and data[cut - 1:cut] == b"\\":
                cut -= 1
        if b"\\u" in data:
            paired_until = -1
            for match in _SURROGATE.finditer(data):
                at = match.start(2) - 2  # the backslash that opens the escape
                if at >= cut:
                    break
                if len(match.group(1)) % 2 == 0 or at < paired_until:
                    continue  # a literal backslash before "u…", or the low half of a pair
                if match.group(2)[1:].lower() in b"89ab" and _low_escape_at(data, at + 6):
                    paired_until = at + 12
                    cut = max(cut, paired_until)
                    continue
                self.lone_at_start = data[at:at + 6].decode("ascii")
                cut = at
                break
        self.pending = data[cut:]
        return data[:cut]


def _low_escape_at(data: bytes, at: int) -> bool:
    piece = data[at:at + 6]
    return len(piece) == 6 and piece[:2] == b"\\u" and piece[2:3] in b"dD" and piece[3:4].lower() in b"cdef"
