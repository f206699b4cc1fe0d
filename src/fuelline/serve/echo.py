"""An instant OpenAI-compatible server whose answers are a known function of the conversation.

It exists to test and measure clients, not models: a regeneration test can check that every
answer was conditioned on the regenerated history (`echo_answer` recomputes it), a fault test can
make it fail on purpose, and a benchmark can find the client's ceiling without a model behind it.

    python -m fuelline.serve.echo --port 30000 [--model echo] [--fault http500|drop|stall]
        [--fault-every N] [--reject-fields top_k,min_p] [--delay SECONDS]

- `GET /v1/models` lists the model; `POST /v1/chat/completions` answers `echo_answer(messages)`,
  cut to `max_tokens` words (finish reason "length") when longer, with usage counts.
- `--reject-fields` answers 422 "Unexpected fields in the request: {...}" when a request carries
  them, as `transformers serve` does for `top_k` and `min_p`.
- `--reasoning` adds a separate `reasoning_content` to each answer, as reasoning parsers of
  SGLang and vLLM do, so a client can be checked to leave it out of the answer.
- `--fault` applies to every `--fault-every`-th chat request (1: all of them): `http500` answers
  500, `drop` closes the connection without an answer, `stall` never answers.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib

import orjson

ANSWER_WORDS = 8


def echo_answer(messages: list[dict]) -> str:
    """The answer to `messages`: it names how many messages it saw and a digest of all of them."""
    digest = hashlib.sha1(orjson.dumps([[m["role"], m["content"]] for m in messages])).hexdigest()[:12]
    return " ".join([f"reply-{len(messages)}", digest, *(f"w{i}" for i in range(ANSWER_WORDS - 2))])


class EchoServer:
    def __init__(self, model: str, fault: str | None, fault_every: int, reject_fields: set[str], delay: float,
                 reasoning: bool = False):
        self.model, self.fault, self.fault_every = model, fault, fault_every
        self.reject_fields, self.delay, self.reasoning = reject_fields, delay, reasoning
        self.requests = 0

    async def models(self, request):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def chat(self, request):
        from aiohttp import web

        self.requests += 1
        if self.fault and self.requests % self.fault_every == 0:
            if self.fault == "http500":
                return web.Response(status=500, text="injected failure")
            if self.fault == "drop":
                request.transport.close()
                return web.Response(status=500)
            await asyncio.Event().wait()  # stall
        body = orjson.loads(await request.read())
        unexpected = self.reject_fields & set(body)
        if unexpected:
            return web.Response(status=422, text=f"Unexpected fields in the request: {sorted(unexpected)}")
        if self.delay:
            await asyncio.sleep(self.delay)
        words = echo_answer(body["messages"]).split()
        limit = body.get("max_tokens") or len(words)
        content, finish = (" ".join(words[:limit]), "length") if limit < len(words) else (" ".join(words), "stop")
        prompt_tokens = sum(len(m["content"].split()) for m in body["messages"])
        message = {"role": "assistant", "content": content}
        if self.reasoning:
            message["reasoning_content"] = "REASONING: let me think about it"
        return web.Response(body=orjson.dumps({
            "id": f"chatcmpl-{self.requests}", "object": "chat.completion", "model": self.model,
            "choices": [{"index": 0, "finish_reason": finish, "message": message}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": min(limit, len(words)),
                      "total_tokens": prompt_tokens + min(limit, len(words))},
        }), content_type="application/json")


def main() -> None:
    from aiohttp import web

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="echo")
    parser.add_argument("--fault", choices=["http500", "drop", "stall"])
    parser.add_argument("--fault-every", type=int, default=1)
    parser.add_argument("--reject-fields", default="")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--reasoning", action="store_true")
    args = parser.parse_args()
    server = EchoServer(args.model, args.fault, args.fault_every, {f for f in args.reject_fields.split(",") if f},
                        args.delay, args.reasoning)
    app = web.Application()
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.chat)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
