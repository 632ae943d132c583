"""Batched beam search over the model interface of seq2seq.models.interface: all sentences x beams decode
as one batch.

Beam search keeps, per sentence, K open hypotheses (never containing EOS) and the K best finished
ones, all as (B, K) tensors, so a step is a handful of tensor ops for the whole batch. Of the 2K best
extensions, the EOS ones ranked within the first K finish (as in fairseq, so beam 1 is greedy),
scored by the GNMT length penalty lp(L) = ((5 + L) / 6)^alpha with L counting EOS; the best K others
stay open. A sentence is done when K hypotheses have finished, when no open one can still beat its
n-th best finished one, or at its length limit; done sentences leave the batch. Tokens and attention
weights are recovered at the end through the back-pointers: nothing is copied along beams per step.

Dimension letters (the table in seq2seq.models.interface): B batch, R sentences still open, K beam, S source
length, T steps, V vocabulary, N heads (multi-head models).
"""

from collections.abc import Callable

import torch
from torch import Tensor

from seq2seq.data.tokenizer import BOS, EOS, PAD
from seq2seq.decoding.search_config import (
    Hypotheses,
    SearchConfig,
    logits_buffer,
    output_limits,
    step_log_probs,
)
from seq2seq.models.interface import Seq2Seq, reorder_state


