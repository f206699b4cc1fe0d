"""An asyncio client for many OpenAI-compatible servers: least-loaded routing, retries, failover.

A request goes to the healthy server with the fewest requests in flight (at most `concurrency`
each). One that fails (connection refused or dropped, HTTP 429 or 5xx, a stall, an answer the
caller refuses) is retried with exponential backoff, on another server when there is one, up to
`attempts` times; other 4xx answers are final. After `failures_to_rest` failures in a row a
server rests: it leaves the rotation and is probed (`GET /v1/models`) with growing pauses until
it answers. If no server has been healthy for `all_down_timeout` seconds, the run stops.

Servers do not all take the same sampling fields: `transformers serve` answers 422 "Unexpected
fields in the request: {'top_k', 'min_p'}" where SGLang and vLLM take them. Such fields are left
out for that server from then on (said once, and recorded in the summary) and the request is
sent again at once. `tools` never are: an answer made without them would be another answer.

Answers are streamed (`fuelline.serve.stream`), so a stalled server is told from a long answer;
the stall, the one-token check of every server before the run, the fallback to whole answers and
the notes on a silent server are told in docs/chat.md (`--stall-timeout`, `--request-timeout`). A
stalled server rests until it answers a one-token completion, not only `/v1/models`; a server is
named silent after 10 s (or half the stall timeout), again at 20, 40, 80 s, ...

An answer is its content (null counts as "" when the answer is tool calls), its tool calls in
the chat record's form, arguments parsed by `fuelline.io.tool_arguments` (integers exact; refused
arguments fail the request under their reason, retried like any failure), and the reasoning a
reasoning parser returns apart (`reasoning_content`, or `reasoning` as vLLM names it since late
2025), never mixed into the content.
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from fuelline.io import json_exact
from fuelline.io.tool_arguments import ArgumentsError, parse_arguments
from fuelline.pipeline.options import Options, option
from fuelline.serve.stream import EventDecoder, StreamedAnswer, StreamError

RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
UNEXPECTED_FIELDS = re.compile(r"[Uu]nexpected fields?[^{\[]*[{\[]([^}\]]*)[}\]]")


class NoServerError(RuntimeError):
    """No server can take requests."""


class RequestFailed(Exception):
    """A request that failed for good; `reason` is short and stable (for counting), `detail` says more."""

    def __init__(self, reason: str, detail: str, attempts: int):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.attempts = reason, detail, attempts


class _Retryable(Exception):
    def __init__(self, reason: str, detail: str, server_down: bool = False, stalled: bool = False):
        super().__init__(detail)
        self.reason, self.detail, self.server_down, self.stalled = reason, detail, server_down or stalled, stalled


@dataclass
class Completion:
    content: str
    finish_reason: str  # "unknown" when the server gave none
    completion_tokens: int | None  # None when the server's usage gave no count
    server: str
    tool_calls: list[dict] = field(default_factory=list)  # [{"type": "function", "function": {name, arguments}}]
    reasoning_content: str | None = None  # returned apart by a reasoning parser; None when none or empty


@dataclass
class Server:
    url: str
    limit: int
    in_flight: int = 0
    healthy: bool = True
    failures_in_a_row: int = 0
    rests: int = 0
    left_out: set[str] = field(default_factory=set)  # sampling fields this server refuses
    counts: dict[str, int] = field(default_factory=lambda: {"requests": 0, "failed": 0, "tokens": 0, "stalls": 0})
    streams: bool | None = None  # None until its first answer says
    usage_option: bool = True  # takes stream_options {include_usage} (transformers serve refuses it, 422)
    stalled: bool = False  # rests after a stall: back only when it answers a completion
    probing: int = 0  # one-token completions in flight (the check, a resting server's probe)
    heard: float = 0.0  # monotonic time of its last byte, or of the first request of a silence
    notes: int = 0  # silence notes said since it was last heard


@dataclass
class ClientConfig(Options):
    """How requests are sent and retried; none of it changes the answers, so none is part of a step's identity."""

    concurrency: int = option(64, "requests in flight per server", identity=False, min=1)
    request_timeout: float = option(600.0, "seconds per whole answer of a server that does not stream (a streamed "
                                    "answer has no time limit: see --stall-timeout)", identity=False, min=0.1)
    stall_timeout: float = option(60.0, "seconds without a byte of a streamed answer (before its first or between two) "
                                  "after which the request is a stall: retried, its server rested until it answers "
                                  "a one-token completion", identity=False, min=0.1)
    attempts: int = option(5, "tries per request before it fails for good", identity=False, min=1)
    all_down_timeout: float = option(300.0, "seconds without any server answering before the run stops with an "
                                     "error", identity=False, min=0.1)
    backoff: float = option(0.5, "seconds before the first retry, doubled each time, at most backoff_max",
                            identity=False, user=False)
    backoff_max: float = option(30.0, "longest wait between retries", identity=False, user=False)
    failures_to_rest: int = option(3, "failures in a row that rest a server", identity=False, user=False)
    probe_interval: float = option(2.0, "seconds between probes of a resting server", identity=False, user=False)


