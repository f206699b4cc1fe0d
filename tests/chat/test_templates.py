"""Chat templates render exactly the text of each format and the exact character spans to train on.

The expected strings are written out by hand from each format's rules, not produced by the code
under test; the spans are checked as text (`content + end of turn` for each assistant turn).
"""

import dataclasses

import pytest

from fuelline.chat.templates import ChatTemplate, get_template, load_templates, register_template, render
from fuelline.formats.chat_record import ChatRecordError

SYSTEM = {"role": "system", "content": "Be brief."}
CHAT = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]

CHATML_JINJA = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_GENERATION_JINJA = """{% for m in messages %}
{{- '<|im_start|>' + m['role'] + '\\n' }}
{%- if m['role'] == 'assistant' %}
{%- generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}
{%- else %}
{{- m['content'] + '<|im_end|>' }}
{%- endif %}
{{- '\\n' }}
{%- endfor %}"""


def supervised_text(rendering) -> list[str]:
    return [rendering.text[start:end] for start, end in rendering.spans]


def test_chatml_golden_with_and_without_system():
    r = render(CHAT, "chatml")
    assert r.text == ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                      "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n")
    assert supervised_text(r) == ["Hello!<|im_end|>", "4<|im_end|>"]
    assert r.spans[0] == (52, 68) and r.turn_ends == (30, 69, 101, 135)  # the module docstring's example
    assert r.text[:r.turn_ends[1]] == render(CHAT[:2], "chatml").text

    r = render([SYSTEM, *CHAT[:2]], "qwen", add_generation_prompt=True)
    assert r.text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                      "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>assistant\n")
    assert supervised_text(r) == ["Hello!<|im_end|>"]


def test_qwen3_renders_the_empty_think_block_on_the_final_answer_only():
    r = render([SYSTEM, *CHAT], "qwen3")
    assert r.text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                      "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                      "<|im_start|>user\n2+2?<|im_end|>\n"
                      "<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n")
    assert supervised_text(r) == ["Hello!<|im_end|>", "4<|im_end|>"]

    # ending on a user turn: no assistant turn is last, so no think block; the prompt has it
    r = render(CHAT[:3], "qwen3", add_generation_prompt=True)
    assert r.text == ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                      "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # two assistant turns after the last user turn: only the last message gets the block, as in Qwen3's Jinja
    r = render([*CHAT[:2], {"role": "assistant", "content": "More?"}], "qwen3")
    assert r.text.endswith("Hello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nMore?<|im_end|>\n")
    assert supervised_text(r) == ["Hello!<|im_end|>", "More?<|im_end|>"]


def test_llama3_golden():
    r = render([SYSTEM, *CHAT[:2]], "llama3")
    assert r.text == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>")
    assert supervised_text(r) == ["Hello!<|eot_id|>"]
    assert render(CHAT, "llama3").text.count("<|begin_of_text|>") == 1


def test_gemma4_golden_with_the_non_thinking_prefix_outside_the_spans():
    r = render([SYSTEM, *CHAT], "gemma4")
    assert r.text == ("<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n"
                      "<|turn>user\n2+2?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>4<turn|>\n")
    assert supervised_text(r) == ["Hello!<turn|>", "4<turn|>"]
    prompt = render(CHAT[:1], "gemma4", add_generation_prompt=True).text
    assert prompt == "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"


def test_default_system_prompt_and_prefix_on_every_turn():
    template = ChatTemplate("t", system_header="S:", user_header="U:", assistant_header="A:", end_of_turn="|",
                            after_turn="\n", default_system="sys", assistant_prefix="~")
    r = render(CHAT, template)
    assert r.text == "S:sys|\nU:Hi|\nA:~Hello!|\nU:2+2?|\nA:~4|\n"
    assert supervised_text(r) == ["Hello!|", "4|"]
    assert render([SYSTEM, *CHAT[:2]], template).text == "S:Be brief.|\nU:Hi|\nA:~Hello!|\n"