def gnmt_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT length penalty lp = ((5 + length) / 6)^alpha; alpha = 0 ranks by raw log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    src_lens: Tensor,
    src_mask: Tensor,
    search: SearchConfig = SearchConfig(),
    check: Callable[[], None] | None = None,
) -> Hypotheses:
    """Batched beam search: all sentences x beams decode as one batch of B * K rows.

    Args:
        src: (B, S) source ids; src_lens: (B,); src_mask: (B, S) bool.
        search: K = `beam` hypotheses kept open per sentence; finished ones are ranked by score /
            lp(len) with alpha = `length_penalty`; EOS is forced at `limits`; `nbest` (<= K)
            finished hypotheses per sentence come back in `Hypotheses.nbest`.
        check: called before every step; what it raises ends the search (a server's deadline).

    Returns:
        The best hypothesis of each sentence, plus its `nbest` list sorted by normalised score.
    """
    B, K, dev = src.size(0), search.beam, src.device
    alpha, nbest = search.length_penalty, search.nbest
    # Encoding (keys projected included) runs once per sentence; its K copies are tiled rows.
    state = reorder_state(
        model.encode(src, src_lens, src_mask), torch.arange(B, device=dev).repeat_interleave(K)
    )
    limits = output_limits(model, search, src_lens).to(dev)  # (B,)
    active = torch.arange(B, device=dev)  # (R,) the sentences still decoding
    alive = torch.full((B, K), -torch.inf, device=dev)  # (R, K) log-prob of each open hypothesis
    alive[:, 0] = 0.0  # the K rows start identical: only one may be extended at step 0
    prev = torch.full((B * K,), BOS, dtype=torch.long, device=dev)  # (R * K,)
    fin_norm = torch.full((B, K), -torch.inf, device=dev)  # (B, K) sorted, best first
    fin_raw = torch.full((B, K), -torch.inf, device=dev)  # (B, K)
    fin_end = torch.zeros((B, K), dtype=torch.long, device=dev)  # (B, K) step of the EOS
    fin_from = torch.zeros((B, K), dtype=torch.long, device=dev)  # (B, K) beam that emitted it
    hist_tokens, hist_from, hist_weights = [], [], []  # per step, (B, K) and (B, K, [N,] S)
    in_beam = torch.arange(2 * K, device=dev) < K  # (2K,) candidate ranks that fit in the beam
    beams = torch.arange(K, device=dev)  # (K,)
    next_limit = int(limits.min())  # the nearest length limit among the open sentences
    buffer = logits_buffer(model, B * K, dev)  # (B * K, V) or None
    for t in range(int(limits.max())):
        if check is not None:
            check()
        R = active.numel()
        out = None if buffer is None else buffer[: R * K]  # (R * K, V)
        logits, weights, state = model.step(state, prev, out)  # (R * K, V), (R * K, [N,] S)
        V = logits.size(-1)
        log_probs = step_log_probs(logits)  # (R * K, V)
        if t + 1 >= next_limit:  # known on the host: most steps have no sentence at its limit
            # A row at its sentence's length limit may only end: EOS is all it can emit.
            at_limit = (limits[active] <= t + 1).repeat_interleave(K)  # (R * K,)
            not_eos = torch.arange(V, device=dev) != EOS  # (V,)
            log_probs.masked_fill_(at_limit[:, None] & not_eos, -torch.inf)
        # Two-stage top-k: a row's best 2K tokens hold all the candidates the beam could keep from
        # it, so neither the (R, K * V) sum nor a top-k over K * V entries is ever formed.
        W = min(2 * K, V)
        row_scores, row_tok = log_probs.topk(W, dim=1)  # (R * K, W)
        cand = (alive[:, :, None] + row_scores.view(R, K, W)).view(R, K * W)  # (R, K * W)
        cand_scores, cand_idx = cand.topk(2 * K, dim=1)  # (R, 2K), sorted
        cand_from = cand_idx // W  # (R, 2K) the beam each candidate extends
        cand_tok = row_tok.view(R, K * W).gather(1, cand_idx)  # (R, 2K)
        is_eos = cand_tok == EOS  # (R, 2K)
        # Open beams: the best K extensions that are not EOS (there are at least K of them).
        open_scores, open_pos = cand_scores.masked_fill(is_eos, -torch.inf).topk(K, dim=1)  # (R, K)
        open_from, open_tok = cand_from.gather(1, open_pos), cand_tok.gather(1, open_pos)  # (R, K)
        # Finished: EOS extensions that would have been in the beam (rank < K), merged with the old.
        ends = is_eos & in_beam & (cand_scores > -torch.inf)  # (R, 2K)
        new_norm = (cand_scores / gnmt_penalty(t + 1, alpha)).masked_fill(~ends, -torch.inf)
        merged_norm = torch.cat([fin_norm[active], new_norm], 1)  # (R, 3K)
        fin_norm_r, pos = merged_norm.topk(K, dim=1)  # (R, K)
        step = torch.full_like(cand_from, t)
        fin_norm[active] = fin_norm_r
        new_raw = cand_scores.masked_fill(~ends, -torch.inf)  # (R, 2K)
        fin_raw[active] = torch.cat([fin_raw[active], new_raw], 1).gather(1, pos)
        fin_end[active] = torch.cat([fin_end[active], step], 1).gather(1, pos)
        fin_from[active] = torch.cat([fin_from[active], cand_from], 1).gather(1, pos)
        # Back-pointers and weights in full-batch buffers: done sentences keep what they had.
        hist_tokens.append(open_tok.new_full((B, K), PAD).index_copy_(0, active, open_tok))
        hist_from.append(open_from.new_zeros((B, K)).index_copy_(0, active, open_from))
        w = weights.view(R, K, *weights.shape[1:])  # (R, K, [N,] S)
        hist_weights.append(w.new_zeros((B, *w.shape[1:])).index_copy_(0, active, w))
        # Done: K finished, or the best open beam cannot beat the n-th finished at any length.
        limit_r = limits[active]  # (R,)
        best_lp = gnmt_penalty(limit_r, alpha).clamp_min(gnmt_penalty(t + 2, alpha))  # (R,)
        bound = open_scores[:, 0] / best_lp  # (R,) open scores are <= 0, so a larger lp only helps
        done = (fin_norm_r[:, K - 1] > -torch.inf) | (fin_norm_r[:, nbest - 1] >= bound)
        done |= limit_r <= t + 1
        # One host sync per step; it pays for itself by dropping done sentences from the batch.
        keep = (~done).nonzero().squeeze(1)  # (R',)
        if keep.numel() == 0:
            break
        if keep.numel() < R:
            next_limit = int(limits[active[keep]].min())
        # Reorder the beams and drop done sentences in one index_select per state tensor; what
        # depends on the source alone is equal across a sentence's beams: it moves only when
        # sentences leave.
        rows = (keep[:, None] * K + open_from[keep]).view(-1)  # (R' * K,)
        leaving = keep.numel() < R
        sentence_rows = (keep[:, None] * K + beams).view(-1) if leaving else None  # (R' * K,)
        state = {
            name: _moved(value, rows, sentence_rows, model.source_state(name))
            for name, value in state.items()
        }
        prev = open_tok[keep].view(-1)  # (R' * K,)
        alive = open_scores[keep]  # (R', K)
        active = active[keep]  # (R',)
    return _backtrack(
        fin_raw, fin_norm, fin_end, fin_from, hist_tokens, hist_from, hist_weights, src_lens, nbest
    )


