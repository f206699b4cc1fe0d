"""Capture a causal LM's hidden states at chosen layers with forward hooks, in one forward pass.

Layer ids follow `output_hidden_states`: layer k ≥ 0 is the output of decoder layer k
(`hidden_states[k + 1]`), layer −1 the input of the first decoder layer (`hidden_states[0]`,
the embedding output, scaled where the model scales it). The final decoder layer may not be
captured: its hooked output is the un-normed residual stream, which differs from what
`hidden_states[-1]` holds and from the final normed hidden state stored separately.

The decoder layers are found generically: the `nn.ModuleList` whose length is the config's
`num_hidden_layers` (the shortest such path, so a vision tower's list is not taken), which is
`model.layers` in Qwen, Llama, Mistral and Gemma alike. The forward runs the base model (no LM
head: its logits would cost a vocabulary-wide matmul per token and are not stored); its
`last_hidden_state` is the final normed hidden state.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Captured:
    """One batch: `hidden` [B, S, L·H] (the layers side by side, in layer id order), `last` [B, S, H]."""

    hidden: object
    last: object


def text_config(config):
    """The language model's config (multimodal configs keep it under `text_config`)."""
    return getattr(config, "text_config", None) or config


def decoder_layers(model):
    """The decoder layers of a Hugging Face causal LM, and the path they were found at."""
    import torch

    count = text_config(model.config).num_hidden_layers
    found = [(name, module) for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module) == count]
    if not found:
        raise ValueError(f"found no list of {count} decoder layers in {type(model).__name__}")
    name, layers = min(found, key=lambda item: item[0].count("."))
    return layers, name


def base_model(model):
    """The model without its LM head: what returns `last_hidden_state` (normed)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    return decoder if decoder is not None else getattr(model, model.base_model_prefix, model)


def check_layer_ids(layer_ids: list[int], num_layers: int) -> list[int]:
    """Sorted, unique ids in [−1, num_layers − 2]; anything else is refused with the reason."""
    if not layer_ids:
        raise ValueError("--layers: give at least one layer id")
    if sorted(set(layer_ids)) != list(layer_ids):
        raise ValueError(f"--layers must be ascending without repeats (the cache stores them in that order), "
                         f"not {','.join(map(str, layer_ids))}")
    for layer in layer_ids:
        if layer == num_layers - 1:
            raise ValueError(f"--layers: {layer} is the final decoder layer; its output is the un-normed residual "
                             "stream, not the final normed hidden state (stored separately as the last hidden "
                             f"state), so it is not captured: choose ids from -1 to {num_layers - 2}")
        if not -1 <= layer < num_layers - 1:
            raise ValueError(f"--layers: {layer} is out of range; the model has {num_layers} decoder layers "
                             f"(ids -1 for the embedding output to {num_layers - 2})")
    return list(layer_ids)


class HiddenStateCapture:
    """Hooks on the chosen layers of `model`; `forward(input_ids, attention_mask)` → Captured."""

    def __init__(self, model, layer_ids: list[int]):
        self.model = model
        self.layers, _ = decoder_layers(model)
        self.layer_ids = check_layer_ids(layer_ids, len(self.layers))
        self.base = base_model(model)
        self._seen: dict[int, object] = {}

    def _keep(self, layer_id: int, value) -> None:
        import torch

        self._seen[layer_id] = value if isinstance(value, torch.Tensor) else value[0]

    def forward(self, input_ids, attention_mask) -> Captured:
        import torch

        handles = []
        try:
            for layer_id in self.layer_ids:
                if layer_id == -1:  # the first layer's input: hidden_states[0]
                    handles.append(self.layers[0].register_forward_pre_hook(
                        lambda _m, args, kwargs: self._keep(-1, args[0] if args else kwargs["hidden_states"]),
                        with_kwargs=True))
                else:
                    handles.append(self.layers[layer_id].register_forward_hook(
                        lambda _m, _args, output, k=layer_id: self._keep(k, output)))
            with torch.inference_mode():
                output = self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
                hidden = torch.cat([self._seen[k] for k in self.layer_ids], dim=-1)
            return Captured(hidden=hidden, last=output.last_hidden_state)
        finally:
            for handle in handles:
                handle.remove()
            self._seen.clear()
