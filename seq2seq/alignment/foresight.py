"""Fitting a foresight head (seq2seq.models.foresight) on a frozen translator, and keeping it in a
checkpoint.

The translator is frozen (eval mode, no dropout, no gradients); only the head learns, to predict each
target piece y_t of the training pairs from the source context its weights read (Zenkel et al. 2019's
objective: no alignment labels). The loss is the cross-entropy over real target pieces, EOS included,
through the translator's own generator (frozen too). A few hundred updates of Adam suffice; the
`seq2seq fit-foresight` command (seq2seq.commands.foresight) runs it and writes the head into a copy
of the checkpoint, under the key `foresight`, which older code ignores: the copy loads, translates and
aligns as the original did. A Translator reads alignments with it when asked for the `foresight`
reading (seq2seq.decoding.translator).
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.cli import CHECKS
from seq2seq.data.batching import TokenBudgetBatchSampler, collate
from seq2seq.errors import UserError
from seq2seq.models.foresight import (
    ForesightHead,
    foresight_weights,
    head_for,
    translator_states,
)
from seq2seq.models.interface import Seq2Seq

CHECKPOINT_KEY = "foresight"  # where a checkpoint keeps the head (`ForesightHead.state()`)


@dataclass(frozen=True)
class FitSettings:
    """How the head is fitted (the flags of `seq2seq fit-foresight`)."""

    steps: int = 600  # updates (docs/guides/alignments.md: what 300, 600 and 1,200 gave)
    batch_tokens: int = 1024  # padded tokens a batch, the longer side of each pair
    lr: float = 1e-3  # Adam's learning rate
    seed: int = 1  # the head's initial weights and the batches' order
    attn_size: int | None = None  # the head's scorer size (None: the translator's hidden size)

    def check(self) -> None:
        """A bad setting is a UserError naming its flag."""
        for flag, value in (("--steps", self.steps), ("--batch-tokens", self.batch_tokens)):
            if value < 1:
                raise UserError(f"{flag} {value}: must be at least 1")
        if not self.lr > 0:
            raise UserError(f"--lr {self.lr}: must be positive")
        in_range, seeds_are = CHECKS["seed"]  # as train's --seed
        if not in_range(self.seed):
            raise UserError(f"--seed {self.seed}: {seeds_are}")


@dataclass(frozen=True)
class ForesightFit:
    """A fitted head and how the fit went."""

    head: ForesightHead
    losses: tuple[float, ...]  # the loss of each update, in order
    seconds: float  # the fit's wall time
    cpu_seconds: (
        float  # the CPU time of this process over the fit (a shared machine's wall time is not)
    )
    target_tokens: int  # real target pieces read


def pair_batches(
    src_ids: list[list[int]], tgt_ids: list[list[int]], batch_tokens: int, seed: int
) -> Iterator[dict[str, Tensor]]:
    """Endless `collate`d batches of the pairs (ids without EOS/BOS), reshuffled every pass."""
    if not src_ids:
        raise UserError("no sentence pairs to fit the foresight head on")
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src_ids, tgt_ids, strict=True)]
    sampler = TokenBudgetBatchSampler(lengths, batch_tokens, shuffle=True, seed=seed)
    while True:
        for rows in sampler:
            yield collate(
                [{"src_ids": src_ids[r], "tgt_ids": tgt_ids[r], "index": r} for r in rows]
            )
        sampler.set_epoch(sampler.epoch + 1)


def fit_foresight(
    model: Seq2Seq,
    batches: Iterator[dict[str, Tensor]],
    settings: FitSettings = FitSettings(),
    device: str | torch.device = "cpu",
) -> ForesightFit:
    """Fit a fresh head on the frozen `model` over `settings.steps` of `batches`.

    `model` is put in eval mode and not changed. A model without GRU decoder states (the
    Transformer) is a UserError.
    """
    settings.check()
    torch.manual_seed(settings.seed)
    try:
        head = head_for(model, settings.attn_size).to(device)
    except ValueError as err:
        raise UserError(str(err)) from None
    model.eval()
    generator = model.generator  # frozen: its weights are read, never given gradients
    weight, bias = generator.weight.detach(), generator.bias.detach()  # (V, E), (V,)
    optimizer = torch.optim.Adam(head.parameters(), lr=settings.lr)
    losses, tokens = [], 0
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(settings.steps):
        batch = {name: value.to(device) for name, value in next(batches).items()}
        with torch.no_grad():
            states = translator_states(model, batch)
        _, features = foresight_weights(head, states)  # (B, T, E)
        mask = batch["tgt_mask"]  # (B, T)
        logits = F.linear(features[mask], weight, bias)  # (M, V) real pieces only
        loss = F.cross_entropy(logits.float(), batch["tgt_out"][mask])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        tokens += int(mask.sum())
    head.eval()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return ForesightFit(head, tuple(losses), seconds, cpu, tokens)


def head_record(fit: ForesightFit, settings: FitSettings, data: str) -> dict[str, Any]:
    """What a checkpoint keeps under CHECKPOINT_KEY: the head, and how it was fitted."""
    about = {"steps": settings.steps, "batch_tokens": settings.batch_tokens, "lr": settings.lr}
    about |= {"seed": settings.seed, "data": data, "final_loss": fit.losses[-1]}
    return {**fit.head.state(), "fit": about}


def head_of(checkpoint: dict[str, Any]) -> ForesightHead | None:
    """The foresight head a checkpoint holds (eval mode), or None when it holds none."""
    record = checkpoint.get(CHECKPOINT_KEY)
    return None if record is None else ForesightHead.from_state(record).eval()
