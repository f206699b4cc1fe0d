"""`qwen-deepspec` gives exactly the ids and loss mask of DeepSpec's `qwen` preprocessing.

DeepSpec's rule, written out here as the reference: the conversation, led by the system turn
"You are a helpful assistant." unless it has one, is rendered by the tokenizer's chat template
(ChatML); each match of `<\\|im_start\\|>assistant\\n([\\s\\S]*?(?:<\\|im_end\\|>\\n|$))` marks the
tokens from len(encode(text[:start of group 1])) to len(encode(text[:its end])), both encoded
without special tokens added. Compared on the first few hundred conversations of two shared
chat files, normalized as chat prepare normalizes them (300 of any length under -m slow).
"""

import itertools
import re

import numpy as np
import pytest

from fuelline.chat.encode import encode_chat, encode_chats
from fuelline.chat.schemas import normalize_record
from fuelline.io import read_records
from fuelline.records import Drop

from ..conftest import shared_file
from .test_templates import CHATML_JINJA

DEFAULT_SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ASSISTANT = re.compile(r"<\|im_start\|>assistant\n([\s\S]*?(?:<\|im_end\|>\n|$))")


def deepspec(turns, hf, qwen) -> tuple[list[int], list[int]]:
    """DeepSpec's qwen preprocessing, literally: render, encode, and mask the prefix-encoded ranges."""
    messages = turns if turns[0]["role"] == "system" else [DEFAULT_SYSTEM, *turns]
    text = hf.apply_chat_template(messages, chat_template=CHATML_JINJA, tokenize=False)
    ids = qwen.encode(text, add_special_tokens=False).ids
    mask = [0] * len(ids)
    edges = [x for match in ASSISTANT.finditer(text) for x in (match.start(1), match.end(1))]
    prefixes = [len(e.ids) for e in qwen.encode_batch([text[:x] for x in edges], add_special_tokens=False)]
    for start, end in zip(prefixes[0::2], prefixes[1::2]):
        mask[start:end] = [1] * (end - start)
    return ids, mask


def shared_chats(name: str, count: int, max_turns: int) -> list[list[dict]]:
    normalized = (normalize_record(r) for r in read_records(shared_file(f"chat/{name}")))
    kept = (n.turns for n in normalized if not isinstance(n, Drop) and len(n.turns) <= max_turns)
    return list(itertools.islice(kept, count))


# The header's "\n" merges with a leading "\n" of the answer in the full encoding, but not in the
# prefix's: DeepSpec leaves that token out, the overlap rule of the other templates trains on it.
STRADDLING = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "\nstarts on a newline"}]


# The reference re-encodes a prefix per span edge, quadratic in a conversation's length: the
# first 300 ShareGPT conversations (up to 100+ turns) take it ~25 s on 2 cores, so by default
# the ShareGPT case takes 200 of at most 4 turns.
@pytest.mark.parametrize("name, count, max_turns", [
    ("gsm8k-train.jsonl.zst", 300, 2), ("sharegpt_zh_1K.jsonl.zst", 200, 4),
    pytest.param("sharegpt_zh_1K.jsonl.zst", 300, 1_000, marks=pytest.mark.slow),
])
def test_ids_and_masks_equal_deepspecs_rule(hf, qwen, name, count, max_turns):
    chats = shared_chats(name, count, max_turns)
    assert len(chats) == count
    chats += [STRADDLING, [{"role": "system", "content": "Be brief."}, *STRADDLING]]
    got = encode_chats(chats, qwen, "qwen-deepspec", min_loss_tokens=0)
    bad = []
    for k, (chat, result) in enumerate(zip(chats, got)):
        ids, mask = deepspec(chat, hf, qwen)
        if result.input_ids.tolist() != ids or result.loss_mask.astype(int).tolist() != mask:
            bad.append(k)
    assert bad == [], (name, len(bad), bad[:5])
    assert sum(int(r.loss_mask.sum()) for r in got) > count * 50


def test_default_system_prompt_and_the_newline_after_each_end_of_turn(qwen):
    result = encode_chat(STRADDLING, qwen, "qwen-deepspec")
    tokens = [qwen.id_to_token(int(i)) for i in result.input_ids]
    assert qwen.decode(result.input_ids.tolist(), skip_special_tokens=False).startswith(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n")
    supervised = np.flatnonzero(result.loss_mask)
    assert tokens[supervised[0] - 1] == "ĊĊ" and tokens[supervised[-2]:] == ["<|im_end|>", "Ċ"]
    assert supervised.tolist() == list(range(supervised[0], len(tokens)))
    overlap = encode_chat(STRADDLING, qwen, "chatml")
    assert overlap.loss_mask[[qwen.id_to_token(int(i)) for i in overlap.input_ids].index("ĊĊ")]  # chatml trains on it
