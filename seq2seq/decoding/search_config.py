"""What a search is asked for and what it gives back: `SearchConfig` (beam size, length penalty,
output limits, n-best) and `Hypotheses` (ids, scores and the attention behind each output token).

Both searches (seq2seq.decoding.search for greedy, seq2seq.decoding.beam for beam search) read the one and return the
other; the scripts map their flags onto `SearchConfig`, so its defaults live in one place.

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, N heads.
"""

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from seq2seq.data.tokenizer import BOS, PAD
from seq2seq.errors import UserError
from seq2seq.models.interface import Seq2Seq

NEVER = (PAD, BOS)  # ids a translation never contains; banned after the softmax: scores stay true


def _setting(default: float, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class SearchConfig:
    """How to decode: the one home of the search defaults (scripts map their flags onto it). A bad
    value is a UserError naming the setting."""

    beam: int = _setting(5, "beam size K (1: greedy search)")
    length_penalty: float = _setting(1.0, "alpha of the GNMT length penalty ((5 + len) / 6)^alpha")
    max_len_ratio: float = _setting(1.5, "output limit: ratio * source length ...")
    max_len_extra: int = _setting(10, "... + this many tokens")
    nbest: int = _setting(1, "hypotheses returned per sentence (at most the beam size)")

    def __post_init__(self) -> None:
        if self.beam < 1:
            raise UserError(f"`beam` must be at least 1, got {self.beam}")
        if not 1 <= self.nbest <= self.beam:
            raise UserError(
                f"`nbest` must be between 1 and the beam size {self.beam}, got {self.nbest}"
            )
        if self.length_penalty < 0:  # as training's --val-length-penalty; 0 is no penalty
            raise UserError(f"`length_penalty` must be zero or more, got {self.length_penalty}")
        if self.max_len_ratio <= 0:
            raise UserError(f"`max_len_ratio` must be positive, got {self.max_len_ratio}")
        if self.max_len_extra < 0:
            raise UserError(f"`max_len_extra` must be zero or more, got {self.max_len_extra}")

    def limits(self, src_lens: Tensor) -> Tensor:
        """The longest output allowed per sentence: ratio * source length + extra. (B,) -> (B,)."""
        return (src_lens.float() * self.max_len_ratio).long() + self.max_len_extra


@dataclass
class Hypotheses:
    """Search output for a batch, in batch order.

    tokens: one id list per sentence, without BOS and EOS.
    scores: (B,) total log-probability of each hypothesis (EOS included).
    weights: one tensor per sentence, (len + 1, [N,] S) with a row per output token and one for EOS,
        cut to the sentence's real source length: the alignment of what the model actually said.
    normalized: (B,) the length-normalised score beams are ranked by (beam search only).
    nbest: per sentence, its n best hypotheses as a `Hypotheses`, best first (beam search only).
    """

    tokens: list[list[int]]
    scores: Tensor
    weights: list[Tensor]
    normalized: Tensor | None = None
    nbest: "list[Hypotheses] | None" = None


def step_log_probs(logits: Tensor) -> Tensor:
    """A search step's log-probabilities, (B, V) -> (B, V) fp32, with NEVER banned.

    On a CPU the softmax is written over the logits, which the search reads nowhere else: a fresh
    (B, V) tensor there is mapped afresh and page-faults in (measured:
    docs/results/benchmarks.md#against-the-code-issue-38-was-filed-at-on-an-avx2-cpu). The row-wise kernel reads a row before
    it writes it.
    """
    logits = logits.float()  # (B, V)
    if logits.device.type == "cpu":
        log_probs = torch._log_softmax(logits, -1, False, out=logits)
    else:
        log_probs = logits.log_softmax(-1)
    log_probs[:, NEVER] = -torch.inf
    return log_probs  # (B, V)


def logits_buffer(model: Seq2Seq, rows: int, device: torch.device) -> Tensor | None:
    """A (rows, V) buffer a search passes to every `Seq2Seq.step` for its logits (the first rows of
    it as sentences leave), where a fresh tensor a step costs page faults: on a CPU, outside
    autocast. None elsewhere: the step makes its own."""
    if device.type != "cpu" or torch.is_autocast_enabled("cpu"):
        return None
    weight = model.generator.weight  # (V, O)
    return weight.new_empty((rows, weight.size(0)))  # (rows, V)


def output_limits(model: Seq2Seq, search: SearchConfig, src_lens: Tensor) -> Tensor:
    """`search.limits`, and never past what the model reads (a Transformer's positions). (B,)."""
    limits = search.limits(src_lens)  # (B,)
    return limits if model.max_len is None else limits.clamp(max=model.max_len)
