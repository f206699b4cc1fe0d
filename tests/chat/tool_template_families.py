"""Served tool-calling chat templates, reconstructed from the text they render, each with a copy
that has `{% generation %}` blocks placed by the incremental rule, and tokenizer directories for them.

None of these templates has generation blocks as served, so the model's own template can only be
used for tool-call data if the assistant spans are found by rendering turn by turn
(`fuelline.chat.incremental_spans`): turn i's text in A_i = render(turns[:i + 1]) starts where the
content of an empty assistant probe turn after turns[:i] starts, when the text before it is a
prefix of A_i (what the template writes before every answer, whatever it says); else where P_i =
render(turns[:i], add_generation_prompt=True) ends, when P_i is a prefix of A_i. The probe's start
moves back to where a probe with a call parts from it (what a call writes in its place is the model's),
or, where no call is written, to P_i's end when only whitespace is between. Where every A_i
is a prefix of the later renderings, it is supervised up to and including its last end-of-turn
token. A turn that neither locates, or whose text a later turn rewrites, falls back to the
content marks (its content verbatim, then an end-of-turn token), and such a turn with tool calls
or reasoning is refused.

Each family is the template as served (`plain`) and a `variant` that renders the same text with
one `{% generation %}` block per assistant turn where that rule puts the turn's span; the
variant is written per family from the template's structure, and the tests check it against
the rule run on the plain template's renderings, and by hand. The long fixed prose (system
prompts, tool instructions) is shortened; every structural behaviour is kept:

- hermes (vLLM's tool_chat_template_hermes, Hermes-2-Pro/Hermes-3): a fixed system turn holding
  the tools, whether or not there are any; an assistant turn with tool calls renders its calls and
  not its content, `<|im_start|>assistant` then `\\n<tool_call>\\n{...}\\n</tool_call>` per call;
  tool results in one `tool` turn closed by `<|im_end|>` without a newline, the last message's
  result without the "\\n" after `</tool_response>`. The next turn after results is located by the probe.
- llama3.1 (Meta's JSON tool form): a system header with "Environment: ipython" and a fixed date,
  the tools in the first user message, contents trimmed, exactly one call per turn (more raise),
  `{"name": N, "parameters": ARGS}`; tool results in `ipython` turns, written with `tojson` (a
  string is iterable in Jinja, so a result string is rendered as a JSON string literal).
- mistral (Mistral-7B-Instruct-v0.3): `[AVAILABLE_TOOLS]` before the LAST user message only
  (found by equality, so the generator keeps user contents distinct); the system message
  prepended to a user message only when that user message is the conversation's last message
  (so it is never in a conversation that ends with an answer, and P_i holds it where A_i does
  not: a tool-call turn right after a user turn, which has no " " before it as a plain answer
  has, is refused); answers ` {content|trim}</s>`; calls
  `[TOOL_CALLS] [{"name", "arguments", "id"}]</s>` with 9-alphanumeric ids (else it raises);
  results `[TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS]`; the " " before an answer
  is the model's (a call writes `[TOOL_CALLS]` there) where the turn is rendered turn by turn; no generation
  prompt; user and assistant alternation checked, tool turns and tool-call turns exempt. With
  tools, every turn before the last user message is rewritten later (the tools move).
- qwen2.5: ChatML, a default system prompt, tools in the system turn, content then calls
  (`<|im_start|>assistant` + "\\n" + content only when there is content), results grouped in one
  user turn.
- deepseek-r1 (DeepSeek-R1-Distill's form, no tools): bos and the system content, `<｜User｜>`,
  answers `<｜Assistant｜>{content}<｜end▁of▁sentence｜>`, reasoning read from the content
  (`<think>\\n…\\n</think>\\n\\n` at its start, not `reasoning_content`) and cut from every turn but
  the last message (content.split('</think>')[-1]), generation prompt `<｜Assistant｜><think>\\n`. An
  answer starts right after `<｜Assistant｜>`, where the probe's content does, the last message's
  think block included. (The published template cuts the last message's
  reasoning too, as far as its text shows; then no reasoning is ever rendered, and a reasoning
  conversation is refused by the marks.)
- glm-4-0414 (GLM-4-9B-0414, GLM-4-32B-0414): `[gMASK]<sop>`, headers `<|user|>`/`<|assistant|>` with
  the text on the next line, no end-of-turn token, generation prompt `<|assistant|>`; calls are
  `metadata` turns and results `observation` turns, so `tool_calls` and `tool` turns are not read
  (tools=False: its conversations have none; a call given to it is refused). The "\n" after
  `<|assistant|>` is the model's (where a call writes its name).
- qwen3: `tool_conversations.QWEN3_TEMPLATE` (Qwen3's own), which rewrites earlier turns: the last
  message's (possibly empty) think block goes when a turn follows, and reasoning before the last
  user message goes. Its variant is QWEN3_GENERATION_TEMPLATE: the empty think block before the
  last answer is written before every last answer, so it is the prompt's, as in the named `qwen3`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from .tool_conversations import QWEN3_GENERATION_TEMPLATE, QWEN3_TEMPLATE

# ---------------------------------------------------------------------------------------------- hermes

_HERMES_HEAD = r"""{{- bos_token }}
{{- '<|im_start|>system\nYou are a function-calling assistant. The functions you may call are described within <tools></tools> XML tags; call any of them, without guessing their arguments. The functions: <tools> ' }}
{%- if tools is iterable and tools | length > 0 %}
    {%- for tool in tools %}
        {%- set fn = tool.function if tool.function is defined else tool %}
        {{- '{"type": "function", "function": ' + fn | tojson + '}' }}
        {%- if not loop.last %}{{- '\n' }}{% endif %}
    {%- endfor %}
{%- endif %}
{{- ' </tools>Return each call as a JSON object with the function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-dict>}\n</tool_call><|im_end|>\n' }}
{%- for message in messages %}
    {%- if message.role == 'user' or message.role == 'system' %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set ns = namespace(calls='') %}
        {%- for call in message.tool_calls if message.tool_calls is defined %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- set ns.calls = ns.calls + '\n<tool_call>\n{"name": "' + fn.name + '"' %}
            {%- if fn.arguments is defined %}{% set ns.calls = ns.calls + ', "arguments": ' + fn.arguments | tojson %}{% endif %}
            {%- set ns.calls = ns.calls + '}\n</tool_call>' %}
        {%- endfor %}
