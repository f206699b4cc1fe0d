"""The streamed answer's parser (fuelline.serve.stream) on the bytes servers send: events split
anywhere, every line end, comments, transformers' stream without [DONE] and its error events,
tool calls in pieces. In-process, no server (the real HTTP streams: tests/chat/test_regenerate_stalls.py)."""

import orjson
import pytest

from fuelline.serve.stream import EventDecoder, StreamedAnswer, StreamError


def chunk(delta=None, finish=None, index=0, **extra) -> bytes:
    return orjson.dumps({"object": "chat.completion.chunk", "choices": [
        {"index": index, "delta": delta or {}, **({"finish_reason": finish} if finish else {})}], **extra})


def merged(events: list[bytes]) -> dict:
    answer = StreamedAnswer()
    for event in events:
        answer.add(event)
    assert answer.finished
    return answer.body()


def test_events_are_the_same_however_the_bytes_are_split():
    stream = (b": keep-alive\r\n\r\ndata: {\"a\": 1}\r\n\r\nevent: x\ndata: {\"b\":\ndata: 2}\n\n"
              b"data:{\"c\": 3}\r\rdata: [DONE]\n\n")
    expected = [b'{"a": 1}', b'{"b":\n2}', b'{"c": 3}', b"[DONE]"]
    for cut in range(len(stream) + 1):
        for second in range(cut, len(stream) + 1, 7):
            decoder = EventDecoder()
            events = [*decoder.feed(stream[:cut]), *decoder.feed(stream[cut:second]), *decoder.feed(stream[second:]),
                      *decoder.end()]
            assert events == expected, (cut, second)
    decoder = EventDecoder()  # a last event without its empty line
    assert decoder.feed(b'data: {"x": 1}') == [] and decoder.end() == [b'{"x": 1}']


def test_transformers_stream_without_done_merges_into_the_whole_answer():
    """transformers serve: a role chunk, pieces, a last chunk with finish reason and usage, no [DONE]."""
    events = [chunk({"role": "assistant"}), chunk({"reasoning_content": "think "}), chunk({"reasoning_content": "more"}),
              chunk({"content": "The "}), chunk({"content": "answer."}),
              chunk(finish="stop", usage={"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})]
    assert merged(events) == {"object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "The answer.", "reasoning_content": "think more"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}


def test_tool_calls_in_pieces_are_joined_by_index_and_a_null_content_stays_null():
    events = [chunk({"role": "assistant", "content": None}),
              chunk({"tool_calls": [{"index": 0, "id": "c0", "type": "function",
                                     "function": {"name": "get_time", "arguments": '{"tz": '}}]}),
              chunk({"tool_calls": [{"index": 1, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"name": "get_time", "arguments": '"CET"}'}}]}),
              chunk(finish="tool_calls"), b"[DONE]"]
    message = merged(events)["choices"][0]["message"]
    assert message == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "CET"}'}},
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


def test_a_stream_without_its_end_is_not_finished():
    answer = StreamedAnswer()
    answer.add(chunk({"content": "half an ans"}))
    assert not answer.finished


@pytest.mark.parametrize("event, message", [
    (b'{"error": "CUDA out of memory"}', "streamed an error: CUDA out of memory"),  # transformers serve
    (b'{"object": "error", "message": "overloaded", "code": 503}', "streamed an error: overloaded"),  # vLLM
    (b'{"choices": [{"index": 0, "delta": {"content": 42}}]}', "streamed a int as content"),
    (b'{"choices": [{"index": 0, "del', "streamed an event that is not JSON"),
    (b"[1, 2]", "not a chunk object"),
])
def test_events_that_are_not_chunks_are_named_failures(event, message):
    with pytest.raises(StreamError, match=message) as caught:
        StreamedAnswer().add(event)
    assert caught.value.reason == "bad_answer"