def test_spans_are_exact_for_cjk_emoji_and_empty_contents():
    chat = [{"role": "user", "content": "👨‍👩‍👧 你好"}, {"role": "assistant", "content": "世界🙂\n"},
            {"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
    for name in ("chatml", "qwen3", "llama3", "gemma4"):
        template = get_template(name)
        assert supervised_text(render(chat, name)) == [c["content"] + template.end_of_turn for c in chat[1::2]]


def test_jinja_template_spans_equal_the_named_templates():
    named = render([SYSTEM, *CHAT], "chatml")
    for source in (CHATML_JINJA, CHATML_GENERATION_JINJA):
        r = render([SYSTEM, *CHAT], ChatTemplate("mine", jinja=source))
        assert (r.text, r.spans) == (named.text, named.spans)
    prompt = render(CHAT[:1], ChatTemplate("mine", jinja=CHATML_JINJA), add_generation_prompt=True)
    assert prompt.text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_jinja_content_search_starts_after_the_previous_content():
    chat = [{"role": "user", "content": "Say OK"}, {"role": "assistant", "content": "OK"}]
    r = render(chat, ChatTemplate("mine", jinja=CHATML_JINJA))
    assert r.spans == ((r.text.index("assistant\nOK") + len("assistant\n"), len(r.text) - 1),)
    assert supervised_text(r) == ["OK<|im_end|>"]


def test_generation_blocks_give_the_spans_even_when_contents_are_rewritten():
    source = ("{% for m in messages %}{{ m['role'] }}: {% if m['role'] == 'assistant' %}{% generation %}"
              "{{ m['content'] | upper }}</s>{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}{{ '\\n' }}"
              "{% endfor %}")
    r = render(CHAT[:2], ChatTemplate("upper", jinja=source))
    assert r.text == "user: Hi\nassistant: HELLO!</s>\n"
    assert supervised_text(r) == ["HELLO!</s>"]


def test_jinja_template_that_rewrites_assistant_contents_is_refused():
    source = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] | upper }}\n{% endfor %}"
    with pytest.raises(ValueError, match="turn 1: the Jinja chat template of 'shout' does not render this "
                                         "assistant content verbatim.*generation"):
        render(CHAT[:2], ChatTemplate("shout", jinja=source))


def test_jinja_errors_are_value_errors():
    with pytest.raises(ValueError, match="not valid Jinja: line 1"):
        render(CHAT, ChatTemplate("bad", jinja="{% for m in messages %}"))
    with pytest.raises(ValueError, match="'strict' failed: no system turn"):
        render(CHAT, ChatTemplate("strict", jinja="{{ raise_exception('no system turn') }}"))
    with pytest.raises(ValueError, match="turn 1: content holds U\\+FDD0"):
        render([CHAT[0], {"role": "assistant", "content": "a\ufdd0b"}], ChatTemplate("j", jinja=CHATML_JINJA))
    with pytest.raises(ValueError, match="renders with a tokenizer's own Jinja template"):
        render(CHAT, "auto")


def test_registry_names_aliases_and_conflicts():
    assert get_template("qwen") is get_template("chatml")
    with pytest.raises(ValueError, match="unknown chat template 'chatlm'; known: auto, chatml, gemma4, llama3, qwen, "):
        get_template("chatlm")
    mine = ChatTemplate("test-registry", user_header="Q: ", assistant_header="A: ", after_turn="\n")
    register_template(mine, "test-registry-alias")
    register_template(mine)  # the same template again is fine
    assert get_template("test-registry-alias") is mine
    with pytest.raises(ValueError, match="already registered as 'chatml'"):
        register_template(dataclasses.replace(mine, name="chatml"))
    with pytest.raises(ValueError, match="assistant_prefix_on must be one of all, last, not 'first'"):
        ChatTemplate("x", assistant_prefix_on="first")