def parse_server(address: str) -> str:
    """`HOST:PORT` or a URL → the base URL (`http://HOST:PORT`)."""
    address = address.strip().rstrip("/")
    if not address:
        raise ValueError("empty server address")
    if "://" not in address:
        address = f"http://{address}"
    return address[:-3] if address.endswith("/v1") else address


class ServerPool:
    """The servers of one run, their load and health; used from one asyncio event loop."""

    def __init__(self, urls: list[str], config: ClientConfig, warn=print):
        if not urls:
            raise NoServerError("no server given: pass --server HOST:PORT (repeatable) or --servers-file")
        self.config, self.warn = config, warn
        self.servers = [Server(parse_server(u), config.concurrency) for u in urls]
        self._change: asyncio.Future | None = None  # resolved, and replaced, at each change
        self._session = None
        self._probes: set[asyncio.Task] = set()
        self._down_since: float | None = None
        self.retries = 0  # attempts after a request's first
        self.finish_reasons: dict[str, int] = {}  # of every answer received, taken or not
        self.tokens_unknown = 0  # answers whose usage gave no token count
        self._noted: set[tuple[str, str]] = set()
        self.model = ""  # the one `check` was given, for the one-token probes
        self._watcher: asyncio.Task | None = None

    async def __aenter__(self):
        import aiohttp

        self._change = asyncio.get_running_loop().create_future()
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(connector=connector, json_serialize=lambda o: json_exact.dumps(o).decode())
        self._watcher = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc):
        for task in [*self._probes, self._watcher]:
            task.cancel()
        await self._session.close()

    async def _watch(self) -> None:
        """Name each server that has been silent while requests wait on it (see the module doc)."""
        first = min(10.0, self.config.stall_timeout / 2)
        while True:
            await asyncio.sleep(min(1.0, first / 4))
            now = time.monotonic()
            for server in self.servers:
                waiting = server.in_flight + server.probing
                silence = now - server.heard
                if not waiting or silence < first:
                    server.notes = 0
                elif silence >= first * 2 ** server.notes:
                    server.notes += 1
                    limit = (f"it answers whole, not streamed, so a stalled answer ends only at --request-timeout "
                             f"{self.config.request_timeout:g} s" if server.streams is False
                             else f"a stall at --stall-timeout {self.config.stall_timeout:g} s")
                    self.warn(f"waiting: {server.url} has sent nothing for {silence:.0f} s ({waiting} request(s) in "
                              f"flight{'' if server.in_flight else ': checking it answers a one-token completion'}"
                              f"); {limit}")

    async def models(self, server: Server, timeout: float = 10.0) -> list[str] | None:
        """The model ids a server lists, or None when it does not answer."""
        import aiohttp

        try:
            async with self._session.get(f"{server.url}/v1/models", timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                if r.status != 200:
                    return None
                data = orjson.loads(await r.read())
                return [m.get("id") for m in data.get("data", []) if isinstance(m, dict)]
        except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError, AttributeError):
            return None

    async def check(self, model: str) -> None:
        """Ask every server for its models, then for a one-token completion, in parallel; leave out
        those that answer neither (see the module doc)."""
        self.model = model
        answers = await asyncio.gather(*(self.models(s) for s in self.servers))
        for server, models in zip(self.servers, answers):
            if models is None:
                self.warn(f"warning: {server.url} does not answer GET /v1/models; it is left out")
                server.healthy = False
            elif model not in models:
                self.warn(f"note: {server.url} lists {', '.join(map(str, models)) or 'no model'}, not {model!r}; "
                          "trying it anyway (some servers load models on demand)")
        listing = [s for s in self.servers if s.healthy]
        stalled = []
        for server, answered in zip(listing, await asyncio.gather(*(self._answers(s) for s in listing))):
            if not answered:
                self.warn(f"warning: {server.url} lists its models but answered no one-token completion within "
                          f"--stall-timeout {self.config.stall_timeout:g} s; it is left out")
                server.healthy = False
                stalled.append(server.url)
        if not any(s.healthy for s in self.servers):
            why = (f"; {', '.join(stalled)} list(s) the model but answered no one-token completion within "
                   f"--stall-timeout {self.config.stall_timeout:g} s" if stalled else "")
            raise NoServerError(f"none of the {len(self.servers)} server(s) answers: "
                                f"{', '.join(s.url for s in self.servers)}{why}")
        self.servers = [s for s in self.servers if s.healthy]

    async def _answers(self, server: Server) -> bool:
        """Whether `server` answers a one-token completion (anything, an error too) within the stall
        timeout; what comes back says whether it streams."""
        import aiohttp

        server.probing += 1
        if server.in_flight + server.probing == 1:
            server.heard = time.monotonic()
        body = {"model": self.model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                "stream": server.streams is not False}
        stall = self.config.stall_timeout
        try:
            async with self._session.post(f"{server.url}/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(
                    sock_connect=stall, sock_read=stall)) as r:
                raw = b""
                async for data in r.content.iter_any():
                    server.heard = time.monotonic()
                    raw += data
                if server.streams is None:
                    self._learn_streaming(server, r.status, r.content_type, raw)
            return True
        except asyncio.TimeoutError:
            return False
        except aiohttp.ClientError:
            return True  # it answers, if only by closing: the requests will say more
        finally:
            server.probing -= 1

    def _learn_streaming(self, server: Server, status: int, content_type: str, raw: bytes) -> None:
        """What an answer to a streamed request says of the server: it streams, answers whole, or refuses."""
        if status == 200 and content_type == "text/event-stream":
            server.streams = True
        elif status == 200 and raw.lstrip().startswith(b"{") and b'"choices"' in raw:
            self._whole(server, "answers a streamed request whole")
        elif status in (400, 422) and b"stream" in raw.lower() and not _refused_fields(status, raw.decode(
                "utf-8", errors="replace")):
            self._whole(server, f"refuses to stream ({status}: {raw[:200].decode('utf-8', errors='replace')})")

    def _whole(self, server: Server, why: str) -> None:
        """From now on `server` gets whole-answer requests."""
        server.streams = False
        self.warn(f"note: {server.url} {why}; it gets whole-answer requests, and a stalled one is found only "
                  f"after --request-timeout {self.config.request_timeout:g} s")

    async def _acquire(self, avoid: set[str]) -> Server:
        """The least-loaded healthy server with room, preferring those not in `avoid`.

        No lock: the pool lives on one event loop and nothing here awaits between looking at the
        servers and taking one. The wait is on a shared future, through `asyncio.wait`, which never
        cancels what it waits on: Python 3.11's `wait_for(Condition.wait())` left a cancelled
        waiter's lock re-taken by an orphaned task, so a run whose servers were all down hung.
        """
        while True:
            free = [s for s in self.servers if s.healthy and s.in_flight < s.limit]
            if free:
                self._down_since = None
                preferred = [s for s in free if s.url not in avoid] or free
                server = min(preferred, key=lambda s: s.in_flight / s.limit)
                if not server.in_flight + server.probing:  # a silence starts now, not at its last answer
                    server.heard = time.monotonic()
                server.in_flight += 1
                return server
            pause = self.config.probe_interval
            if not any(s.healthy for s in self.servers):
                self._down_since = self._down_since or time.monotonic()
                waited = time.monotonic() - self._down_since
                if waited >= self.config.all_down_timeout:
                    raise NoServerError(f"no server has answered for {waited:.0f} s: "
                                        f"{', '.join(s.url for s in self.servers)}")
                pause = min(pause, self.config.all_down_timeout - waited)  # the deadline is kept to the second
            await asyncio.wait([self._change], timeout=pause)

    def _changed(self) -> None:
        """Wake every request waiting for a server: one has room again, or came back."""
        self._change.set_result(None)
        self._change = asyncio.get_running_loop().create_future()

    def _rest(self, server: Server, failure: _Retryable) -> None:
        """Take a failing server out of rotation; probe it until it answers again."""
        server.stalled = server.stalled or failure.stalled
        if not server.healthy:
            return
        server.healthy = False
        server.rests += 1
        why = failure.detail if failure.stalled else f"{server.url} failed {server.failures_in_a_row} times in a row"
        self.warn(f"warning: {why}; resting it" + (" until it answers a one-token completion" if server.stalled else ""))
        task = asyncio.create_task(self._probe(server))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, server: Server) -> None:
        pause = self.config.probe_interval
        while await self.models(server) is None or (server.stalled and not await self._answers(server)):
            await asyncio.sleep(pause)
            pause = min(pause * 2, self.config.backoff_max)
        server.healthy, server.failures_in_a_row, server.stalled = True, 0, False
        self._changed()
        self.warn(f"note: {server.url} answers again; back in rotation")

    async def complete(self, model: str, messages: list[dict], sampling: dict[str, Any],
                       check: Callable[[Completion], tuple[str, str] | None] | None = None,
                       tools: list[dict] | None = None) -> Completion:
        """One chat completion, retried and failed over as the module doc says. `check` says why an
        answer is not one the caller takes ((reason, detail), e.g. empty): it is retried as a failure.
        `tools`: the function schemas the model may call (OpenAI's `tools` field)."""
        tried: set[str] = set()
        last: _Retryable | None = None
        for attempt in range(1, self.config.attempts + 1):
            server = await self._acquire(tried)
            try:
                completion = await self._send(server, model, messages, sampling, tools)
                if check is not None and (problem := check(completion)) is not None:
                    raise _Retryable(*problem)
            except _Retryable as e:
                last = e
                server.counts["failed"] += 1
                server.failures_in_a_row += 1
                server.counts["stalls"] += e.stalled
                tried.add(server.url)
                if e.server_down or server.failures_in_a_row >= self.config.failures_to_rest:
                    self._rest(server, e)
            else:
                server.failures_in_a_row = 0
                return completion
            finally:
                server.in_flight -= 1
                self._changed()
            if attempt < self.config.attempts:
                self.retries += 1
                await asyncio.sleep(min(self.config.backoff * 2 ** (attempt - 1), self.config.backoff_max))
        raise RequestFailed(last.reason, f"{last.detail} (after {self.config.attempts} attempts)", self.config.attempts)

    def _parse(self, raw: bytes, server: Server, answer: dict | None = None) -> Completion:
        """The answer (see the module doc), from the body `raw` or, streamed, the body `answer` merged
        from its events (`raw` its first event, for messages). A body without a text content or tool
        calls fails the request; a server's bookkeeping never does: a `usage` without a token count
        counts as unknown, and extra choices are ignored, each said once."""
        try:
            answer = json_exact.loads(raw) if answer is None else answer  # arguments sent as an object keep their integers
            choices = answer["choices"]
            choice = choices[0]
            message = choice["message"]
            content = message.get("content")
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise _Retryable("bad_answer", f"{server.url} answered 200 without a chat completion "
                                           f"({type(e).__name__}: {e}): {raw[:200]!r}") from None
        finish = choice.get("finish_reason")
        finish = finish if isinstance(finish, str) and finish else "unknown"
        self.finish_reasons[finish] = self.finish_reasons.get(finish, 0) + 1
        tool_calls = _tool_calls(message.get("tool_calls"), server.url)
        if content is None and tool_calls:
            content = ""
        if content is None:
            raise _Retryable("no_content", f"{server.url} answered without content (finish reason {finish!r})")
        if not isinstance(content, str):
            raise _Retryable("bad_answer", f"{server.url} answered a {type(content).__name__} as content: "
                                           f"{raw[:200]!r}")
        if len(choices) > 1:
            self._note(server, "choices", f"{server.url} answered {len(choices)} choices; the first is taken")
        usage = answer.get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
            server.counts["tokens"] += tokens
        else:
            self._note(server, "usage", f"{server.url} answered usage.completion_tokens {tokens!r}, not a count; "
                                        "such answers count as unknown in the token totals")
            self.tokens_unknown += 1
            tokens = None
        reasoning = next((r for r in (message.get("reasoning_content"), message.get("reasoning"))
                          if isinstance(r, str) and r), None)
        return Completion(content, finish, tokens, server.url, tool_calls, reasoning)

    def _note(self, server: Server, kind: str, message: str) -> None:
        """A warning said once per server and kind."""
        if (server.url, kind) not in self._noted:
            self._noted.add((server.url, kind))
            self.warn(f"warning: {message}")

    async def _send(self, server: Server, model: str, messages: list[dict], sampling: dict[str, Any],
                    tools: list[dict] | None) -> Completion:
        import aiohttp

        while True:  # at most once more per field the server refuses, and once if it refuses to stream
            streamed = server.streams is not False
            usage = {"stream_options": {"include_usage": True}} if streamed and server.usage_option else {}
            body = {"model": model, "messages": messages, "stream": streamed, **({"tools": tools} if tools else {}),
                    **usage, **{k: v for k, v in sampling.items() if k not in server.left_out}}
            server.counts["requests"] += 1
            stall = self.config.stall_timeout
            timeout = (aiohttp.ClientTimeout(sock_connect=stall, sock_read=stall) if streamed
                       else aiohttp.ClientTimeout(total=self.config.request_timeout))
            try:
                async with self._session.post(f"{server.url}/v1/chat/completions", json=body, timeout=timeout) as r:
                    status = r.status
                    if status == 200 and streamed and r.content_type == "text/event-stream":
                        server.streams = True
                        return await self._read_stream(server, r)
                    raw = await r.read()
                    server.heard = time.monotonic()
            except asyncio.TimeoutError:
                if streamed:
                    raise _Retryable("stall", f"{server.url} sent nothing for {stall:g} s (--stall-timeout)",
                                     stalled=True) from None
                raise _Retryable("timeout", f"{server.url} gave no answer within {self.config.request_timeout:g} s",
                                 stalled=True) from None
            except aiohttp.ClientConnectorError as e:
                raise _Retryable("connection_refused", f"{server.url}: {e}", server_down=True)
            except aiohttp.ClientError as e:  # dropped connection, bad framing, …
                raise _Retryable("connection_error", f"{server.url}: {type(e).__name__}: {e}")
            if status == 200:
                completion = self._parse(raw, server)
                if streamed and server.streams is None:
                    self._whole(server, "answers a streamed request whole")
                return completion
            text = raw[:500].decode("utf-8", errors="replace")
            refused = _refused_fields(status, text) & {*sampling, *usage} & set(body)  # those this request carried
            if usage.keys() & refused:  # it counts the tokens in its last chunk, or not at all
                server.usage_option = False
            if refused - usage.keys() and not refused - usage.keys() <= server.left_out:  # others may have learned it
                server.left_out |= refused - usage.keys()
                self.warn(f"note: {server.url} does not take {', '.join(sorted(refused - usage.keys()))}; sending "
                          "without them")
            if refused:
                continue
            if streamed and server.streams is None:
                self._learn_streaming(server, status, "", raw)
                if server.streams is False:
                    continue
            if status in RETRYABLE_STATUS:
                raise _Retryable(f"http_{status}", f"{server.url} answered {status}: {text}")
            raise RequestFailed(f"http_{status}", f"{server.url} answered {status}: {text}", 1)

    async def _read_stream(self, server: Server, response) -> Completion:
        """The answer of a streamed response (`fuelline.serve.stream`), read to its end."""
        decoder, answer = EventDecoder(), StreamedAnswer()
        try:
            async for data in response.content.iter_any():
                server.heard = time.monotonic()
                for event in decoder.feed(data):
                    answer.add(event)
                if answer.done:
                    break
            for event in decoder.end():
                answer.add(event)
        except StreamError as e:
            raise _Retryable(e.reason, f"{server.url} {e.detail}") from None
        if not answer.finished:
            raise _Retryable("stream_cut", f"{server.url} ended its stream before the answer's end (no finish reason, "
                                           f"no [DONE]): {answer.first!r}")
        return self._parse(answer.first, server, answer.body())


def _tool_calls(calls: Any, url: str) -> list[dict]:
    """A message's `tool_calls` in the chat record's form, arguments parsed (see the module doc)."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise _Retryable("bad_answer", f"{url} answered tool_calls as a {type(calls).__name__}, not a list")
    parsed = []
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise _Retryable("bad_answer", f"{url} answered tool call {k} without a function name: {str(call)[:200]}")
        try:  # the wire form is a JSON string; a few servers send the object itself
            arguments = parse_arguments(function.get("arguments"), f"{url} answered tool call {k} ({name})")
        except ArgumentsError as e:
            raise _Retryable(e.reason, e.detail) from None
        parsed.append({"type": "function", "function": {"name": name, "arguments": arguments}})
    return parsed


def _refused_fields(status: int, text: str) -> set[str]:
    if status not in (400, 422):
        return set()
    match = UNEXPECTED_FIELDS.search(text)
    return {f.strip(" '\"") for f in match.group(1).split(",") if f.strip(" '\"")} if match else set()
