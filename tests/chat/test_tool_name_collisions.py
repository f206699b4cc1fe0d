"""Tool calls whose names (or argument values) are words a template writes anyway, on templates without
generation blocks: a template that does not write the call must refuse the conversation, never train on its
end-of-turn token alone (that teaches the model to stop where it should call); one that writes the call must
supervise it, as transformers does on its twin with `{% generation %}` blocks."""

from __future__ import annotations

import re

import pytest

from fuelline.chat.encode import EncodedChat, encode_chats
from fuelline.chat.templates import ChatTemplate, render
from fuelline.records import Drop

from .test_encode import runs
from .test_tool_template_families import Reference, adapted, assert_encoded_as_the_rule_says
from .tool_conversations import TOOLS, assistant, tool, user
from .tool_template_families import FAMILIES, family_dirs, with_chat_template

# The words and token fragments ChatML, Hermes, Llama 3.1, Mistral and GLM-4-0414 write around a call.
COLLIDING = ["end", "im", "im_end", "start", "im_start", "assistant", "user", "tool", "function", "name",
             "arguments", "parameters", "tool_call", "eot_id", "header", "INST", "TOOL_CALLS", "gMASK", "sop",
             "observation", "system", "e", "s"]
# In the default part, a name from each kind (a word, a token fragment, a single letter); all of them
# in the slow part (the reliability family (t) draws more from each template's own rendering).
EVERY_NAME = [name if name in ("end", "im_end", "tool_call", "e") else pytest.param(name, marks=pytest.mark.slow)
              for name in COLLIDING]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def called(name: str, arguments: dict | None = None) -> list[dict]:
    return [user("What now?"), assistant("", (name, {"city": "Paris"} if arguments is None else arguments)),
            tool("done", name, "call_1"), assistant("It is done.")]


@pytest.fixture(scope="module")
def dirs(qwen_dir, tmp_path_factory):
    return family_dirs(qwen_dir, tmp_path_factory.mktemp("collisions"))


@pytest.mark.parametrize("name", COLLIDING)
def test_a_template_that_ignores_tool_calls_refuses_them_whatever_the_name(name):
    """Plain ChatML writes only contents: `<|im_end|>` alone would be the call turn's supervised text."""
    with pytest.raises(ValueError, match=rf"^turn 1: .*tool_calls\[0\] \({name!r}\)"):
        render(called(name), ChatTemplate("chatml-only", jinja=CHATML))


@pytest.mark.parametrize("name", EVERY_NAME)
def test_glm_4_0414_refuses_tool_calls_it_does_not_read(dirs, name):
    """GLM-4-0414's template reads no `tool_calls` (its calls are `metadata`): a call turn is a bare header."""
    got = encode_chats([{"id": name, "conversations": called(name), "tools": TOOLS}], dirs["glm-4-0414"], "auto",
                       on_error="skip")[0]
    assert isinstance(got, Drop) and got.reason == "unrenderable", got
    assert re.search(rf"^turn 1: .*tool_calls\[0\] \({name!r}\)", got.detail), got.detail


@pytest.mark.parametrize("family", ["hermes", "llama3.1", "mistral", "qwen2.5", "qwen3"])
@pytest.mark.parametrize("name", EVERY_NAME)
def test_templates_that_write_the_call_supervise_it_whatever_the_name(dirs, family, name):
    ref = Reference(FAMILIES[family], dirs[family])
    turns = adapted(ref.family, called(name))
    assert_encoded_as_the_rule_says(ref, {"id": name, "conversations": turns, "tools": TOOLS})
    got = encode_chats([{"id": name, "conversations": turns, "tools": TOOLS}], dirs[family], "auto",
                       on_error="skip")[0]
    if isinstance(got, EncodedChat):  # qwen3 rewrites the call turn once the result follows: refused there
        call = ref.decode(got.input_ids[slice(*runs(got.loss_mask)[0])])
        assert name in call and "Paris" in call, call


@pytest.mark.parametrize("source, name, arguments, missing", [
    # writes the call's syntax but not its name: a tool named after that syntax is not found in it
    ("<tool_call>{{ c.function.arguments | tojson }}</tool_call>", "tool_call", {"city": "Paris"}, "its name"),
    ("<tool_call>{{ c.function.arguments | tojson }}</tool_call>", "im_end", {"city": "Paris"}, "its name"),
    # writes the name but not the arguments: an argument value that is a word of the syntax is not found either
    ("<tool_call>{{ c.function.name }}</tool_call>", "get_weather", {"city": "tool_call"}, "'tool_call'"),
    ("<tool_call>{{ c.function.name }}</tool_call>", "get_weather", {"city": "Paris"}, "'Paris'"),
])
def test_a_call_written_without_its_name_or_arguments_is_refused(source, name, arguments, missing):
    jinja = ("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content }}"
             "{% for c in m.tool_calls if m.tool_calls is defined %}" + source + "{% endfor %}"
             "{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    with pytest.raises(ValueError, match=rf"^turn 1: .*tool_calls\[0\] \({name!r}\): {re.escape(missing)}"):
        render(called(name, arguments), ChatTemplate("partial", jinja=jinja))


@pytest.mark.parametrize("content", ["im", "end", "assistant", "OK"])
def test_a_template_that_drops_assistant_contents_is_refused_whatever_the_content(content):
    """A content found only in the template's own text (`<|im_end|>`, its header, a fixed reply) is not written."""
    jinja = ("{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{% if m.role != 'assistant' %}"
             "{{ m.content }}{% else %}OK{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    with pytest.raises(ValueError, match="^turn 1: "):
        render([user("Say it"), assistant(content)], ChatTemplate("drops", jinja=jinja))


def test_the_call_turn_of_a_served_template_is_supervised_up_to_its_end_of_turn(dirs):
    """The reproducer: a tool named `end` on Hermes' template trains on the whole call, not on `<|im_end|>`."""
    ref = Reference(FAMILIES["hermes"], dirs["hermes"])
    got = encode_chats([{"id": "end", "conversations": called("end"), "tools": TOOLS}], dirs["hermes"], "auto")[0]
    assert [ref.decode(got.input_ids[a:b]) for a, b in runs(got.loss_mask)] == [
        '<tool_call>\n{"name": "end", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>', "It is done.<|im_end|>"]


@pytest.mark.parametrize("family", ["hermes", "llama3.1", "qwen2.5"])
@pytest.mark.parametrize("value", ['"', 'say "hi"', "back\\slash", "\n", "東京 🙂"])
def test_argument_values_the_template_escapes_are_found_escaped(dirs, family, value):
    """`tojson` writes `"` as `\\"`: a value written escaped is written, never refused as transformed."""
    ref = Reference(FAMILIES[family], dirs[family])
    record = {"id": "escaped", "conversations": called("get_weather", {"city": value}), "tools": TOOLS}
    assert isinstance(encode_chats([record], dirs[family], "auto")[0], EncodedChat)
    assert_encoded_as_the_rule_says(ref, record)