def _moved(value: Tensor, rows: Tensor, sentence_rows: Tensor | None, source: bool) -> Tensor:
    """A state tensor after a step's reordering: `rows` for what hypotheses carry; `sentence_rows`
    (None: no sentence left) for what depends on the source alone."""
    if not source:
        return value.index_select(0, rows)
    return value if sentence_rows is None else value.index_select(0, sentence_rows)


def _backtrack(
    fin_raw: Tensor,
    fin_norm: Tensor,
    fin_end: Tensor,
    fin_from: Tensor,
    hist_tokens: list[Tensor],
    hist_from: list[Tensor],
    hist_weights: list[Tensor],
    src_lens: Tensor,
    nbest: int,
) -> Hypotheses:
    """Follow the back-pointers of the `nbest` best finished hypotheses of all sentences at once."""
    B, T = fin_raw.size(0), len(hist_tokens)
    tokens, froms = torch.stack(hist_tokens), torch.stack(hist_from)  # (T, B, K)
    weights = torch.stack(hist_weights)  # (T, B, K, [N,] S)
    end, origin = fin_end[:, :nbest], fin_from[:, :nbest]  # (B, n)
    rows_b = torch.arange(B, device=end.device)[:, None]  # (B, 1)
    out_tokens = torch.empty((T, B, nbest), dtype=torch.long, device=end.device)  # (T, B, n)
    out_weights = weights.new_empty((T, B, nbest, *weights.shape[3:]))  # (T, B, n, [N,] S)
    ptr = torch.zeros_like(end)  # (B, n) the open beam each hypothesis went through at step s
    for s in reversed(range(T)):  # steps after a hypothesis's EOS fill garbage that is cut below
        here = end == s
        # (B, n) the row that computed step s: where it ended, the beam its EOS came from
        row = torch.where(here, origin, froms[s].gather(1, ptr))
        out_tokens[s] = torch.where(here, EOS, tokens[s].gather(1, ptr))
        out_weights[s] = weights[s][rows_b, row]  # (B, n, [N,] S)
        ptr = row
    token_rows = out_tokens.permute(1, 2, 0).tolist()  # (B, n, T)
    maps = out_weights.movedim(0, 2).float().cpu()  # (B, n, T, [N,] S)
    raw, norm = fin_raw[:, :nbest].cpu(), fin_norm[:, :nbest].cpu()  # (B, n)
    found = (norm > -torch.inf).sum(1).tolist()  # a tiny vocabulary can leave fewer than n
    lens, ends = src_lens.tolist(), end.tolist()
    per_sentence = []
    for b in range(B):
        n = max(found[b], 1)
        per_sentence.append(
            Hypotheses(
                tokens=[token_rows[b][i][: ends[b][i]] for i in range(n)],
                scores=raw[b, :n],
                weights=[maps[b, i, : ends[b][i] + 1, ..., : lens[b]] for i in range(n)],
                normalized=norm[b, :n],
            )
        )
    return Hypotheses(
        tokens=[h.tokens[0] for h in per_sentence],
        scores=fin_raw[:, 0],
        weights=[h.weights[0] for h in per_sentence],
        normalized=fin_norm[:, 0],
        nbest=per_sentence,
    )
