"""Decoding over the model interface of seq2seq.models: encode once, then `step`, reorder for beams.

Beam search keeps, per sentence, K open hypotheses (never containing EOS) and the K best finished
ones, all as (B, K) tensors, so a step is a handful of tensor ops for the whole batch. Of the 2K best
extensions, the EOS ones ranked within the first K finish (as in fairseq, so beam 1 is greedy),
scored by the GNMT length penalty lp(L) = ((5 + L) / 6)^alpha with L counting EOS; the best K others
stay open. A sentence is done when K hypotheses have finished, when no open one can still beat its
n-th best finished one, or at its length limit; done sentences leave the batch. Tokens and attention
weights are recovered at the end through the back-pointers: nothing is copied along beams per step.

Dimension letters: B batch, A sentences still open, K beam, S source length, T steps, V vocabulary,
N heads (multi-head models).
"""

import argparse
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq.errors import UserError
from seq2seq.models import Seq2Seq, reorder_state
from seq2seq.tokenizer import BOS, EOS, PAD, Tokenizer

NEVER = (
    PAD,
    BOS,
)  # ids a translation never contains; banned after the softmax, so scores stay true


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


def max_output_lengths(src_lens: Tensor, max_len_ratio: float, max_len_extra: int) -> Tensor:
    """The longest output allowed per sentence: ratio * source length + extra. (B,) -> (B,)."""
    return (src_lens.float() * max_len_ratio).long() + max_len_extra


