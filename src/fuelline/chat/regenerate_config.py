"""What a regeneration asks of the servers and which answers it takes: the options (the step's
identity), each record's plan of requests, the test every answer must pass; apart from the async
orchestrator (`fuelline.chat.regenerate`), so why a record was dropped is answered here. Each rule
is told to the user in docs/chat.md (`--regenerate-turns`, `--finish-reasons`); why they hold:

Prompts. A conversation that ends with a user turn gets the answer to it, appended; an eval record
of `chat prepare` (`{"id", "turns": [user contents]}`) becomes the chat record of its user turns,
each answered in order on the answers before it (as DeepSpec regenerates its prompts). A record
with nothing to answer is never sent: it goes to the errors file as `nothing_to_regenerate`, a
final decision like `truncated`.

Which turns. A regenerated tool call cannot be given the old tool result, so `auto` regenerates
only the final assistant turn of a conversation with tool results, and `all` drops such a record
as `tool_results_under_turns_all` (final, in the errors file).

Answers taken. An answer that is not one (empty, a finish reason not taken, a server's "abort"
with partial text, tool-call arguments that are not an object, a think tag where chat prepare
refuses one) is a failure, retried like a dropped connection, so no later turn is conditioned on
it. Reasoning never enters the content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fuelline.chat.reasoning import ReasoningError, split_reasoning
from fuelline.pipeline.options import Options, group, option
from fuelline.records import Drop
from fuelline.serve.client import ClientConfig, Completion

# Recommended sampling of each target family in non-thinking mode (temperature, top_p, top_k, min_p).
PRESETS: dict[str, dict[str, float]] = {
    "qwen3": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0},
    "gemma4": {"temperature": 1.0, "top_p": 0.95, "top_k": 64, "min_p": 0.0},
    "none": {},
}
NOTHING, STALE_TOOL_RESULTS = "nothing_to_regenerate", "tool_results_under_turns_all"  # records never sent
TAKEN_FINISH_REASONS = ("stop", "length")
TOOL_FINISH_REASON = "tool_calls"  # taken as well for a record with tools
TURNS = ("auto", "all", "last")


@dataclass
class RegenerateConfig(Options):
    """The options of `fuelline chat regenerate` and of a pipeline's regenerate step: which model, which
    servers, how it samples, which answers it takes, and (`client`) how requests are sent."""

    model: str = option("", "model name sent with each request (default: the servers file's)")
    servers: list[str] = option(help="HOST:PORT or URL of an OpenAI-compatible server", factory=list,
                                flag="--server", identity=False)
    servers_file: str = option("", "written by `fuelline serve`", existing_file=True, identity=False, reads=True)
    preset: str = option("none", "the target family's recommended sampling (qwen3: temperature 0.7, top-p 0.8, "
                         "top-k 20; gemma4: 1.0, 0.95, 64; none: the server's defaults); explicit values override it",
                         choices=list(PRESETS))
    temperature: float | None = option(None, "sampling temperature (default: the preset's, else the server's)",
                                       min=0)
    top_p: float | None = option(None, "nucleus sampling: keep the smallest set of tokens with this mass", min=0,
                                 max=1)
    top_k: int | None = option(None, "sample among the K most likely tokens (-1: all, as vLLM writes it)", min=-1)
    min_p: float | None = option(None, "drop tokens below this share of the likeliest token's probability",
                                 min=0, max=1)
    max_tokens: int = option(4096, "most tokens generated per answer", min=1)
    thinking: bool | None = option(None, "send chat_template_kwargs {enable_thinking: false} (--no-thinking) or "
                                   "{enable_thinking: true} (--thinking)  [default: neither, the template's own]",
                                   replaces=("disable_thinking", "write thinking = false (--no-thinking) for "
                                             "disable_thinking = true"))
    drop_truncated: bool = option(False, "drop conversations with an answer cut by --max-tokens")
    keep_empty_answers: bool = option(False, "take empty and whitespace-only answers (default: failures, retried, "
                                      "then in OUT.errors)")
    finish_reasons: list[str] = option(help="finish reasons of the answers taken, comma-separated; an answer ending "
                                       "otherwise (abort, ...) is a failure, retried, then in OUT.errors",
                                       factory=lambda: list(TAKEN_FINISH_REASONS), comma_list=True)
    regenerate_turns: str = option("auto", "assistant turns regenerated: all; last (the final one, on the data's own "
                                   "history); auto: last for conversations with tool results (a regenerated tool "
                                   "call cannot be given the old result), all otherwise", choices=list(TURNS),
                                   was="turns")
    store_reasoning: str = option("drop", "reasoning a server returns apart from the answer: drop it, or store it as "
                                  "the turn's reasoning_content (never in the content); what is trained on is pack's "
                                  "and cache build's --reasoning", choices=["drop", "keep"], was="reasoning")
    client: ClientConfig = group(ClientConfig)

    def __post_init__(self):
        super().__post_init__()
        self.finish_reasons = [r.strip() for r in self.finish_reasons if r.strip()]
        if not self.finish_reasons:
            raise ValueError("finish_reasons is empty: no answer would be taken (the default is stop,length)")

    def answer_problem(self, answer: Completion, tools: bool = False) -> tuple[str, str] | None:
        """(reason, detail) when `answer` is not an answer this run takes (see the module doc);
        `tools`: the request carried tools, so a tool call's finish reason is taken too."""
        calls = "".join(f" calling {c['function']['name']}" for c in answer.tool_calls)
        said = f"{answer.server} answered {answer.content[:100]!r}{calls} with finish reason {answer.finish_reason!r}"
        try:
            content, _ = answer_reasoning(answer)
        except ReasoningError as e:
            return e.reason, f"{said}: {e.detail}"
        if not self.keep_empty_answers and not content.strip() and not answer.tool_calls:
            return "empty_answer", said
        taken = [*self.finish_reasons, *([TOOL_FINISH_REASON] if tools else [])]
        if answer.finish_reason not in taken:
            return f"finish_{answer.finish_reason}", f"{said}, not {' or '.join(taken)}"
        return None

    def plan(self, record: dict) -> Plan | Drop:
        """What `record` asks of the servers (see the module doc), or why it asks nothing it can be given."""
        if "conversations" not in record:  # an eval record: every user turn answered, in order
            turns = [t for content in record["turns"] for t in ({"role": "user", "content": content}, MISSING)]
            mode, added = "all", len(record["turns"])
        else:
            turns, added = list(record["conversations"]), 0
            tool_results = any(t["role"] == "tool" for t in turns)
            mode = ("last" if tool_results else "all") if self.regenerate_turns == "auto" else self.regenerate_turns
            if mode == "all" and tool_results:
                return Drop(STALE_TOOL_RESULTS, "the conversation has tool results: --regenerate-turns all would "
                                                "regenerate the calls they answer and keep the old results; use "
                                                "--regenerate-turns last or auto")
            if turns and turns[-1]["role"] == "user":
                turns, added = [*turns, MISSING], 1
        assistant = [i for i, t in enumerate(turns) if t["role"] == "assistant"]
        if not assistant:
            roles = ", ".join(t["role"] for t in turns) or "no turn"
            return Drop(NOTHING, f"no assistant turn and no user turn at the end to answer ({roles})")
        return Plan(turns, assistant if mode == "all" else assistant[-1:], mode, added)

    def sampling(self) -> dict[str, Any]:
        """The request fields: the preset's values, overridden by explicit ones."""
        values = dict(PRESETS[self.preset])
        for name in ("temperature", "top_p", "top_k", "min_p"):
            if getattr(self, name) is not None:
                values[name] = getattr(self, name)
        values["max_tokens"] = self.max_tokens
        if self.thinking is not None:
            values["chat_template_kwargs"] = {"enable_thinking": self.thinking}
        return values


