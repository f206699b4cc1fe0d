"""Reasoning written inline in an assistant content, read in one place: chat prepare reads the
data's turns with it, regenerate a server's answers, so the same text is stored the same way.

Two inline forms are read, each into the reasoning R (stripped) and the content A (leading
whitespace removed); an empty block is no reasoning:

- `<think>R</think>A`: a block at the start of the content (Qwen3, QwQ);
- `R</think>A`: DeepSeek-R1's, whose template opens the block in the generation prompt, so the
  answer holds only the closing tag.

Anywhere else a tag would be left in the content and trained on, and which text was thought and
which said would be a guess, so the turn is refused under one of `REASONS` (docs/chat.md shows
each); a reasoning field and an inline block of the same text are kept once.
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
REASONS = ("think_tag_in_content", "several_think_blocks", "unclosed_think", "think_tag_in_reasoning",
           "conflicting_reasoning")


class ReasoningError(ValueError):
    """A turn whose reasoning cannot be told from its content; `reason` is one of REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def split_reasoning(content: str, reasoning: str | None, where: str) -> tuple[str, str | None]:
    """(content without the inline block, the reasoning: the field's or the block's; None when
    neither has any); `ReasoningError` for a form that is not read (see the module doc)."""
    if reasoning and (THINK_OPEN in reasoning or THINK_CLOSE in reasoning):
        raise ReasoningError("think_tag_in_reasoning", f"{where}: its reasoning field holds a "
                                                       f"{THINK_OPEN if THINK_OPEN in reasoning else THINK_CLOSE} tag")
    opens, closes = content.count(THINK_OPEN), content.count(THINK_CLOSE)
    if not opens and not closes:
        return content, reasoning or None
    if opens > 1 or closes > 1:
        raise ReasoningError("several_think_blocks", f"{where} holds {opens} {THINK_OPEN} and {closes} {THINK_CLOSE} "
                                                     "tags; one leading block is read")
    if not closes:
        raise ReasoningError("unclosed_think", f"{where} opens {THINK_OPEN} without closing it")
    end = content.index(THINK_CLOSE)
    head = content.lstrip()
    if opens and not head.startswith(THINK_OPEN):
        raise ReasoningError("think_tag_in_content", f"{where} has a {THINK_OPEN} block after the start of its "
                                                     f"content, at {content[max(0, content.index(THINK_OPEN) - 30):content.index(THINK_OPEN)]!r}")
    inline = content[content.index(THINK_OPEN) + len(THINK_OPEN) if opens else 0:end].strip()
    answer = content[end + len(THINK_CLOSE):].lstrip()
    if inline and reasoning and inline != reasoning.strip():
        raise ReasoningError("conflicting_reasoning", f"{where} has a reasoning field and an inline {THINK_OPEN} "
                                                      "block with different texts")
    return answer, reasoning or inline or None