def gnmt_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT length penalty lp = ((5 + length) / 6)^alpha; alpha = 0 ranks by raw log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def greedy_search(
    model: Seq2Seq,
    src: Tensor,
    src_lens: Tensor,
    src_mask: Tensor,
    max_len_ratio: float = 1.5,
    max_len_extra: int = 10,
) -> Hypotheses:
    """Pick the most likely token at each step until every sentence has ended (EOS or its limit).

    Args:
        src: (B, S) source ids; src_lens: (B,); src_mask: (B, S) bool.
        max_len_ratio, max_len_extra: a sentence stops after ratio * src_len + extra tokens.
    """
    B = src.size(0)
    state = model.encode(src, src_lens, src_mask)
    limits = max_output_lengths(src_lens, max_len_ratio, max_len_extra)  # (B,)
    prev = torch.full((B,), BOS, dtype=torch.long, device=src.device)  # (B,)
    finished = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
    scores = torch.zeros(B, device=src.device)  # (B,)
    tokens, weights = [], []
    for t in range(int(limits.max())):
        logits, alpha, state = model.step(state, prev)  # (B, V), (B, [N,] S)
        log_probs = logits.float().log_softmax(-1)  # (B, V)
        log_probs[:, NEVER] = -torch.inf
        prev = log_probs.argmax(-1)  # (B,)
        prev = prev.masked_fill(limits <= t + 1, EOS)  # a sentence at its limit ends here
        prev = prev.masked_fill(finished, PAD)
        step_scores = log_probs.gather(1, prev.unsqueeze(1)).squeeze(1)  # (B,)
        scores += step_scores.masked_fill(finished, 0.0)
        tokens.append(prev)
        weights.append(alpha)
        finished |= prev == EOS
        if t % 4 == 3 and bool(finished.all()):  # a host sync, so only every few steps
            break
    out = torch.stack(tokens, 1).tolist()  # (B, L)
    alphas = torch.stack(weights, 1).float().cpu()  # (B, L, [N,] S)
    lens = src_lens.tolist()
    hyps, maps = [], []
    for b, row in enumerate(out):
        length = row.index(EOS) if EOS in row else len(row)
        hyps.append(row[:length])
        maps.append(alphas[b, : length + 1, ..., : lens[b]])
    return Hypotheses(hyps, scores, maps)


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src: Tensor,
    src_lens: Tensor,
    src_mask: Tensor,
    beam: int = 5,
    length_penalty: float = 1.0,
    max_len_ratio: float = 1.5,
    max_len_extra: int = 10,
    nbest: int = 1,
) -> Hypotheses:
    """Batched beam search: all sentences x beams decode as one batch of B * K rows.

    Args:
        src: (B, S) source ids; src_lens: (B,); src_mask: (B, S) bool.
        beam: K, hypotheses kept open per sentence.
        length_penalty: alpha of the GNMT penalty; finished hypotheses are ranked by score / lp(len).
        max_len_ratio, max_len_extra: EOS is forced after ratio * src_len + extra tokens.
        nbest: how many finished hypotheses to return per sentence (<= beam), in `Hypotheses.nbest`.

    Returns:
        The best hypothesis of each sentence, plus its `nbest` list sorted by normalised score.
    """
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest must be between 1 and the beam size {beam}, got {nbest}")
    B, K, dev = src.size(0), beam, src.device
    alpha = length_penalty
    # Encoding (keys projected included) runs once per sentence; its K copies are tiled rows.
    state = reorder_state(
        model.encode(src, src_lens, src_mask), torch.arange(B, device=dev).repeat_interleave(K)
    )
    limits = max_output_lengths(src_lens, max_len_ratio, max_len_extra).to(dev)  # (B,)
    active = torch.arange(B, device=dev)  # (A,) the sentences still decoding
    alive = torch.full((B, K), -torch.inf, device=dev)  # (A, K) log-prob of each open hypothesis
    alive[:, 0] = 0.0  # the K rows start identical: only one may be extended at step 0
    prev = torch.full((B * K,), BOS, dtype=torch.long, device=dev)  # (A * K,)
    fin_norm = torch.full((B, K), -torch.inf, device=dev)  # (B, K) sorted, best first
    fin_raw = torch.full((B, K), -torch.inf, device=dev)  # (B, K)
    fin_end = torch.zeros((B, K), dtype=torch.long, device=dev)  # (B, K) step of the EOS
    fin_from = torch.zeros((B, K), dtype=torch.long, device=dev)  # (B, K) beam that emitted it
    hist_tokens, hist_from, hist_weights = [], [], []  # per step, (B, K) and (B, K, [N,] S)
    in_beam = torch.arange(2 * K, device=dev) < K  # (2K,) candidate ranks that fit in the beam
    next_limit = int(limits.min())  # the nearest length limit among the open sentences
    for t in range(int(limits.max())):
        A = active.numel()
        logits, weights, state = model.step(state, prev)  # (A * K, V), (A * K, [N,] S)
        V = logits.size(-1)
        log_probs = logits.float().log_softmax(-1)  # (A * K, V)
        log_probs[:, NEVER] = -torch.inf
        if t + 1 >= next_limit:  # known on the host: most steps have no sentence at its limit
            # A row at its sentence's length limit may only end: EOS is all it can emit.
            at_limit = (limits[active] <= t + 1).repeat_interleave(K)  # (A * K,)
            not_eos = torch.arange(V, device=dev) != EOS  # (V,)
            log_probs.masked_fill_(at_limit[:, None] & not_eos, -torch.inf)
        # Two-stage top-k: a row's best 2K tokens hold all the candidates the beam could keep from
        # it, so neither the (A, K * V) sum nor a top-k over K * V entries is ever formed.
        W = min(2 * K, V)
        row_scores, row_tok = log_probs.topk(W, dim=1)  # (A * K, W)
        cand = (alive[:, :, None] + row_scores.view(A, K, W)).view(A, K * W)  # (A, K * W)
        cand_scores, cand_idx = cand.topk(2 * K, dim=1)  # (A, 2K), sorted
        cand_from = cand_idx // W  # (A, 2K) the beam each candidate extends
        cand_tok = row_tok.view(A, K * W).gather(1, cand_idx)  # (A, 2K)
        is_eos = cand_tok == EOS  # (A, 2K)
        # Open beams: the best K extensions that are not EOS (there are at least K of them).
        open_scores, open_pos = cand_scores.masked_fill(is_eos, -torch.inf).topk(K, dim=1)  # (A, K)
        open_from, open_tok = cand_from.gather(1, open_pos), cand_tok.gather(1, open_pos)  # (A, K)
        # Finished: EOS extensions that would have been in the beam (rank < K), merged with the old.
        ends = is_eos & in_beam & (cand_scores > -torch.inf)  # (A, 2K)
        new_norm = (cand_scores / gnmt_penalty(t + 1, alpha)).masked_fill(~ends, -torch.inf)
        merged_norm = torch.cat([fin_norm[active], new_norm], 1)  # (A, 3K)
        fin_norm_a, pos = merged_norm.topk(K, dim=1)  # (A, K)
        step = torch.full_like(cand_from, t)
        fin_norm[active] = fin_norm_a
        new_raw = cand_scores.masked_fill(~ends, -torch.inf)  # (A, 2K)
        fin_raw[active] = torch.cat([fin_raw[active], new_raw], 1).gather(1, pos)
        fin_end[active] = torch.cat([fin_end[active], step], 1).gather(1, pos)
        fin_from[active] = torch.cat([fin_from[active], cand_from], 1).gather(1, pos)
        # Back-pointers and weights in full-batch buffers: done sentences keep what they had.
        hist_tokens.append(open_tok.new_full((B, K), PAD).index_copy_(0, active, open_tok))
        hist_from.append(open_from.new_zeros((B, K)).index_copy_(0, active, open_from))
        w = weights.view(A, K, *weights.shape[1:])  # (A, K, [N,] S)
        hist_weights.append(w.new_zeros((B, *w.shape[1:])).index_copy_(0, active, w))
        # Done: K finished, or the best open beam cannot beat the n-th finished at any length.
        limit_a = limits[active]  # (A,)
        best_lp = gnmt_penalty(limit_a, alpha).clamp_min(gnmt_penalty(t + 2, alpha))  # (A,)
        bound = open_scores[:, 0] / best_lp  # (A,) open scores are <= 0, so a larger lp only helps
        done = (fin_norm_a[:, K - 1] > -torch.inf) | (fin_norm_a[:, nbest - 1] >= bound)
        done |= limit_a <= t + 1
        # One host sync per step; it pays for itself by dropping done sentences from the batch.
        keep = (~done).nonzero().squeeze(1)  # (A',)
        if keep.numel() == 0:
            break
        if keep.numel() < A:
            next_limit = int(limits[active[keep]].min())
        # Reorder the beams and drop done sentences in one index_select per state tensor.
        rows = (keep[:, None] * K + open_from[keep]).view(-1)  # (A' * K,)
        state = reorder_state(state, rows)
        prev = open_tok[keep].view(-1)  # (A' * K,)
        alive = open_scores[keep]  # (A', K)
        active = active[keep]  # (A',)
    return _backtrack(
        fin_raw, fin_norm, fin_end, fin_from, hist_tokens, hist_from, hist_weights, src_lens, nbest
    )


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
        row = torch.where(
            here, origin, froms[s].gather(1, ptr)
        )  # (B, n) the row that computed step s
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


