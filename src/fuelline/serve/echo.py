"""An instant OpenAI-compatible server whose answers are a known function of the conversation.

It exists to test and measure clients, not models: a regeneration test can check that every
answer was conditioned on the regenerated history (`echo_answer` recomputes it), a fault test can
make it fail on purpose, and a benchmark can find the client's ceiling without a model behind it.

    python -m fuelline.serve.echo --port 30000 [--model echo] [--fault http500|drop|stall]
        [--fault-every N] [--reject-fields top_k,min_p] [--delay SECONDS] [--reasoning]
        [--tools call] [--log-requests FILE] [--stream auto|never|refuse] [--chunk-delay SECONDS]

- `GET /v1/models` lists the model; `POST /v1/chat/completions` answers `echo_answer(messages)`,
  cut to `max_tokens` words (finish reason "length") when longer, with usage counts.
- `--reject-fields` answers 422 "Unexpected fields in the request: {...}", as `transformers serve`
  does for `top_k` and `min_p`; `--reasoning` adds a separate `reasoning_content` (`echo_reasoning`),
  as the reasoning parsers of SGLang and vLLM do.
- `--tools call` answers a request that carries `tools` with a tool call (`echo_call`), content
  null and finish reason "tool_calls", as OpenAI does; without it `tools` are ignored.
- `"stream": true` is answered as server-sent events, as vLLM and SGLang do: a role chunk, the
  reasoning, content and tool-call arguments in pieces (a word each), the finish reason, a usage
  chunk when `stream_options.include_usage`, `data: [DONE]`; `--chunk-delay` waits between chunks.
  `--stream never` answers whole whatever the request says, `--stream refuse` answers 400.
- `--log-requests FILE` appends each chat request's body to FILE as a JSON line.
- `--fault` applies to every `--fault-every`-th chat request: `http500` answers 500, `drop` closes
  the connection, `stall` never answers, `stall-midway` streams half of the answer and then
  nothing (answered whole, it is `stall`), `cut` closes it in the middle of the body; the others
  (`ANSWER_FAULTS`) answer 200 with a body wrong in one way, as servers in the wild do, or in a
  form a client must read right (`think-*`: reasoning inline; `big-integer-arguments`: integers
  beyond 64 bits); streamed, the same body comes in pieces.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import re

import orjson

ANSWER_WORDS = 8
INLINE_REASONING = "thought written inline"
BIG_ARGUMENTS = '{"n": 123456789012345678901234567890, "m": -9223372036854775809}'


def _set(path: str, value):
    """A fault that sets one field of the answer, `path` as in choices.0.message.content."""
    *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]

    def fault(answer: dict) -> None:
        node = answer
        for key in parents:
            node = node[key]
        node[last] = value
    return fault


def _abort(answer: dict) -> None:
    choice = answer["choices"][0]
    choice["message"]["content"] = " ".join(choice["message"]["content"].split()[:2])
    choice["finish_reason"] = "abort"


def _second_choice(answer: dict) -> None:
    answer["choices"].append({**answer["choices"][0], "index": 1,
                              "message": {"role": "assistant", "content": "another answer"}})


def _call_message(call_id: str, name: str, arguments: str) -> dict:
    """An assistant message that is one tool call, its arguments a JSON string as on the wire."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def _tool_call(call_id: str, arguments: str):
    """A fault that answers one tool call of `lookup` with the arguments string `arguments`."""
    def fault(answer: dict) -> None:
        answer["choices"][0].update(message=_call_message(call_id, "lookup", arguments), finish_reason="tool_calls")
    return fault


def _inline_think(content: str):
    """A form that writes the answer's reasoning into its content, `content` naming where the answer goes."""
    def form(answer: dict) -> None:
        message = answer["choices"][0]["message"]
        message["content"] = content.format(answer=message["content"], reasoning=INLINE_REASONING)
    return form


def _wrong_types(answer: dict) -> None:
    answer["choices"][0]["message"]["content"] = 42
    answer["choices"][0]["finish_reason"] = 1


