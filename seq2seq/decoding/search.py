"""Decoding over the model interface of seq2seq.models.interface: encode once, then `step` until EOS.

`translate_batch` is the one entry point that validation, evaluation and translation share: greedy
search (here) for beam 1, else beam search (seq2seq.decoding.beam). What a search is asked for and what it
returns, `SearchConfig` and `Hypotheses`, are in seq2seq.decoding.search_config; all of these names can be
imported from here.

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, V vocabulary,
N heads (multi-head models), L output steps.
"""

from collections.abc import Callable

import torch
from torch import Tensor

from seq2seq.data.tokenizer import BOS, EOS, PAD
from seq2seq.decoding.beam import beam_search, gnmt_penalty
from seq2seq.decoding.search_config import (
    Hypotheses,
    SearchConfig,
    logits_buffer,
    output_limits,
    step_log_probs,
)
from seq2seq.models.interface import Seq2Seq, reorder_state

__all__ = [
    "Hypotheses",
    "SearchConfig",
    "beam_search",
    "gnmt_penalty",
    "greedy_search",
    "output_limits",
    "translate_batch",
]


@torch.no_grad()
def greedy_search(
    model: Seq2Seq,
    src: Tensor,
    src_lens: Tensor,
    src_mask: Tensor,
    search: SearchConfig = SearchConfig(),
    check: Callable[[], None] | None = None,
) -> Hypotheses:
    """Pick the most likely token at each step until every sentence has ended (EOS or its limit).

    Args:
        src: (B, S) source ids; src_lens: (B,); src_mask: (B, S) bool.
        search: only its length limit applies (`SearchConfig.limits`).
        check: called before every step; what it raises ends the search (a server's deadline).
    """
    B, dev = src.size(0), src.device
    state = model.encode(src, src_lens, src_mask)
    limits = output_limits(model, search, src_lens)  # (R,)
    active = torch.arange(B, device=dev)  # (R,) the sentences still decoding
    prev = torch.full((B,), BOS, dtype=torch.long, device=dev)  # (R,)
    finished = torch.zeros(B, dtype=torch.bool, device=dev)  # (R,)
    scores = torch.zeros(B, device=dev)  # (B,)
    tokens, weights = [], []  # per step, (B,) and (B, [N,] S): done sentences get PAD and zeros
    buffer = logits_buffer(model, B, dev)  # (B, V) or None
    for t in range(int(limits.max())):
        if check is not None:
            check()
        out = None if buffer is None else buffer[: len(active)]  # (R, V)
        logits, alpha, state = model.step(state, prev, out)  # (R, V), (R, [N,] S)
        log_probs = step_log_probs(logits)  # (R, V)
        prev = log_probs.argmax(-1)  # (R,)
        prev = prev.masked_fill(limits <= t + 1, EOS)  # a sentence at its limit ends here
        prev = prev.masked_fill(finished, PAD)
        step_scores = log_probs.gather(1, prev.unsqueeze(1)).squeeze(1)  # (R,)
        scores.index_add_(0, active, step_scores.masked_fill(finished, 0.0))
        tokens.append(prev.new_full((B,), PAD).index_copy_(0, active, prev))
        weights.append(alpha.new_zeros((B, *alpha.shape[1:])).index_copy_(0, active, alpha))
        finished |= prev == EOS
        if t % 4 == 3:  # a host sync, so only every few steps: then finished sentences leave
            keep = (~finished).nonzero().squeeze(1)  # (R',)
            if keep.numel() == 0:
                break
            if keep.numel() < len(active):
                state = reorder_state(state, keep)
                active, prev, finished, limits = (x[keep] for x in (active, prev, finished, limits))
    out = torch.stack(tokens, 1).tolist()  # (B, L)
    alphas = torch.stack(weights, 1).float().cpu()  # (B, L, [N,] S)
    lens = src_lens.tolist()
    hyps, maps = [], []
    for b, row in enumerate(out):
        length = row.index(EOS) if EOS in row else len(row)
        hyps.append(row[:length])
        maps.append(alphas[b, : length + 1, ..., : lens[b]])
    return Hypotheses(hyps, scores, maps)


def translate_batch(
    model: Seq2Seq,
    batch: dict[str, Tensor],
    search: SearchConfig = SearchConfig(),
    check: Callable[[], None] | None = None,
) -> Hypotheses:
    """Greedy (beam 1) or beam search over a batch with `src`, `src_lens`, `src_mask` on any device.

    The one entry point that validation, evaluation and translation share. `check` is called
    before every step of the search; what it raises ends it.
    """
    if check is not None:  # before the encoder too, which has no steps to check between
        check()
    device = next(model.parameters()).device
    src, src_lens, src_mask = (batch[k].to(device) for k in ("src", "src_lens", "src_mask"))
    if search.beam == 1:
        return greedy_search(model, src, src_lens, src_mask, search, check)
    return beam_search(model, src, src_lens, src_mask, search, check)