def translate_batch(
    model: Seq2Seq,
    batch: dict[str, Tensor],
    beam: int = 1,
    length_penalty: float = 1.0,
    max_len_ratio: float = 1.5,
    max_len_extra: int = 10,
    nbest: int = 1,
) -> Hypotheses:
    """Greedy (beam 1) or beam search over a batch with `src`, `src_lens`, `src_mask` on any device.

    The one entry point that validation, evaluation and translation share.
    """
    device = next(model.parameters()).device
    src, src_lens, src_mask = (batch[k].to(device) for k in ("src", "src_lens", "src_mask"))
    if beam == 1 and nbest == 1:
        return greedy_search(model, src, src_lens, src_mask, max_len_ratio, max_len_extra)
    return beam_search(
        model, src, src_lens, src_mask, beam, length_penalty, max_len_ratio, max_len_extra, nbest
    )


def translate_batches(
    model: Seq2Seq,
    batches: Iterable[dict[str, Tensor]],
    beam: int = 1,
    length_penalty: float = 1.0,
    max_len_ratio: float = 1.5,
    max_len_extra: int = 10,
    nbest: int = 1,
) -> Hypotheses:
    """Decode every batch (each with an `index` (B,) of sentence positions) with `translate_batch`
    and return the hypotheses of all sentences in `index` order, scores on the CPU."""
    search = dict(
        beam=beam,
        length_penalty=length_penalty,
        max_len_ratio=max_len_ratio,
        max_len_extra=max_len_extra,
        nbest=nbest,
    )
    order: list[int] = []
    parts: list[Hypotheses] = []
    for batch in batches:
        parts.append(translate_batch(model, batch, **search))
        order.extend(batch["index"].tolist())
    rank = sorted(range(len(order)), key=order.__getitem__)  # position in the output -> in `parts`
    flat = [(h, i) for h in parts for i in range(len(h.tokens))]
    picked = [flat[r] for r in rank]
    scores = torch.cat([h.scores.cpu() for h in parts])[rank] if parts else torch.zeros(0)
    lists = None  # n-best lists come from beam search only
    if parts and parts[0].nbest is not None:
        lists = [h.nbest[i] for h, i in picked]
    return Hypotheses(
        tokens=[h.tokens[i] for h, i in picked],
        scores=scores,
        weights=[h.weights[i] for h, i in picked],
        normalized=torch.cat([h.normalized.cpu() for h in parts])[rank] if lists else None,
        nbest=lists,
    )


