"""A chat record's turns as the messages of an OpenAI chat completion request.

The chat record (`fuelline.formats.chat_record`) and the OpenAI API write tools differently, and
regeneration is the one place that sends records to a server, so the translation is one function
with its own tests: a tool call's arguments become a JSON string (`fuelline.io.tool_arguments`,
so their integers stay exact), each call gets an id (its own, else `call_{turn}_{k}`), and each
tool result the id of the call it answers: its own when it names a call of the assistant turn
before it, else the k-th result after that turn answers its k-th call, as for a regenerated call.
A turn's `reasoning_content` goes back with the history, as chat templates read it.
"""

from __future__ import annotations

from fuelline.io.tool_arguments import to_json as arguments_json


def openai_messages(turns: list[dict]) -> list[dict]:
    """`turns` as OpenAI chat messages (see the module doc). A tool result answers the call of the
    assistant turn before it that its own id names, else the call at its position: a regenerated
    call's id is never the one an old result names."""
    messages: list[dict] = []
    calls: list[tuple[str, str]] = []  # (id, name) of the last assistant turn's calls
    answered = 0  # tool results since that turn
    for i, turn in enumerate(turns):
        message = {"role": turn["role"], "content": turn["content"]}
        if turn["role"] == "assistant":
            made = turn.get("tool_calls", [])
            calls, answered = [(c.get("id") or f"call_{i}_{k}", c["function"]["name"]) for k, c in enumerate(made)], 0
            if made:
                message["tool_calls"] = [{"id": call_id, "type": "function", "function": {
                    "name": name, "arguments": arguments_json(c["function"]["arguments"])}}
                    for (call_id, name), c in zip(calls, made)]
            if "reasoning_content" in turn:  # under the field's older name and vLLM's newer one
                message["reasoning_content"] = message["reasoning"] = turn["reasoning_content"]
        elif turn["role"] == "tool":
            own = turn.get("tool_call_id")
            ids = dict(calls)
            call_id, name = (own, ids[own]) if own in ids else calls[answered] if answered < len(calls) else (own, None)
            answered += 1
            if call_id:
                message["tool_call_id"] = call_id
            if turn.get("name") or name:
                message["name"] = turn.get("name") or name
        messages.append(message)
    return messages