def answer_reasoning(answer: Completion) -> tuple[str, str | None]:
    """(content, reasoning) of an answer: a reasoning the server returned apart, or one inline
    in its content (`fuelline.chat.reasoning`); `ReasoningError` for a tag elsewhere."""
    return split_reasoning(answer.content, answer.reasoning_content, f"the answer of {answer.server}")


MISSING = {"role": "assistant", "content": ""}  # where an answer the data lacks goes


@dataclass(frozen=True)
class Plan:
    """One record's requests: its turns (answers the data lacks in place, empty), the indexes
    regenerated, "all" or "last" as applied, and how many answers were added."""

    turns: list[dict]
    targets: list[int]
    mode: str
    added: int


def resolve_servers(model: str | None, servers: list[str], servers_file: str | None) -> tuple[str, list[str]]:
    """(model name, server URLs) from what was given and, if given, a servers file of `fuelline serve`."""
    urls = list(servers)
    if servers_file:
        from fuelline.serve.launcher import read_servers_file

        file_model, file_urls = read_servers_file(servers_file)
        model, urls = model or file_model, urls + file_urls
    if not model:
        raise ValueError("give the model name the servers serve (--model, or 'model' in a pipeline file), "
                         "or a servers file written by `fuelline serve`")
    return model, urls
