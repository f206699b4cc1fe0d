"""A streamed chat completion (server-sent events) put back together as the answer a whole reply would be.

Streamed, an answer arrives a token or so per event, so a long silence is a stall whatever the
answer's length (`fuelline.serve.client`). The wire format is SSE as OpenAI-compatible servers write it: lines `data: JSON` (a
`chat.completion.chunk`), an empty line ending each event, lines starting with `:` comments
(keep-alives), line ends LF, CRLF or CR. OpenAI, vLLM and SGLang end with `data: [DONE]`;
`transformers serve` ends after its last chunk (finish reason and usage) without it. A chunk's
`choices[k].delta` carries pieces: `content`, `reasoning_content` (or `reasoning`, vLLM's
newer name), and `tool_calls`, each call by `index`, its id and name once and its `arguments`
string in pieces. An error in the middle of a stream comes as `data: {"error": …}` (a string
from transformers, an object from others).

`StreamedAnswer.body()` is the non-streamed response body (`choices[k].message`,
`finish_reason`, `usage`), so one parser (`fuelline.serve.client`) reads both forms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson


class StreamError(Exception):
    """A stream that is not a chat completion; `reason` is short and stable (for counting)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class EventDecoder:
    """Bytes as they arrive → the data of each complete event (several `data:` lines joined by "\\n")."""

    def __init__(self):
        self._rest = b""  # an incomplete last line
        self._after_cr = False  # the last chunk ended with CR: a LF opening the next one ends no line
        self._data: list[bytes] = []  # the data lines of the event being read

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._after_cr = chunk.endswith(b"\r")
        buffer = self._rest + chunk if self._rest else chunk
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._rest = lines.pop()
        return self._events(lines)

    def end(self) -> list[bytes]:
        """The last event, when the stream ended without the empty line that closes it."""
        rest, self._rest = self._rest, b""
        events = self._events([rest]) if rest else []
        if self._data:
            events.append(b"\n".join(self._data))
            self._data = []
        return events

    def _events(self, lines: list[bytes]) -> list[bytes]:
        events = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                self._data.append(line[6:] if line[5:6] == b" " else line[5:])
            # comments (":"), and the event, id and retry fields, say nothing about the answer
        return events


@dataclass(slots=True)
class _Choice:
    content: list[str] | None = None  # None: no content piece came (a null content)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # by index: id, type, name, arguments pieces
    finish_reason: Any = None


class StreamedAnswer:
    """The events of one streamed completion, merged (see the module doc)."""

    def __init__(self):
        self.choices: dict[int, _Choice] = {}
        self.usage: Any = None
        self.done = False  # data: [DONE] came
        self.first = b""  # the first event, for messages about a stream that is not a completion

    @property
    def finished(self) -> bool:
        """The stream said it was complete: [DONE], or a finish reason for the first choice."""
        first = self.choices.get(0)
        return self.done or (first is not None and first.finish_reason is not None)

    def add(self, data: bytes) -> None:
        if data == b"[DONE]":
            self.done = True
            return
        if not self.first:
            self.first = data[:200]
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise StreamError("bad_answer", f"streamed an event that is not JSON ({e}): {data[:200]!r}") from None
        if type(chunk) is not dict:
            raise StreamError("bad_answer", f"streamed an event that is not a chunk object: {data[:200]!r}")
        choices = chunk.get("choices")
        if type(choices) is list and len(choices) == 1 and "usage" not in chunk:  # most events: one piece
            self._add_choice(choices[0], data)
            return
        if "error" in chunk or chunk.get("object") == "error":
            error = chunk.get("error", chunk)
            message = error.get("message", error) if isinstance(error, dict) else error
            raise StreamError("bad_answer", f"streamed an error: {str(message)[:300]}")
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if not isinstance(choices, list):
            if choices is None:
                return
            raise StreamError("bad_answer", f"streamed choices as a {type(choices).__name__}: {data[:200]!r}")
        for choice in choices:
            self._add_choice(choice, data)

    def _add_choice(self, choice: Any, data: bytes) -> None:
        if type(choice) is not dict:
            raise StreamError("bad_answer", f"streamed a choice that is not an object: {data[:200]!r}")
        index = choice.get("index", 0)
        merged = self.choices.get(index)
        if merged is None:
            if type(index) is not int:
                raise StreamError("bad_answer", f"streamed a choice whose index is {index!r}: {data[:200]!r}")
            merged = self.choices[index] = _Choice()
        finish = choice.get("finish_reason")
        if finish is not None:
            merged.finish_reason = finish
        delta = choice.get("delta")
        if type(delta) is not dict:
            return
        for key, value in delta.items():  # only the keys sent: most deltas hold one piece
            if value is None or key == "role":
                continue
            if key == "content":
                if type(value) is not str:
                    raise StreamError("bad_answer", f"streamed a {type(value).__name__} as content: {data[:200]!r}")
                if merged.content is None:
                    merged.content = []
                merged.content.append(value)
            elif key == "reasoning_content" or (key == "reasoning" and delta.get("reasoning_content") is None):
                if type(value) is str:
                    merged.reasoning.append(value)
            elif key == "tool_calls" and type(value) is list:
                for position, call in enumerate(value):
                    self._add_call(merged, position, call, data)

    @staticmethod
    def _add_call(merged: _Choice, position: int, call: Any, data: bytes) -> None:
        if not isinstance(call, dict):
            raise StreamError("bad_answer", f"streamed a tool call that is not an object: {data[:200]!r}")
        index = call.get("index", position)
        if not isinstance(index, int):
            raise StreamError("bad_answer", f"streamed a tool call whose index is {index!r}: {data[:200]!r}")
        entry = merged.calls.setdefault(index, {"id": None, "type": "function", "name": None, "arguments": []})
        if call.get("id"):
            entry["id"] = call["id"]
        if call.get("type"):
            entry["type"] = call["type"]
        function = call.get("function")
        if not isinstance(function, dict):
            return
        if function.get("name") and not entry["name"]:  # sent once; a server repeating it is not concatenated
            entry["name"] = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            entry["arguments"].append(arguments)
        elif arguments is not None:  # the object itself, as a few servers send it
            entry["arguments"] = arguments

    def body(self) -> dict[str, Any]:
        """The response body of the same answer not streamed."""
        choices = []
        for index in sorted(self.choices):
            merged = self.choices[index]
            message: dict[str, Any] = {"role": "assistant",
                                       "content": None if merged.content is None else "".join(merged.content)}
            if merged.reasoning:
                message["reasoning_content"] = "".join(merged.reasoning)
            if merged.calls:
                message["tool_calls"] = [
                    {**({"id": c["id"]} if c["id"] else {}), "type": c["type"], "function": {
                        "name": c["name"],
                        "arguments": "".join(c["arguments"]) if isinstance(c["arguments"], list) else c["arguments"]}}
                    for _, c in sorted(merged.calls.items())]
            choices.append({"index": index, "message": message, "finish_reason": merged.finish_reason})
        return {"object": "chat.completion", "choices": choices, **({"usage": self.usage} if self.usage else {})}
