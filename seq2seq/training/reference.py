"""The textbook path of the Bahdanau translator: the same model and weights, none of the fast paths.

`scripts/benchmark.py` times it beside `seq2seq.training.losses.batch_loss`, and tests/test_benchmark.py holds
the two equal in loss and gradients. What it does the slow way, on purpose:

- the keys are re-projected at every decoder step (W_k h_j does not depend on t, but here it is
  recomputed T times);
- the readout and the output layer run inside the time loop, on every padded position;
- the loss is a per-step cross-entropy with the padding masked out;
- batches come from a plain random sampler of a fixed size, padded to their longest sentence.

The decoder math is written against the model's parameters (`decoder.readout.weight`, ...) rather than
its modules' `forward`, so a change to how the fast path computes it is checked against this one. The
GRU update is the one exception: `torch.gru_cell` on the cell's weights, the kernel `nn.GRUCell` calls
(one fused kernel on CUDA), so that both paths launch the same cell and a ratio measures the rest.

Dimension letters: B batch, S source length, T target length, E embedding, H hidden, V vocab.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.utils.data import DataLoader

from seq2seq.data.batching import collate
from seq2seq.data.tokenizer import PAD
from seq2seq.models.rnn import RNNSeq2Seq


def score(model: RNNSeq2Seq, query: Tensor, enc_out: Tensor) -> Tensor:
    """e_j = a(s_{t-1}, h_j), the keys projected afresh on every call.

    Args: query (B, H) the previous decoder state; enc_out (B, S, H). Returns scores (B, S).
    """
    scorer = model.decoder.scorer
    if hasattr(scorer, "key_proj"):  # additive: w_v^T tanh(W_q q + W_k k)
        keys = F.linear(enc_out, scorer.key_proj.weight)  # (B, S, A), every step
        energy = torch.tanh(F.linear(query, scorer.query_proj.weight).unsqueeze(1) + keys)
        return F.linear(energy, scorer.energy.weight).squeeze(-1)  # (B, S)
    scores = torch.bmm(enc_out, query.unsqueeze(-1)).squeeze(-1)  # (B, S)
    return scores * getattr(scorer, "scale", 1.0)  # scaled: / sqrt(d_k)


def reference_loss(
    model: RNNSeq2Seq, batch: dict[str, Tensor], label_smoothing: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher-forced loss the textbook way: smoothed loss sum, NLL sum, real target token count.

    The same values as `seq2seq.training.losses.batch_loss` on the same weights and batch (dropout aside).
    """
    enc, dec = model.encoder, model.decoder
    p_enc, p_dec, training = enc.dropout.p, dec.dropout.p, model.training
    src, src_lens, src_mask = batch["src"], batch["src_lens"], batch["src_mask"]
    tgt_in, tgt_out, tgt_mask = batch["tgt_in"], batch["tgt_out"], batch["tgt_mask"]
    # Encoder: embeddings, dropout, a packed bidirectional GRU.
    emb = F.dropout(F.embedding(src, enc.embedding.weight, PAD), p_enc, training)  # (B, S, E)
    packed = pack_padded_sequence(emb, src_lens.cpu(), batch_first=True, enforce_sorted=False)
    enc_out, _ = pad_packed_sequence(enc.rnn(packed)[0], batch_first=True, total_length=src.size(1))
    half = enc_out.size(-1) // 2
    s = torch.tanh(F.linear(enc_out[:, 0, half:], dec.bridge.weight, dec.bridge.bias))  # (B, H)
    readout, gen, cell = dec.readout, model.generator, dec.cell
    gru = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    loss_sum = nll_sum = enc_out.new_zeros(())
    for t in range(tgt_in.size(1)):
        y = F.embedding(tgt_in[:, t], dec.embedding.weight, PAD)  # (B, E)
        y = F.dropout(y, p_dec, training)
        scores = score(model, s, enc_out).masked_fill(~src_mask, float("-inf"))  # (B, S)
        alpha = scores.softmax(-1)  # (B, S)
        c = torch.bmm(alpha.unsqueeze(1), enc_out).squeeze(1)  # (B, H)
        x = torch.cat([y, c], -1)  # (B, E + H)
        # nn.GRUCell's own kernel, as the fast path runs it: a hand-written cell would add a dozen
        # launches a step, and a GPU ratio would then measure those rather than the paths' work.
        s = torch.gru_cell(x, s, *gru)  # (B, H)
        o = torch.tanh(F.linear(torch.cat([s, c, y], -1), readout.weight, readout.bias))  # (B, E)
        o = F.dropout(o, p_dec, training)
        logits = F.linear(o, gen.weight, gen.bias)  # (B, V), on padded rows too
        log_probs = logits.log_softmax(-1)  # (B, V)
        nll = F.nll_loss(log_probs, tgt_out[:, t], ignore_index=PAD, reduction="sum")
        uniform = -(log_probs.mean(-1) * tgt_mask[:, t]).sum()
        loss_sum = loss_sum + (1.0 - label_smoothing) * nll + label_smoothing * uniform
        nll_sum = nll_sum + nll.detach()
    return loss_sum, nll_sum, tgt_mask.sum()


def textbook_loader(dataset, batch_size: int, max_len: int, seed: int = 1) -> DataLoader:
    """Random batches of `batch_size` pairs of a tokenized split, padded to their longest sentence.

    `dataset` has columns src_ids, tgt_ids, index, src_len, tgt_len (TranslationDataModule.datasets);
    pairs longer than `max_len` subwords are left out, as the bucketed loader does.
    """
    longer = np.maximum(np.asarray(dataset["src_len"][:]), np.asarray(dataset["tgt_len"][:]))
    rows = np.flatnonzero(longer <= max_len)
    data = dataset.select_columns(["src_ids", "tgt_ids", "index"]).select(rows)
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(data, batch_size, shuffle=True, collate_fn=collate, generator=gen)