"""
_HERMES_ASSISTANT = r"""        {%- if message.tool_calls is not defined %}
            {{- '<|im_start|>assistant\n' + message.content + '<|im_end|>\n' }}
        {%- else %}
            {{- '<|im_start|>assistant' + ns.calls + '<|im_end|>\n' }}
        {%- endif %}
"""
# the span starts after the "\n" that opens the first call (where the generation prompt ends)
_HERMES_ASSISTANT_GEN = r"""        {%- if message.tool_calls is not defined %}
            {{- '<|im_start|>assistant\n' }}{% generation %}{{ message.content + '<|im_end|>' }}{% endgeneration %}
        {%- elif ns.calls %}
            {{- '<|im_start|>assistant\n' }}{% generation %}{{ ns.calls[1:] + '<|im_end|>' }}{% endgeneration %}
        {%- else %}
            {{- '<|im_start|>assistant<|im_end|>' }}
        {%- endif %}
        {{- '\n' }}
"""
_HERMES_TAIL = r"""    {%- elif message.role == 'tool' %}
        {%- if loop.previtem and loop.previtem.role != 'tool' %}{{- '<|im_start|>tool\n' }}{% endif %}
        {{- '<tool_response>\n' + message.content }}
        {%- if loop.last %}{{- '\n</tool_response>' }}{% else %}{{- '\n</tool_response>\n' }}{% endif %}
        {%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>' }}{% endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{% endif %}"""

HERMES = _HERMES_HEAD + _HERMES_ASSISTANT + _HERMES_TAIL
HERMES_GENERATION = _HERMES_HEAD + _HERMES_ASSISTANT_GEN + _HERMES_TAIL

# -------------------------------------------------------------------------------------------- llama3.1

_LLAMA_PROSE = ("'Answer with a JSON function call, with its arguments, that best answers the prompt, "
                "in the format {\"name\": function name, \"parameters\": dictionary of arguments}. "
                "Do not use variables.\\n\\n'")
_LLAMA_HEAD = r"""{{- bos_token }}
{%- if tools_in_user_message is not defined %}{% set tools_in_user_message = true %}{% endif %}
{%- if date_string is not defined %}{% set date_string = '26 Jul 2024' %}{% endif %}
{%- if tools is not defined %}{% set tools = none %}{% endif %}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = '' %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}
{%- if tools is not none %}{{- 'Environment: ipython\n' }}{% endif %}
{{- 'Cutting Knowledge Date: December 2023\nToday Date: ' + date_string + '\n\n' }}
{%- if tools is not none and not tools_in_user_message %}
    {{- @PROSE@ }}
    {%- for t in tools %}{{- t | tojson(indent=4) + '\n\n' }}{% endfor %}
{%- endif %}
{{- system_message + '<|eot_id|>' }}
{%- if tools_in_user_message and tools is not none %}
    {%- if messages | length == 0 %}{{- raise_exception('Tools go in the first user message, and there is none.') }}{% endif %}
    {%- set first_user_message = messages[0].content | trim %}
    {%- set messages = messages[1:] %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' + @PROSE@ }}
    {%- for t in tools %}{{- t | tojson(indent=4) + '\n\n' }}{% endfor %}
    {{- first_user_message + '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
""".replace("@PROSE@", _LLAMA_PROSE)
_LLAMA_TURN = r"""        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
"""
_LLAMA_TURN_GEN = r"""        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' }}
        {%- if message.role == 'assistant' %}
            {%- generation %}{{ message.content | trim + '<|eot_id|>' }}{% endgeneration %}
        {%- else %}
            {{- message.content | trim + '<|eot_id|>' }}
        {%- endif %}
"""
_LLAMA_CALL_HEAD = r"""    {%- elif 'tool_calls' in message %}
        {%- if message.tool_calls | length != 1 %}{{- raise_exception('This model only supports single tool-calls at once!') }}{% endif %}
        {%- set call = message.tool_calls[0].function %}
        {%- set text = '{"name": "' + call.name + '", "parameters": ' + call.arguments | tojson + '}<|eot_id|>' %}
"""
_LLAMA_CALL = r"""        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' + text }}
"""
_LLAMA_CALL_GEN = r"""        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% generation %}{{ text }}{% endgeneration %}
"""
_LLAMA_TAIL = r"""    {%- else %}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' }}
        {%- if message.content is mapping or message.content is iterable %}{{- message.content | tojson }}{% else %}{{- message.content }}{% endif %}
        {{- '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"""

LLAMA31 = _LLAMA_HEAD + _LLAMA_TURN + _LLAMA_CALL_HEAD + _LLAMA_CALL + _LLAMA_TAIL
LLAMA31_GENERATION = _LLAMA_HEAD + _LLAMA_TURN_GEN + _LLAMA_CALL_HEAD + _LLAMA_CALL_GEN + _LLAMA_TAIL

# --------------------------------------------------------------------------------------------- mistral

_MISTRAL_HEAD = r"""{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if tools is not defined %}{% set tools = none %}{% endif %}
{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}
{%- set ns = namespace(index=0, last_user=-1) %}
{%- for message in loop_messages %}
    {%- if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
    {%- if not (message.role == 'tool' or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message.role == 'user') != (ns.index % 2 == 0) %}
            {{- raise_exception('After the optional system message, user and assistant turns must alternate.') }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message.role == 'user' %}
        {%- if tools is not none and message == user_messages[-1] %}
            {{- '[AVAILABLE_TOOLS] [' }}
            {%- for tool in tools %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, value in tool.function.items() if key != 'return' %}
                    {{- '"' + key + '": ' + (('"' + value + '"') if value is string else value | tojson) }}
                    {%- if not loop.last %}{{- ', ' }}{% endif %}
                {%- endfor %}
                {{- '}}' }}
                {%- if loop.last %}{{- ']' }}{% else %}{{- ', ' }}{% endif %}
            {%- endfor %}
            {{- '[/AVAILABLE_TOOLS]' }}
        {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- '[INST] ' + system_message + '\n\n' + message.content + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message.content + '[/INST]' }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {%- set calls = namespace(text='[TOOL_CALLS] [') %}
        {%- for call in message.tool_calls %}
            {%- if call.id is not defined or call.id is not string or call.id | length != 9 or not call.id.isalnum() %}
                {{- raise_exception('Tool call ids must be strings of 9 letters or digits.') }}
            {%- endif %}
            {%- set calls.text = calls.text + (call.function | tojson)[:-1] + ', "id": "' + call.id + '"}' %}
            {%- set calls.text = calls.text + (']' + eos_token if loop.last else ', ') %}
        {%- endfor %}
"""
_MISTRAL_ASSISTANT = r"""        {{- calls.text }}
    {%- elif message.role == 'assistant' %}
        {{- ' ' + message.content | trim + eos_token }}
"""
# the " " before a plain answer is the model's (a call writes [TOOL_CALLS] where it is, and there is no prompt),
# where the answer is rendered turn by turn; before the last user message the tools move, and marks locate the
# content alone
_MISTRAL_ASSISTANT_GEN = r"""        {%- generation %}{{ calls.text }}{% endgeneration %}
    {%- elif message.role == 'assistant' and (tools is none or loop.index0 > ns.last_user) %}
        {%- generation %}{{ ' ' + message.content | trim + eos_token }}{% endgeneration %}
    {%- elif message.role == 'assistant' %}
        {{- ' ' }}{% generation %}{{ message.content | trim + eos_token }}{% endgeneration %}
"""
_MISTRAL_TAIL = r"""    {%- elif message.role == 'tool' %}
        {%- if message.tool_call_id is not defined or message.tool_call_id | length != 9 %}
            {{- raise_exception('Tool call ids must be strings of 9 letters or digits.') }}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + message.content | string + ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception('Only user, assistant and tool turns after an optional system message.') }}
    {%- endif %}
{%- endfor %}"""

MISTRAL = _MISTRAL_HEAD + _MISTRAL_ASSISTANT + _MISTRAL_TAIL
MISTRAL_GENERATION = _MISTRAL_HEAD + _MISTRAL_ASSISTANT_GEN + _MISTRAL_TAIL

# --------------------------------------------------------------------------------------------- qwen2.5

_QWEN25_HEAD = r"""{%- set default_system = 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' %}
{%- if tools %}
    {{- '<|im_start|>system\n' + (messages[0].content if messages[0].role == 'system' else default_system) }}
    {{- '\n\n# Tools\n\nYou may call one or more functions for the user query.\n\nThe function signatures, within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}{{- '\n' + tool | tojson }}{% endfor %}
    {{- '\n</tools>\n\nReturn each function call as a JSON object with the function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\n' + (messages[0].content if messages[0].role == 'system' else default_system) + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set ns = namespace(calls='') %}
        {%- for call in message.tool_calls if message.tool_calls %}
            {%- set fn = call.function if call.function is defined else call %}
            {%- set ns.calls = ns.calls + '\n<tool_call>\n{"name": "' + fn.name + '", "arguments": ' + fn.arguments | tojson + '}\n</tool_call>' %}
        {%- endfor %}
"""
_QWEN25_ASSISTANT = r"""        {%- if not message.tool_calls %}
            {{- '<|im_start|>assistant\n' + message.content + '<|im_end|>\n' }}
        {%- else %}
            {{- '<|im_start|>assistant' + ('\n' + message.content if message.content else '') + ns.calls + '<|im_end|>\n' }}
        {%- endif %}
"""
_QWEN25_ASSISTANT_GEN = r"""        {{- '<|im_start|>assistant\n' }}
        {%- if not message.tool_calls %}
            {%- generation %}{{ message.content + '<|im_end|>' }}{% endgeneration %}
        {%- elif message.content %}
            {%- generation %}{{ message.content + ns.calls + '<|im_end|>' }}{% endgeneration %}
        {%- else %}
            {%- generation %}{{ ns.calls[1:] + '<|im_end|>' }}{% endgeneration %}
        {%- endif %}
        {{- '\n' }}
"""
_QWEN25_TAIL = r"""    {%- elif message.role == 'tool' %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{% endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{% endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{% endif %}"""

QWEN25 = _QWEN25_HEAD + _QWEN25_ASSISTANT + _QWEN25_TAIL
QWEN25_GENERATION = _QWEN25_HEAD + _QWEN25_ASSISTANT_GEN + _QWEN25_TAIL

# ----------------------------------------------------------------------------------------- deepseek-r1

_DEEPSEEK_HEAD = r"""{%- set ns = namespace(system='') %}
{%- for message in messages if message.role == 'system' %}{% set ns.system = message.content %}{% endfor %}
{{- bos_token + ns.system }}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<｜User｜>' + message.content }}
    {%- elif message.role == 'assistant' %}
        {%- if message.tool_calls is defined %}{{- raise_exception('This template renders no tool calls.') }}{% endif %}
        {%- set content = message.content %}
        {%- if not loop.last and '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}
"""
_DEEPSEEK_ASSISTANT = r"""        {{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}
"""
# an answer starts right after <｜Assistant｜>, where the probe's content does (its think block included)
_DEEPSEEK_ASSISTANT_GEN = r"""        {{- '<｜Assistant｜>' }}{% generation %}{{ content + '<｜end▁of▁sentence｜>' }}{% endgeneration %}
"""
_DEEPSEEK_TAIL = r"""    {%- elif message.role == 'tool' %}
        {{- raise_exception('This template renders no tool results.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<｜Assistant｜><think>\n' }}{% endif %}"""

DEEPSEEK_R1 = _DEEPSEEK_HEAD + _DEEPSEEK_ASSISTANT + _DEEPSEEK_TAIL
DEEPSEEK_R1_GENERATION = _DEEPSEEK_HEAD + _DEEPSEEK_ASSISTANT_GEN + _DEEPSEEK_TAIL

# --------------------------------------------------------------------------------------------- qwen3

QWEN3 = QWEN3_TEMPLATE
# the empty think block before the last answer is the prompt's, as in tool_conversations' own variant
QWEN3_GENERATION = QWEN3_GENERATION_TEMPLATE


# ----------------------------------------------------------------------------------------- glm-4-0414

# GLM-4-0414's chat template (THUDM/GLM-4-9B-0414 and GLM-4-32B-0414, tokenizer_config.json), reconstructed from
# what it renders; its message loop is the one the GLM-4-0414 family serves (GLM-Z1-Rumination-32B-0414's
# template, printed in a public GGUF conversion log, has the same loop). The tool prose of its system turn
# (Chinese there) is shortened. No end-of-turn token after an answer: the next header ends it (`<|user|>`,
# `<|observation|>` are among its model's stop tokens). A call is an assistant turn with `metadata` (the
# function's name, right after `<|assistant|>`, where an answer has "\n") and the arguments as its content;
# a result an `observation` turn. `tool_calls` and `tool` turns, the chat record's, are not read at all.
_GLM4_HEAD = r"""[gMASK]<sop>
{%- if tools -%}
<|system|>
# Tools
{% for tool in tools %}
    {%- set function = tool.function if tool.get("function") else tool %}

## {{ function.name }}

{{ function | tojson(indent=4, ensure_ascii=False) }}
Write the arguments of a call to this function as JSON.
{%- endfor %}
{%- endif -%}
{%- for msg in messages %}
    {%- if msg.role == 'system' %}
<|system|>
{{ msg.content }}
    {%- endif %}
{%- endfor %}
{%- for message in messages if message.role != 'system' %}
    {%- set role = message['role'] %}
    {%- set content = message['content'] %}
    {%- set meta = message.get("metadata", "") %}
    {%- if role == 'user' %}
<|user|>
{{ content }}
"""
_GLM4_ASSISTANT = r"""    {%- elif role == 'assistant' and not meta %}
<|assistant|>
{{ content }}
"""
# the "\n" after <|assistant|> is the model's: the generation prompt ends before it, and a call writes its name there
_GLM4_ASSISTANT_GEN = r"""    {%- elif role == 'assistant' and not meta %}
<|assistant|>{% generation %}{{ '\n' + content }}{% endgeneration %}
"""
_GLM4_TAIL = r"""    {%- elif role == 'assistant' and meta %}
<|assistant|>{{ meta }} 
{{ content }}
    {%- elif role == 'observation' %}
<|observation|>
{{ content }}
    {%- endif %}
{%- endfor %}
{% if add_generation_prompt %}<|assistant|>{% endif %}"""

GLM4_0414 = _GLM4_HEAD + _GLM4_ASSISTANT + _GLM4_TAIL
GLM4_0414_GENERATION = _GLM4_HEAD + _GLM4_ASSISTANT_GEN + _GLM4_TAIL


@dataclass(frozen=True)
class Family:
    """A served template, its variant with generation blocks, its special tokens, and what its
    conversations must look like: `max_calls` per turn, 9-alphanumeric call ids (`call_ids`),
    reasoning written into the content (`reasoning_in_content`), `tools` at all."""

    name: str
    plain: str
    variant: str
    eos: str
    bos: str | None = None
    tools: bool = True
    max_calls: int = 3
    call_ids: bool = False
    reasoning_in_content: bool = False


FAMILIES = {f.name: f for f in (
    Family("hermes", HERMES, HERMES_GENERATION, eos="<|im_end|>", bos="<|begin_of_text|>"),
    Family("llama3.1", LLAMA31, LLAMA31_GENERATION, eos="<|eot_id|>", bos="<|begin_of_text|>", max_calls=1),
    Family("mistral", MISTRAL, MISTRAL_GENERATION, eos="</s>", bos="<s>", call_ids=True),
    Family("qwen2.5", QWEN25, QWEN25_GENERATION, eos="<|im_end|>"),
    Family("deepseek-r1", DEEPSEEK_R1, DEEPSEEK_R1_GENERATION, eos="<｜end▁of▁sentence｜>",
           bos="<｜begin▁of▁sentence｜>", tools=False, reasoning_in_content=True),
    Family("qwen3", QWEN3, QWEN3_GENERATION, eos="<|im_end|>"),
    Family("glm-4-0414", GLM4_0414, GLM4_0414_GENERATION, eos="<|endoftext|>", tools=False),
)}

# The control tokens of all families, added to the Qwen vocabulary as special tokens (Qwen's own
# ChatML and tool tokens are there already), in this order: every family directory has the same
# ids, so one token means the same thing in all of them.
CONTROL_TOKENS = [
    "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
    "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
    "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
]


def family_dirs(qwen_dir: Path, base: Path) -> dict[str, Path]:
    """A tokenizer directory per family: Qwen's vocabulary plus CONTROL_TOKENS, the family's plain
    template as tokenizer_config.json's chat_template, its bos and eos tokens."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    added = tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
    assert added == len(CONTROL_TOKENS)
    union = base / "union"
    shutil.copytree(qwen_dir, union)
    tokenizer.save(str(union / "tokenizer.json"))
    dirs = {}
    for family in FAMILIES.values():
        out = dirs[family.name] = base / family.name.replace(".", "")
        shutil.copytree(union, out)
        tokens = {"bos_token": family.bos, "eos_token": family.eos}
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            config = json.loads((out / name).read_text(encoding="utf-8"))
            config.update(tokens)
            if name == "tokenizer_config.json":
                config["chat_template"] = family.plain
            (out / name).write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    return dirs


def with_chat_template(directory: Path, out: Path, source: str, as_file: bool = False) -> Path:
    """A copy of a tokenizer (or model) directory whose chat template is `source`: in chat_template.jinja
    (`as_file`, which wins over the config's, as in transformers) or as tokenizer_config.json's chat_template."""
    shutil.copytree(directory, out)
    if as_file:
        (out / "chat_template.jinja").write_text(source, encoding="utf-8")
    else:
        config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
        (out / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": source}), encoding="utf-8")
    return out