# Faults of a 200 answer: a function that changes the answer, or the raw body sent instead.
ANSWER_FAULTS = {
    "empty": _set("choices.0.message.content", ""),
    "whitespace": _set("choices.0.message.content", " \n\t "),
    "abort": _abort,  # partial text, as SGLang and vLLM end an aborted request
    "bad-usage": _set("usage.completion_tokens", "n/a"),
    "two-choices": _second_choice,
    "no-choices": _set("choices", []),
    "no-message": lambda a: a["choices"][0].pop("message"),
    "reasoning-only": _set("choices.0.message",
                           {"role": "assistant", "content": None, "reasoning_content": "thinking..."}),
    "bad-tool-arguments": _tool_call("call-bad", '{"city": "Par'),  # cut JSON
    "wrong-types": _wrong_types,
    # Answers a server without a reasoning parser gives: the reasoning inline, in each form
    "think-first": _inline_think("<think>{reasoning}</think>\n\n{answer}"),
    "think-r1": _inline_think("{reasoning}</think>\n\n{answer}"),  # DeepSeek-R1: the tag opened in the prompt
    "think-in-middle": _inline_think("{answer} <think>{reasoning}</think> then more."),
    "think-twice": _inline_think("<think>a</think>{answer}<think>{reasoning}</think>d"),
    "think-unclosed": _inline_think("<think>{reasoning} {answer}"),
    "big-integer-arguments": _tool_call("call-big", BIG_ARGUMENTS),  # integers beyond 64 bits, which orjson rounds
    "html": b"<html><body><h1>502 Bad Gateway</h1></body></html>",
    "error-object": b'{"error": {"message": "model overloaded", "type": "server_error", "code": 503}}',
    "truncated-json": None,  # the answer's bytes cut in half
}
FAULTS = ("http500", "drop", "stall", "stall-midway", "cut", *ANSWER_FAULTS)
STREAM_MODES = ("auto", "never", "refuse")
WORD = re.compile(r"\s*\S+|\s+")


def _digest(messages: list[dict]) -> str:
    return hashlib.sha1(orjson.dumps([[m["role"], m["content"]] for m in messages])).hexdigest()[:12]


def echo_answer(messages: list[dict]) -> str:
    """The answer to `messages`: it names how many messages it saw and a digest of all of them
    (their roles and contents)."""
    return " ".join([f"reply-{len(messages)}", _digest(messages), *(f"w{i}" for i in range(ANSWER_WORDS - 2))])


def echo_call(messages: list[dict], tools: list[dict]) -> tuple[str, dict]:
    """The tool call answering `messages` under `--tools call`: (function name, arguments), the
    function picked from `tools` by the number of messages, the arguments naming them as `echo_answer` does."""
    name = tools[len(messages) % len(tools)]["function"]["name"]
    return name, {"seen": len(messages), "digest": _digest(messages)}


def echo_reasoning(messages: list[dict]) -> str:
    """The reasoning `--reasoning` returns apart from the answer to `messages`."""
    return f"REASONING: {len(messages)} messages to think about"


