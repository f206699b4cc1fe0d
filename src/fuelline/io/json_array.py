"""Records from a byte stream that holds one top-level JSON array, with their element numbers.

ijson's C backend parses the array incrementally, so memory stays that of one element whatever
the file size. A break in the array's syntax ends the reading there: nothing after it can be
located, and the elements before it stay read.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import IO, Iterator

from fuelline.io.bad_records import MAX_NESTING_DEPTH, MAX_RECORD_BYTES, BadRecords, RecordError
from fuelline.io.json_escapes import SurrogateGuard
from fuelline.io.streams import blocks, open_binary


def _first_invalid_utf8(path: Path) -> tuple[int, bytes, str] | None:
    """(byte offset, bad bytes, why) of the first invalid UTF-8 in a file's (decompressed) data."""
    offset, pending = 0, b""
    with open_binary(path) as stream:
        for chunk in blocks(stream, b""):
            data = pending + chunk
            try:
                _, used = codecs.utf_8_decode(data, "strict", False)
            except UnicodeDecodeError as e:
                return offset + e.start, data[e.start:e.end], e.reason
            offset, pending = offset + used, data[used:]
    if pending:
        return offset, pending, "unexpected end of data"
    return None


def _array_error(path: Path, index: int, error: Exception) -> tuple[str, str]:
    """(reason, what is wrong) for a JSON array whose parser stopped inside element `index`."""
    message = str(error)
    if "premature EOF" in message:
        return "truncated_json_array", (f"the JSON array ends inside element {index}: truncated? "
                                        f"(the {index - 1:,} elements before it are read)")
    if "UTF8" in message or "UTF-8" in message:
        found = _first_invalid_utf8(path)
        if found is not None:
            offset, bad, why = found
            return "invalid_utf8", (f"invalid UTF-8 at byte {offset} of the file (0-based offset, after decompression): "
                                    f"{bad!r} ({why}); nothing after it can be read")
    first_line = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return "malformed_json", f"invalid JSON array: {first_line}; nothing after it can be read"


_CLOSE = {"start_map": "end_map", "start_array": "end_array"}


def json_array_records(stream: IO[bytes], head: bytes, start: int, stop: int | None, report: BadRecords,
                        max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, dict]]:
    """(1-based element number, record) for elements start..stop-1 of a top-level JSON array.

    ijson's C parser gives the events; elements are built by its C builder, fed here so the depth
    and size of each element are known before it is built. An element nested deeper than
    MAX_NESTING_DEPTH, or with more than `max_record_bytes` of strings, is cut short where that is
    seen (the builder's open containers are closed for it, the rest of the element read past),
    then reported instead of yielded.
    """
    import ijson

    backend = ijson.get_backend(ijson.backend_name)
    built = ijson.sendable_list()
    send = backend.parse_basecoro(backend.items_basecoro(built, "item")).send
    index = 0  # elements completed
    depth = 0  # containers open in the input, the top-level array included
    opened: list[str] = []  # containers open in what the builder was given
    skip_to = None  # depth at which the element being read past ends
    bad: tuple[str, str] | None = None  # why the element being read is refused
    size = 0  # bytes of strings and keys in the element being read
    last = ""  # the last event given to the builder
    lone_escapes: dict[int, str] = {}  # element number: its first lone surrogate escape
    guarded = SurrogateGuard(head, stream, lambda escape: lone_escapes.setdefault(index + 1, escape))
    try:
        for event, value in backend.basic_parse(guarded, use_float=True):
            if event == "map_key" or event == "string":  # the most frequent events first
                if skip_to is not None:
                    continue
                size += len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
                if size > max_record_bytes:
                    bad = ("record_too_large",
                           f"array element {index + 1} holds more than {max_record_bytes:,} bytes of text (max_record_bytes)")
            elif event == "start_map" or event == "start_array":
                depth += 1
                if skip_to is not None:
                    continue
                if depth - 1 > MAX_NESTING_DEPTH:
                    bad = ("nesting_too_deep",
                           f"array element {index + 1} is nested deeper than {MAX_NESTING_DEPTH} levels (the limit for a record)")
                else:
                    opened.append(event)
            elif event == "end_map" or event == "end_array":
                depth -= 1
                if skip_to is not None:
                    if depth == skip_to:
                        skip_to = None
                    continue
                opened.pop()
            elif skip_to is not None:
                continue
            if bad is not None and skip_to is None:
                # Close what the builder has open, so it ends the element; read past the rest of it.
                if last == "map_key" or len(opened) == 1:
                    send(("null", None))
                for kind in reversed(opened[1:]):
                    send((_CLOSE[kind], None))
                del opened[1:]
                if depth > 1:
                    skip_to = 1
            else:
                send((event, value))
                last = event
            if built:
                element = built.pop()
                index += 1
                size, last = 0, ""
                refused, bad = bad, None
                if index in lone_escapes:
                    refused = ("malformed_json", f"array element {index} holds the lone surrogate escape "
                               f"{lone_escapes.pop(index)} (half of a UTF-16 pair encodes no character)")
                if index <= start:
                    continue
                if stop is not None and index > stop:
                    return
                if refused is not None:
                    report.bad(index, *refused, None)
                elif type(element) is not dict:
                    report.bad(index, "not_an_object", f"array element {index} is {type(element).__name__}, not an object",
                               element)
                else:
                    yield index, element
    except ijson.JSONError as e:
        # The array's syntax is broken: nothing after this point can be located. With on_error="skip"
        # the elements before it stay read and the break counts as one unreadable record.
        reason, what = _array_error(report.local, index + 1, e)
        if report.on_error == "raise":
            raise RecordError(report.source, f"element {index + 1}", what) from None
        if index + 1 > start:
            report.bad(index + 1, reason, what, None)
