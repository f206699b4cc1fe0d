"""Train a one-layer draft head (EAGLE-3 style) from a target cache: what the cache is for.

The target never runs. Its hidden states at the captured layers come from the cache
(`fuelline cache build`), and so does its final normed hidden state, which through the target's
LM head gives the target's next-token distribution: the draft is distilled towards it. Only the
target's embedding matrix and LM head are loaded from the model directory, both frozen.

The draft: the captured layers side by side [T, L*H], projected to H by a linear layer, fused
with the embedding of the *next* token (both RMS-normed, concatenated, into the attention's
q/k/v), one decoder layer (causal self-attention with rotary positions, SwiGLU MLP, RMSNorm),
a final RMSNorm, the target's LM head.

Alignment, shifted once, in `shift`: draft position t reads the target's features at t and the
embedding of token t+1, and is taught the target's distribution at t+1 (over token t+2), where
loss_mask[t+1] is 1 (token t+1 is an assistant token: the draft drafts inside assistant turns).
A sample of T tokens gives T-1 draft positions. The loss is KL(target || draft) in nats per
supervised position; top-1 is how often the draft's argmax is the target's.

The script shows the reading path of a training run (`CacheDataset`, `LengthGroupedBatchSampler`,
`CacheCollator`, `CUDAPrefetcher(transform=widen_hidden)`, so fp8 caches are widened on the GPU),
and checks that the cache fits the target before any step. CPU or GPU unchanged (bf16 autocast on
CUDA). For example (about 4 s a step on 2 CPU cores: 300 steps take some 20 minutes there, 15 a
minute; the README's worked example trains 15):

    python examples/train_draft.py --cache runs/cache --steps 300 --json-out runs/draft.json

With `--stream DIR` it trains while `fuelline cache stream` builds the cache into a bounded window
(docs/cache.md, "Training on a bounded disk"): `StreamingCacheDataset` in batches of
`--batch-size` samples, through every epoch of the stream. `--checkpoint PATH` saves the draft,
its optimizer and the stream's position every `--checkpoint-every` steps and at the end, and a
run that finds the file resumes there; with `--acknowledge checkpoint` a partition may be deleted
only once a saved checkpoint is past it, so a trainer killed at any point resumes without losing
or repeating a sample:

    fuelline cache stream --model M -i CHATS -o runs/stream --layers 1,9,17 --partition-samples 4096 --window 4 &
    python examples/train_draft.py --stream runs/stream --checkpoint runs/draft.pt --acknowledge checkpoint
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fuelline.cache import CacheCollator, CacheDataset, LengthGroupedBatchSampler, StreamingCacheDataset, widen_hidden
from fuelline.cache.plan import model_config, model_fingerprint
from fuelline.loader import CUDAPrefetcher


def rotate(x, theta: float):
    """Rotary positions on [B, heads, T, head_dim]."""
    t, half = x.shape[-2], x.shape[-1] // 2
    angles = torch.arange(t, device=x.device)[:, None] * theta ** (-torch.arange(half, device=x.device) / half)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Draft(nn.Module):
    def __init__(self, layers: int, text_config, embedding: torch.Tensor, head: torch.Tensor):
        super().__init__()
        dim, eps = text_config.hidden_size, text_config.rms_norm_eps
        self.heads, self.theta = text_config.num_attention_heads, getattr(text_config, "rope_theta", 10_000.0)
        self.fc = nn.Linear(layers * dim, dim, bias=False)
        self.embed = nn.Embedding.from_pretrained(embedding, freeze=True)
        self.register_buffer("head", head)  # [V, H], frozen (the same tensor as the embedding when tied)
        self.embed_norm, self.hidden_norm = nn.RMSNorm(dim, eps), nn.RMSNorm(dim, eps)
        self.qkv, self.out = nn.Linear(2 * dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.mlp_norm, self.norm = nn.RMSNorm(dim, eps), nn.RMSNorm(dim, eps)
        self.gate_up = nn.Linear(dim, 2 * text_config.intermediate_size, bias=False)
        self.down = nn.Linear(text_config.intermediate_size, dim, bias=False)

    def forward(self, hidden, next_ids):
        """[B, T, L*H] target features and [B, T] next tokens -> [B, T, H] draft states (before the head)."""
        h = self.fc(hidden).float()  # the residual stream stays float32 under autocast
        x = torch.cat([self.embed_norm(self.embed(next_ids)), self.hidden_norm(h)], dim=-1)
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(rotate(q, self.theta), rotate(k, self.theta), v, is_causal=True)
        h = h + self.out(attended.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.gate_up(self.mlp_norm(h)).chunk(2, dim=-1)
        return self.norm(h + self.down(F.silu(gate) * up))


def shift(batch: dict):
    """The one place positions move: (features at t, token t+1, target's final state at t+1, supervised)."""
    return (batch["target_hidden_states"][:, :-1], batch["input_ids"][:, 1:].long(),
            batch["target_last_hidden_states"][:, 1:], batch["loss_mask"][:, 1:].bool())


def misfit(manifest: dict, target: Path, text) -> list[str]:
    """Why the cache (or stream) of `manifest` was not built from this target (empty when it fits): its
    config (`text`) first, then, when those agree and the manifest has one, the fingerprint of its weights."""
    problems = []
    if manifest["hidden_size"] != text.hidden_size:
        problems.append(f"hidden size: the cache has {manifest['hidden_size']}, {target} has {text.hidden_size}")
    outside = [k for k in manifest["target_layer_ids"] if not -1 <= k < text.num_hidden_layers - 1]
    if outside:
        problems.append(f"layer ids {outside} of the cache are not capturable layers of {target} "
                        f"({text.num_hidden_layers} decoder layers)")
    recorded = manifest.get("model_fingerprint")  # fuelline format and streams: sha256 of config and weights
    if not problems and recorded and recorded != model_fingerprint(target):
        problems.append(f"{target} is not the model the cache was built from (its weights differ)")
    return problems


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--cache", type=Path, help="target cache directory")
    source.add_argument("--stream", type=Path, help="a streaming target cache (`fuelline cache stream`), read while "
                                                    "it is built")
    parser.add_argument("--target-model", type=Path, help="default: the manifest's target_model_name_or_path")
    parser.add_argument("--steps", type=int,
                        help="at most this many (default: 300 from a cache, every epoch of a stream)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch (from a cache)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--log-every", type=int, default=50, help="steps per reported interval")
    parser.add_argument("--json-out", type=Path, help="write the metrics here: first = step 1, final = the last interval")
    stream = parser.add_argument_group("with --stream")
    stream.add_argument("--consumer", default="train", help="the name this trainer reads and acknowledges under "
                                                            "(one of the stream's --consumers)")
    stream.add_argument("--batch-size", type=int, default=8, help="samples per batch")
    stream.add_argument("--checkpoint", type=Path, help="the draft, its optimizer and the stream's position, saved "
                                                        "here every --checkpoint-every steps and at the end; a run "
                                                        "that finds it resumes from it")
    stream.add_argument("--checkpoint-every", type=int, default=50)
    stream.add_argument("--acknowledge", choices=("yielded", "checkpoint"), default="yielded",
                        help="a partition may be deleted once read (yielded), or once a saved checkpoint is past it")
    args = parser.parse_args(argv)
    if args.stream is None and args.checkpoint is not None:
        parser.error("--checkpoint resumes a --stream run (a cache is read in a sampler's order)")
    if args.acknowledge == "checkpoint" and args.checkpoint is None:
        parser.error("--acknowledge checkpoint needs --checkpoint: the acknowledgements follow the saved checkpoints")
    return args


def cache_batches(args, dataset: CacheDataset):
    """The cache's batches under a token budget, epoch after epoch."""
    sampler = LengthGroupedBatchSampler(dataset.lengths, max_tokens=args.max_tokens, seed=args.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=CacheCollator(),
                                         num_workers=args.workers, persistent_workers=args.workers > 0)
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from loader


def stream_batches(args, dataset: StreamingCacheDataset):
    """The stream's batches as its builder publishes them, from the dataset's position to the end of
    its last epoch (workers start again each epoch, with the dataset's epoch)."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, collate_fn=CacheCollator(),
                                         num_workers=args.workers)
    for epoch in range(dataset.epoch, dataset.epochs):
        dataset.set_epoch(epoch)
        yield from loader


class Checkpoint:
    """The trained weights, the optimizer and the stream's position in one file, replaced atomically."""

    def __init__(self, path: Path, draft: nn.Module, optimizer, dataset: StreamingCacheDataset, acknowledge: bool):
        self.path, self.draft, self.optimizer, self.dataset = path, draft, optimizer, dataset
        self.acknowledge = acknowledge

    def load(self) -> int:
        """The step the checkpoint was saved at (0 when there is none), its state loaded."""
        if not self.path.exists():
            return 0
        state = torch.load(self.path, weights_only=True)
        self.draft.load_state_dict(state["draft"], strict=False)  # the frozen embedding and head are the target's
        self.optimizer.load_state_dict(state["optimizer"])
        self.dataset.load_state_dict(state["stream"])
        print(f"resumed from {self.path}: step {state['step']}, epoch {state['stream']['epoch']}, sample "
              f"{state['stream']['position']:,} of this rank's", flush=True)
        return state["step"]

    def save(self, step: int, batch: dict) -> None:
        """After `batch`; then, with acknowledge, what the checkpoint is past may be deleted."""
        stream = self.dataset.state_dict(after=batch)
        trained = {name: p for name, p in self.draft.named_parameters() if p.requires_grad}
        temporary = self.path.with_name(self.path.name + ".tmp")
        torch.save({"draft": trained, "optimizer": self.optimizer.state_dict(), "step": step, "stream": stream},
                   temporary)
        os.replace(temporary, self.path)
        if self.acknowledge:
            self.dataset.acknowledge(stream)


def reported(step: int, interval: list[tuple[float, int, int]]) -> dict:
    """The interval's KL and top-1 per supervised position, printed."""
    total, agreed, positions = map(sum, zip(*interval))
    print(f"step {step:>5} | KL {total / positions:.4f} nats | top-1 {agreed / positions:.2%} "
          f"| {positions:,} supervised positions", flush=True)
    return {"step": step, "loss": total / positions, "top1": agreed / positions}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available to this torch")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)

    if args.stream:
        dataset = StreamingCacheDataset(args.stream, args.consumer, seed=args.seed, batch_size=args.batch_size,
                                        acknowledge=args.acknowledge)
        source, steps = args.stream, args.steps
    else:
        dataset = CacheDataset(args.cache)
        source, steps = args.cache, 300 if args.steps is None else args.steps
    target = args.target_model or Path(dataset.manifest["target_model_name_or_path"])
    if not (target / "config.json").exists():
        sys.exit(f"target model {target}: no config.json there; pass --target-model DIR")
    _, text = model_config(target)
    problems = misfit(dataset.manifest, target, text)
    if problems:
        sys.exit(f"the cache {source} does not fit the target model, nothing trained:\n  " + "\n  ".join(problems))

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    embedding = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings().weight.detach()
    draft = Draft(len(dataset.manifest["target_layer_ids"]), text, embedding, head).to(device)
    del model
    trained = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.lr, weight_decay=0.0)
    hidden_dtype = torch.bfloat16 if cuda else torch.float32

    checkpoint, step = None, 0
    if args.stream:
        if args.checkpoint:
            checkpoint = Checkpoint(args.checkpoint, draft, optimizer, dataset, args.acknowledge == "checkpoint")
            step = checkpoint.load()
        batches = stream_batches(args, dataset)
        samples = f"stream {args.stream} as {args.consumer!r}, {dataset.epochs} epoch(s) of {dataset.rank_samples():,}"
    else:
        batches = cache_batches(args, dataset)
        samples = f"{len(dataset):,}"
    print(f"{device.type}: {samples} samples, layers {dataset.manifest['target_layer_ids']}, hidden "
          f"{dataset.manifest['hidden_size']}, {dataset.manifest['hidden_dtype']}; "
          f"{sum(p.numel() for p in trained):,} trained parameters", flush=True)

    history, interval, samples, batch = [], [], 0, None
    for batch in CUDAPrefetcher(batches, device, transform=widen_hidden):
        samples += len(batch["input_ids"])
        hidden, next_ids, last, mask = shift(batch)
        if mask.any():  # else nothing supervised after the shift: no step
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
                states = draft(hidden.to(hidden_dtype), next_ids)
                draft_logits = (states[mask] @ draft.head.T).float()
                with torch.no_grad():
                    target_logits = (last[mask].to(hidden_dtype) @ draft.head.T).float()
            loss = F.kl_div(draft_logits.log_softmax(-1), target_logits.log_softmax(-1), log_target=True,
                            reduction="batchmean")
            loss.backward()
            nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            agree = int((draft_logits.argmax(-1) == target_logits.argmax(-1)).sum())
            interval.append((loss.item() * len(draft_logits), agree, len(draft_logits)))
            if not history or step % args.log_every == 0 or step == steps:
                history.append(reported(step, interval))
                interval = []
            if checkpoint and step % args.checkpoint_every == 0:
                checkpoint.save(step, batch)
            if step == steps:
                break
    if interval:  # the stream ended inside an interval
        history.append(reported(step, interval))
    if checkpoint and batch is not None:
        checkpoint.save(step, batch)

    first, final = (history[0], history[-1]) if history else ({}, {})  # none: a resumed stream had nothing left
    metrics = {"steps": step, "samples": samples, "first_loss": first.get("loss"), "final_loss": final.get("loss"),
               "first_top1": first.get("top1"), "final_top1": final.get("top1"), "history": history,
               "device": device.type}
    if args.json_out:
        args.json_out.write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


if __name__ == "__main__":
    main()