class EchoServer:
    def __init__(self, args: argparse.Namespace, log=None):
        self.args = args  # the parsed command line (see the module doc)
        self.reject_fields = {f for f in args.reject_fields.split(",") if f}
        self.log = log  # a binary file open for appending, or None
        self.requests = 0

    async def models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": self.args.model, "object": "model"}]})

    async def chat(self, request):
        from aiohttp import web

        self.requests += 1
        fault = self.args.fault if self.args.fault and self.requests % self.args.fault_every == 0 else None
        if fault == "http500":
            return web.Response(status=500, text="injected failure")
        if fault == "drop":
            request.transport.close()
            return web.Response(status=500)
        body = orjson.loads(await request.read())
        streamed = bool(body.get("stream")) and self.args.stream != "never"
        if fault == "stall" or (fault == "stall-midway" and not streamed):
            await asyncio.Event().wait()
        if self.log is not None:
            self.log.write(orjson.dumps(body) + b"\n")
            self.log.flush()
        unexpected = self.reject_fields & set(body)
        if unexpected:
            return web.Response(status=422, text=f"Unexpected fields in the request: {sorted(unexpected)}")
        if streamed and self.args.stream == "refuse":
            return web.Response(status=400, text="streaming is not supported")
        if self.args.delay:
            await asyncio.sleep(self.args.delay)
        messages = body["messages"]
        words = echo_answer(messages).split()
        limit = body.get("max_tokens") or len(words)
        content, finish = (" ".join(words[:limit]), "length") if limit < len(words) else (" ".join(words), "stop")
        prompt_tokens = sum(len((m.get("content") or "").split()) for m in messages)
        message = {"role": "assistant", "content": content}
        if self.args.tools == "call" and body.get("tools"):
            name, arguments = echo_call(messages, body["tools"])
            message = _call_message(f"call-{self.requests}", name, orjson.dumps(arguments).decode())
            finish = "tool_calls"
        if self.args.reasoning:
            message["reasoning_content"] = echo_reasoning(messages)
        answer = {
            "id": f"chatcmpl-{self.requests}", "object": "chat.completion", "model": self.args.model,
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": min(limit, len(words)),
                      "total_tokens": prompt_tokens + min(limit, len(words))},
        }
        if fault == "cut" and not streamed:  # headers promising the whole body, then half of it
            raw = orjson.dumps(answer)
            return await self._write(request, [raw[:len(raw) // 2]], fault,
                                     {"Content-Type": "application/json", "Content-Length": str(len(raw))})
        change = ANSWER_FAULTS.get(fault)
        if callable(change):
            change(answer)
        if streamed and fault != "html":
            include_usage = (body.get("stream_options") or {}).get("include_usage")
            return await self._stream(request, answer, fault, include_usage)
        raw = change if isinstance(change, bytes) else orjson.dumps(answer)
        if fault == "truncated-json":
            raw = raw[:len(raw) // 2]
        return web.Response(body=raw, content_type="text/html" if fault == "html" else "application/json")

    async def _stream(self, request, answer: dict, fault: str | None, include_usage: bool):
        """`answer` as server-sent events (see the module doc), with a streamed form of `fault`."""
        if fault == "error-object":
            events = [ANSWER_FAULTS[fault]]
        else:
            events = [orjson.dumps({"id": answer["id"], "object": "chat.completion.chunk", "model": self.args.model,
                                    "choices": choices, **extra}) for choices, extra in _chunks(answer, include_usage)]
            events.append(b"[DONE]")
        raw = [b"data: " + event + b"\n\n" for event in events]
        if fault in ("cut", "truncated-json", "stall-midway"):
            joined = b"".join(raw)
            raw = [joined[:len(joined) // 2]]
        elif not self.args.chunk_delay:  # all at once: an instant server's events arrive together
            raw = [b"".join(raw)]
        return await self._write(request, raw, fault,
                                 {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})

    async def _write(self, request, pieces: list[bytes], fault: str | None, headers: dict):
        """`pieces` as one response, `--chunk-delay` between them; then the end, or what `fault` says instead."""
        from aiohttp import web

        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        for k, piece in enumerate(pieces):
            if k and self.args.chunk_delay:
                await asyncio.sleep(self.args.chunk_delay)
            await response.write(piece)
        if fault == "stall-midway":
            await asyncio.Event().wait()
        if fault == "cut":
            request.transport.close()
        else:
            await response.write_eof()
        return response


def _pieces(text) -> list:
    """`text` in the pieces a server streams it in: a word each, with the spaces before it."""
    return WORD.findall(text) or [text] if isinstance(text, str) else [text]


def _chunks(answer: dict, include_usage: bool) -> list[tuple[list[dict], dict]]:
    """(choices, other fields) of each chunk streaming `answer`, a whole chat completion."""
    chunks = []
    for choice in answer["choices"]:
        index, message = choice.get("index", 0), choice.get("message")
        chunks.append(([{"index": index, "delta": {"role": "assistant"}}], {}))
        if isinstance(message, dict):
            for key in ("reasoning_content", "content"):
                if message.get(key) is not None:
                    chunks += [([{"index": index, "delta": {key: piece}}], {}) for piece in _pieces(message[key])]
            for k, call in enumerate(message.get("tool_calls") or ()):
                arguments = call["function"]["arguments"]
                half = len(arguments) // 2
                chunks.append(([{"index": index, "delta": {"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                               "function": {"name": call["function"]["name"], "arguments": arguments[:half]}}]}}], {}))
                chunks.append(([{"index": index, "delta": {"tool_calls": [{"index": k, "function": {
                               "arguments": arguments[half:]}}]}}], {}))
        chunks.append(([{"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}], {}))
    if include_usage and "usage" in answer:
        chunks.append(([], {"usage": answer["usage"]}))
    return chunks


def echo_app(argv: list[str] | None = None):
    """The server's aiohttp app and its parsed command line (host, port): what `main` serves, and what a
    test can serve on a thread of its own (`--port 0`) without starting a process."""
    from aiohttp import web

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="echo")
    parser.add_argument("--fault", choices=FAULTS)
    parser.add_argument("--fault-every", type=int, default=1)
    parser.add_argument("--reject-fields", default="")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--reasoning", action="store_true")
    parser.add_argument("--tools", choices=("ignore", "call"), default="ignore")
    parser.add_argument("--log-requests", metavar="FILE")
    parser.add_argument("--stream", choices=STREAM_MODES, default="auto")
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    log = open(args.log_requests, "ab") if args.log_requests else None
    server = EchoServer(args, log)
    app = web.Application()
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.chat)
    if log is not None:
        async def close_log(app):
            log.close()
        app.on_cleanup.append(close_log)
    return app, args


def main() -> None:
    from aiohttp import web

    app, args = echo_app()
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