def add_search_flags(parser: argparse.ArgumentParser) -> None:
    """The decoding, batching and device flags that evaluate.py and translate.py share."""
    parser.add_argument("--beam", type=int, default=5, help="beam size (1: greedy search)")
    parser.add_argument(
        "--length-penalty", type=float, default=1.0, help="GNMT length penalty alpha"
    )
    parser.add_argument(
        "--max-len-ratio", type=float, default=1.5, help="output limit: ratio * source length"
    )
    parser.add_argument("--max-len-extra", type=int, default=10, help="... + this many tokens")
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--batch-tokens", type=int, default=4096, help="source-token budget per batch"
    )
    size.add_argument(
        "--batch-size", type=int, help="sentences per batch (instead of --batch-tokens)"
    )
    parser.add_argument(
        "--device", default="auto", help="cpu, cuda, cuda:1, ... (auto: cuda if available)"
    )


def check_search_flags(args: argparse.Namespace) -> None:
    """Range checks of the flags `add_search_flags` adds; a bad value is a UserError naming it."""
    for flag in ("beam", "batch_tokens", "batch_size", "max_len_extra"):
        value = getattr(args, flag, None)
        if value is not None and value < (0 if flag == "max_len_extra" else 1):
            raise UserError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    if args.max_len_ratio <= 0:
        raise UserError(f"--max-len-ratio must be positive, got {args.max_len_ratio}")


def translate_lines(
    model: Seq2Seq, tokenizer: Tokenizer, lines: list[str], args: argparse.Namespace
) -> tuple[list[str], list[int], Hypotheses]:
    """Translate raw lines with the flags of `add_search_flags`; a blank line gets a blank translation.

    Returns the detokenized translations in input order, the positions of the non-blank lines, and
    those lines' hypotheses (tokens, scores, weights) in the same order.
    """
    from seq2seq.data import (
        source_loader,  # data pulls in lightning; search itself needs only torch
    )

    kept = [i for i, line in enumerate(lines) if line.strip()]
    batches = source_loader(tokenizer, [lines[i] for i in kept], args.batch_tokens, args.batch_size)
    hyps = translate_batches(
        model,
        batches,
        beam=args.beam,
        length_penalty=args.length_penalty,
        max_len_ratio=args.max_len_ratio,
        max_len_extra=args.max_len_extra,
    )
    out = [""] * len(lines)
    for i, ids in zip(kept, hyps.tokens, strict=True):
        out[i] = tokenizer.decode(ids)
    return out, kept, hyps
