"""The Bahdanau translator's training loss written out step by step: the textbook path the speed
benchmark (seq2seq.benchmarks.speed) times and the tests hold the training path to.

`reference_loss` computes what `seq2seq.training.losses.batch_loss` computes for an `RNNSeq2Seq` with
the `bahdanau` decoder, from the model's parameters and its textbook scorer, in the plainest order
(DESIGN section 1):

    h = BiGRU(emb(x))                          s_0 = tanh(W_init h_1^backward)
    for t = 1..T:
        e_tj = a(s_{t-1}, h_j)                 the keys projected afresh at every step
        alpha_t = softmax(e_t) over real tokens;   c_t = sum_j alpha_tj h_j
        s_t = GRU([emb(y_{t-1}); c_t], s_{t-1})
        logits_t = W_g tanh(W_o [s_t; c_t; emb(y_{t-1})])   on every row, padded ones too
        loss += label-smoothed cross-entropy of logits_t, padding masked out

`scripts/benchmark.py` times it as the textbook path beside the training path with its kernels
(seq2seq.models.kernels), and tests/unit/benchmarks/test_benchmark.py holds the two equal in loss and gradients. Give it
a model without kernels (`seq2seq.models.kernels.textbook` undoes them): the scorer is called as the
module it is. The GRU update is `torch.gru_cell` on the cell's weights, the kernel `nn.GRUCell` calls
(one fused kernel on CUDA), so that both paths launch the same cell and a ratio measures the rest.

Dimension letters: B batch, S source length, T target length, E embedding, H hidden, V vocab.
"""

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seq2seq.models.bahdanau import BahdanauDecoder
from seq2seq.models.rnn import RNNSeq2Seq

PAD = 0  # the padding id of every embedding (`padding_idx`) and of the data's batches


def score(model: RNNSeq2Seq, query: Tensor, enc_out: Tensor) -> Tensor:
    """e_j = a(s_{t-1}, h_j), the keys projected afresh on every call.

    Args: query (B, H) the previous decoder state; enc_out (B, S, H). Returns scores (B, S).
    """
    scorer = model.decoder.scorer
    return scorer(query, scorer.project_keys(enc_out))  # (B, S)


def reference_loss(
    model: RNNSeq2Seq, batch: dict[str, Tensor], label_smoothing: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher-forced loss the textbook way: smoothed loss sum, NLL sum, real target token count.

    The same values as `seq2seq.training.losses.batch_loss` on the same weights and batch (dropout aside).
    """
    enc, dec = model.encoder, model.decoder
    if type(dec) is not BahdanauDecoder:  # a variant's step, or a kernel left plugged in
        raise ValueError(
            f"reference_loss writes out the textbook Bahdanau decoder, not {type(dec).__name__}"
        )
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
        # nn.GRUCell's own kernel, as the model runs it: a hand-written cell would add a dozen
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
