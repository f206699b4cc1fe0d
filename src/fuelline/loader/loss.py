"""The one place where labels are shifted, and a check that catches the double-shift bug.

Labels come from the dataset aligned with the inputs (`labels[t]` is about token t). The model
predicts token t+1 from position t, so the loss compares logits[..., :-1] with labels[..., 1:].
Shifting in the dataset *and* in the model trains the model to predict two tokens ahead: the
loss still goes down, which is why `check_alignment` exists.
"""

from __future__ import annotations

from fuelline.loader.dataset import IGNORE_INDEX


def causal_lm_loss(logits, labels, ignore_index: int = IGNORE_INDEX):
    """Mean next-token cross-entropy over the positions whose target is not ignored."""
    import torch.nn.functional as F

    shifted_logits = logits[..., :-1, :].contiguous()
    targets = labels[..., 1:].contiguous()
    return F.cross_entropy(shifted_logits.view(-1, shifted_logits.size(-1)).float(), targets.view(-1),
                           ignore_index=ignore_index)


class AlignmentError(ValueError):
    """Labels and inputs do not follow the alignment contract (docs/design.md, "Alignment contract")."""


def check_alignment(batch: dict, pad_id: int | None = None, ignore_index: int = IGNORE_INDEX) -> None:
    """Raise if labels are not input_ids-or-ignored at the same positions.

    Catches labels shifted before the model (they then match input_ids one position over), and a
    pad id masked by value (ignored where it is a real token, not trailing padding).
    """
    input_ids, labels = batch["input_ids"], batch["labels"]
    if input_ids.shape != labels.shape:
        raise AlignmentError(f"input_ids {tuple(input_ids.shape)} and labels {tuple(labels.shape)} differ in shape")
    kept = labels != ignore_index
    if not bool((labels[kept] == input_ids[kept]).all()):
        shifted = labels[..., :-1] == input_ids[..., 1:]
        kept_shifted = kept[..., :-1]
        if kept_shifted.any() and bool(shifted[kept_shifted].all()):
            raise AlignmentError("labels are input_ids shifted left by one: they were shifted before the model, "
                                 "which shifts again (double shift). Give labels aligned with input_ids.")
        raise AlignmentError("labels differ from input_ids at trained positions: labels must equal input_ids "
                             "or be the ignore index")
    if pad_id is not None:
        import torch

        # Padding only ever follows the last trained token of a row; an ignored pad id before it
        # is a real token (often </s>, when pad = eos) hidden by masking on the value.
        positions = torch.arange(labels.shape[-1], device=labels.device)
        last_trained = torch.where(kept, positions, torch.full_like(positions, -1)).max(dim=-1).values
        hidden = (input_ids == pad_id) & ~kept & (positions < last_trained.unsqueeze(-1))
        if bool(hidden.any()):
            raise AlignmentError(f"pad id {pad_id} is ignored before trained tokens: the mask was made from "
                                 "token values, which also hides the real occurrences of that id (e.g. </s> "
                                 "when pad = eos). Mask by position instead.")