def test_toml_templates_load_and_render(tmp_path):
    path = tmp_path / "templates.toml"
    path.write_text('[test-toml]\nuser_header = "### User:\\n"\nassistant_header = "### Assistant:\\n"\n'
                    'end_of_turn = "</s>"\nafter_turn = "\\n\\n"\ndefault_system = "You help."\n'
                    'system_header = "### System:\\n"\n', encoding="utf-8")
    (template,) = load_templates(path)
    assert template.name == "test-toml" and get_template("test-toml") == template
    r = render(CHAT[:2], "test-toml")
    assert r.text == "### System:\nYou help.</s>\n\n### User:\nHi</s>\n\n### Assistant:\nHello!</s>\n\n"
    assert supervised_text(r) == ["Hello!</s>"]
    assert get_template(str(path)) == get_template(f"{path}:test-toml") == template  # as the CLI names it


def test_a_toml_file_of_several_templates_needs_a_name(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text('[first]\nuser_header = "U:"\n\n[second]\nuser_header = "V:"\n', encoding="utf-8")
    with pytest.raises(ValueError, match="holds 2 templates .*name one as .*two.toml:NAME"):
        get_template(str(path))
    assert get_template(f"{path}:second").user_header == "V:"


@pytest.mark.parametrize("text, message", [
    ('[t1]\nuser_heder = "U"\n', "[t1]: unknown key 'user_heder'; expected some of system_header, user_header"),
    ('[t2]\nend_of_turn = 3\n', "[t2]: end_of_turn must be a string, found int 3"),
    ('[t3]\nname = "other"\n', "[t3]: unknown key 'name'"),
    ('[t4]\nassistant_prefix_on = "some"\n', "[t4]: chat template 't4': assistant_prefix_on must be one of"),
    ('t5 = "chatml"\n', ": 't5' must be a table of template fields, found str"),
    ('[t6\n', ": not valid TOML"),
])
def test_bad_toml_names_file_table_and_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as error:
        load_templates(path)
    assert str(error.value).startswith(f"{path}") and message in str(error.value)


@pytest.mark.parametrize("conversation, reason, message", [
    ([{"role": "user", "content": "a"}, {"role": "gpt", "content": "b"}], "unknown_role",
     "turn 1: role 'gpt' is not one of system, user, assistant"),
    ([{"role": "user", "content": 3}], "wrong_type", "turn 0: content must be a string, found int"),
    ([{"role": "user"}], "wrong_type", "turn 0: content must be a string, found NoneType"),
    ([("user", "a")], "wrong_type", "turn 0: expected an object with role and content, found tuple"),
    ([], "empty_conversation", "the conversation has no turn"),
    ({"messages": []}, "not_a_chat_record", "a chat record needs a 'conversations' list"),
])
def test_bad_turns_are_named(conversation, reason, message):
    """The record contract's error, under its reason, whatever the template."""
    with pytest.raises(ChatRecordError, match=message) as error:
        render(conversation, "chatml")
    assert error.value.reason == reason and str(error.value).endswith(f"({reason})")


def test_a_chat_record_is_accepted():
    assert render({"id": "x", "conversations": CHAT}, "chatml") == render(CHAT, "chatml")


# Issue 25: a content located by a text search was found inside the next header ("assistant"
# holds "a", "<|im_start|>" holds "|>", "m" and "t"), so the header token was supervised.
@pytest.mark.parametrize("answer", ["a", "|>", "m", "t", "assistant", "<|im_start|>", "\n", ""])
def test_a_content_that_occurs_in_a_header_is_located_where_it_is_rendered(answer):
    from fuelline.models import QWEN3_CHAT_TEMPLATE

    chat = [{"role": "user", "content": "Pick a letter"}, {"role": "assistant", "content": answer},
            {"role": "user", "content": "im_end"}, {"role": "assistant", "content": answer}]
    for source in (CHATML_JINJA, QWEN3_CHAT_TEMPLATE):
        if source is QWEN3_CHAT_TEMPLATE and answer == "\n":
            continue  # the final answer is stripped of leading newlines there: refused, see below
        r = render(chat, ChatTemplate("q", jinja=source))
        assert supervised_text(r) == [answer + "<|im_end|>"] * 2
        before = "<|im_start|>assistant\n<think>\n\n</think>\n\n" if source is QWEN3_CHAT_TEMPLATE else \
                 "<|im_start|>assistant\n"
        assert r.text[:r.spans[1][0]].endswith(before)
    named = render([SYSTEM, *chat], "chatml")
    assert render([SYSTEM, *chat], ChatTemplate("q", jinja=CHATML_JINJA)).spans == named.spans


@pytest.mark.parametrize("answer, problem", [
    ("\nstarts on a newline", "transforms this assistant content"),
    ("\n", "transforms this assistant content"),
    ("Because <think>x</think>so", "does not render this assistant content verbatim"),
])
def test_qwen3_jinja_contents_it_rewrites(answer, problem):
    """One exchange is rendered turn by turn: the turn is what the template writes after the generation prompt
    and the empty think block, rewritten or not. Where earlier turns change once later ones follow (the think block), marks locate the
    contents, and refuse those the template rewrites, naming template and turn."""
    from fuelline.models import QWEN3_CHAT_TEMPLATE

    chat = [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": answer}]
    if "</think>" in answer:  # the template takes the text before </think> as reasoning: not the content it was
        with pytest.raises(ValueError, match=f"^turn 1: the Jinja chat template of 'q' {problem}"):
            render(chat, ChatTemplate("q", jinja=QWEN3_CHAT_TEMPLATE))
    else:
        assert supervised_text(render(chat, ChatTemplate("q", jinja=QWEN3_CHAT_TEMPLATE))) == \
            [answer.lstrip("\n") + "<|im_end|>"]  # after the empty think block, as the named qwen3
    # an earlier answer keeps its leading newlines there, but still loses its thinking
    earlier = [*chat, {"role": "user", "content": "Ok"}, {"role": "assistant", "content": "Fine"}]
    if "</think>" in answer:
        with pytest.raises(ValueError, match=f"^turn 1: the Jinja chat template of 'q' {problem}"):
            render(earlier, ChatTemplate("q", jinja=QWEN3_CHAT_TEMPLATE))
    else:
        assert supervised_text(render(earlier, ChatTemplate("q", jinja=QWEN3_CHAT_TEMPLATE))) == \
            [answer + "<|im_end|>", "Fine<|im_end|>"]


MORE = [*CHAT, {"role": "user", "content": "More"}]


@pytest.mark.parametrize("source, chat, problem", [
    ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}again: {{ messages[-1].content }}",
     CHAT, "turn 3: the Jinja chat template of 'odd' renders this assistant content 2 times"),
    ("{% for m in messages %}{% if not loop.last %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}",
     CHAT, "turn 3: the Jinja chat template of 'odd' does not render this assistant content,"),
    ("{% for m in messages | reverse %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
     MORE, "turn 3: the Jinja chat template of 'odd' renders the assistant contents out of their order"),
    ("{% for m in messages %}{{ m.role }}: {{ m.content[:3] }}\n{% endfor %}",
     MORE, "turn 1: the Jinja chat template of 'odd' transforms this assistant content"),
])
def test_jinja_templates_whose_assistant_contents_cannot_be_located_are_refused(source, chat, problem):
    with pytest.raises(ValueError) as error:
        render(chat, ChatTemplate("odd", jinja=source))
    assert str(error.value).startswith(problem) and "{% generation %}" in str(error.value)


def test_a_template_whose_own_python_fails_on_a_conversation_is_refused_naming_it():
    """A served template's expressions may fail on data it was not written for (DeepSeek-R1's concatenates a
    tool call's arguments as a string): a ValueError naming the template, never a traceback."""
    source = ("{% for m in messages %}{{ m.role + m.content }}{% if m.tool_calls is defined %}"
              "{{ '```json' + m.tool_calls[0].function.arguments }}{% endif %}{% endfor %}")
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}]
    with pytest.raises(ValueError, match="^the Jinja chat template of 'r1-like' failed on this conversation: TypeError"):
        render(chat, ChatTemplate("r1-like", jinja=source))
