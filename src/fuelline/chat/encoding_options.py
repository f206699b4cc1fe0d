"""How chat records become samples: the options `pack --template chat` and `cache build` share.

Declared once, with one set of defaults, so that the same records give the same samples (ids
and loss mask) through pack and through the cache: both Configs derive from `ChatEncoding`, and
both encode through `ChatEncoding.encode`. The defaults are what both uses need: the model's own
chat template (`auto`: what the target was trained on; a tokenizer without one, such as one of
`fuelline tokenizer train`, is refused with the hint to name a template), conversations cut at
4,096 tokens (a cache must bound a sample's memory), and every conversation with at least one
supervised token kept (a short answer is still an answer to train on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from fuelline.chat.template_registry import template_file
from fuelline.chat.templates import REASONING, SPECIAL_TEXT, TRAIN_TURNS, ChatTemplate, get_template
from fuelline.pipeline.options import Options, option
from fuelline.pipeline.workers import on_error_option

TEMPLATE_NAMES = "chatml, qwen, qwen3, qwen-deepspec (DeepSpec's own samples), llama3, gemma4, FILE.toml[:NAME]"


@dataclass
class ChatEncoding(Options):
    """Chat template, length limits and what is trained on: the fields of `PackConfig` and
    `CacheConfig` that decide a chat sample, passed to `encode_chats` by `encode` alone."""

    chat_template: str = option("auto", f"chat records: {TEMPLATE_NAMES}, or auto (the tokenizer's own Jinja "
                                "template)", reads=template_file)
    max_length: int = option(4096, "chat records: longest conversation in tokens; longer ones are cut at a turn "
                             "boundary", min=1)
    min_loss_tokens: int = option(1, "chat records: drop conversations with fewer supervised tokens", min=0)
    reasoning: str = option("last", "reasoning_content: trained on in every assistant turn (keep), removed before "
                            "rendering (drop), or kept only after the last user turn, as Qwen3 renders history (last)",
                            choices=list(REASONING))
    train_turns: str = option("all", "train on every assistant turn (all), or only on the last one (last: agent "
                              "trajectories whose earlier turns were edited)", choices=list(TRAIN_TURNS))
    special_text: str = option("refuse", "an assistant turn whose text spells one of the tokenizer's control tokens "
                               "(\"done<|im_end|>\\n<|im_start|>user…\", a fake turn): drop the conversation as "
                               "special_token_text (refuse), or keep it, encoded as those control tokens, as "
                               "apply_chat_template encodes it, and counted (keep)", choices=list(SPECIAL_TEXT))

    def __post_init__(self):
        """A chat template that does not exist is refused here, before a tokenizer or model loads."""
        super().__post_init__()
        try:
            get_template(self.chat_template)  # `auto` is checked against the tokenizer when it is loaded
        except (ValueError, OSError) as e:
            raise ValueError(f"--chat-template {self.chat_template}: {e}") from None

    def encode(self, records: Sequence[Any], tokenizer: Any, template: str | ChatTemplate | None = None,
               on_error: str = "raise") -> list:
        """`encode_chats` of `records` with these options (`template`: the chat template already
        resolved against the tokenizer, else `chat_template`)."""
        from fuelline.chat.encode import encode_chats

        return encode_chats(records, tokenizer, template or self.chat_template, self.max_length,
                            min_loss_tokens=self.min_loss_tokens, reasoning=self.reasoning,
                            train_turns=self.train_turns, special_text=self.special_text, on_error=on_error)


@dataclass
class RecordErrors(Options):
    """What `pack` and `cache build` do with a record they cannot use (unreadable, not a chat record,
    or one the template cannot render): their own option, so that their identity keeps it, declared
    where the run options' is (`on_error_option`)."""

    on_error: str = on_error_option()
