"""Tool-call conversations in the chat record contract, and Qwen3's chat template as the reference.

QWEN3_TEMPLATE is Qwen3's published chat template (the `chat_template` of the Qwen3 models'
tokenizer_config.json), written out here because the Qwen vocabulary of the tests carries none.
QWEN3_GENERATION_TEMPLATE is the same template with `{% generation %}` around what an assistant
turn should train on: its reasoning block when the block is not empty, content, tool calls and
`<|im_end|>`; the header, the empty block, tool results and tool schemas stay outside.
"""

_QWEN3_HEAD = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
"""

_QWEN3_ASSISTANT = """        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
@CALLS@
        {%- endif %}
        {{- '<|im_end|>\\n' }}
"""

_QWEN3_CALLS = """            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}"""

# The assistant branch with the think block, content, tool calls and <|im_end|> in one generation block
# (`shown`: the content as written; the calls' leading newline tests the content as given, as Qwen3's does).
_GENERATION_ASSISTANT = """        {%- set think = '' %}
        {%- set shown = content %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {%- set think = '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' %}
            {%- set shown = content.lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if think == '<think>\\n\\n</think>\\n\\n' %}
            {{- think }}
            {%- set think = '' %}
        {%- endif %}
        {%- generation %}
        {{- think + shown }}
        {%- if message.tool_calls %}
@CALLS@
        {%- endif %}
        {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
"""

_QWEN3_TAIL = """    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

QWEN3_TEMPLATE = _QWEN3_HEAD + _QWEN3_ASSISTANT.replace("@CALLS@", _QWEN3_CALLS) + _QWEN3_TAIL
QWEN3_GENERATION_TEMPLATE = _QWEN3_HEAD + _GENERATION_ASSISTANT.replace("@CALLS@", _QWEN3_CALLS) + _QWEN3_TAIL

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a time zone.",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}},
]


def user(content: str) -> dict:
    return {"role": "user", "content": content}


def assistant(content: str, *calls: tuple[str, dict], reasoning: str | None = None) -> dict:
    turn = {"role": "assistant", "content": content}
    if calls:
        turn["tool_calls"] = [{"type": "function", "function": {"name": name, "arguments": arguments}}
                              for name, arguments in calls]
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    return turn


def tool(content: str, name: str, call_id: str) -> dict:
    return {"role": "tool", "content": content, "tool_call_id": call_id, "name": name}


PARIS = ("get_weather", {"city": "Paris"})
TOKYO = ("get_weather", {"city": "東京", "unit": "celsius"})
TOKYO_TIME = ("get_time", {"timezone": "Asia/Tokyo"})

SINGLE = [user("What's the weather in Paris?"), assistant("", PARIS),
          tool('{"temperature": 18, "condition": "cloudy"}', "get_weather", "call_1"),
          assistant("It is 18 °C and cloudy in Paris.")]
PARALLEL = [user("Weather in Paris and 東京, and the time in Tokyo?"), assistant("Let me check.", PARIS, TOKYO, TOKYO_TIME),
            tool('{"temperature": 18}', "get_weather", "call_1"), tool('{"temperature": 24}', "get_weather", "call_2"),
            tool('{"time": "21:04"}', "get_time", "call_3"),
            assistant("Paris: 18 °C. 東京: 24 °C, where it is 21:04.")]
ROUNDS = [{"role": "system", "content": "You are a travel assistant."}, user("Is it warmer in Paris or Tokyo?"),
          assistant("", PARIS), tool('{"temperature": 18}', "get_weather", "call_1"),
          assistant("", TOKYO), tool('{"temperature": 24}', "get_weather", "call_2"),
          assistant("Tokyo, by 6 °C."), user("And what time is it there?"),
          assistant("", TOKYO_TIME), tool('{"time": "21:04"}', "get_time", "call_3"),
          assistant("It is 21:04 in Tokyo.")]
ERROR = [user("Weather in Atlantis?"), assistant("", ("get_weather", {"city": "Atlantis"})),
         tool("Error: unknown city 'Atlantis'", "get_weather", "call_1"),
         assistant("I could not find a city called Atlantis.")]
THINKING = [user("Is it warmer in Paris or Tokyo?"),
            assistant("", PARIS, reasoning="I need both temperatures; Paris first."),
            tool('{"temperature": 18}', "get_weather", "call_1"),
            assistant("", TOKYO, reasoning="Paris is 18. Now Tokyo."),
            tool('{"temperature": 24}', "get_weather", "call_2"),
            assistant("Tokyo, by 6 °C.", reasoning="24 > 18, by 6."),
            user("Thanks!"), assistant("You're welcome.", reasoning="Just be polite.")]
# the first round alone: every assistant turn follows the last user turn, so Qwen3 keeps all the reasoning
CONVERSATIONS = {"single": SINGLE, "parallel": PARALLEL, "rounds": ROUNDS, "error": ERROR, "thinking": THINKING,
                 "thinking-round": THINKING[:6]}
