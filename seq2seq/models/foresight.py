"""Target foresight: an alignment head whose query has read the target word it aligns.

The Bahdanau attention that places target piece y_t is scored with s_{t-1}, before the decoder has
read y_{t-1}, let alone y_t. Peter, Nix & Ney (2017, "Generating alignments using target foresight
in attention-based neural machine translation") give the attention y_t itself. Here that reading is
a small head beside a trained GRU translator, kept out of its prediction path: the translator is
frozen, translates exactly as before, and the head reads its states.

For target piece t, with s_t the decoder's state after step t (it has read y_{t-1} and c_t, and is
what predicts y_t), E y_t the embedding of y_t (the translator's own) and h_j the encoder states:

    q_t    = [s_t; E y_t]                        the query has read y_t
    f_tj   = w_f^T tanh(W_q q_t + W_k h_j)       an additive scorer of its own (seq2seq.models.attention)
    beta_t = masked softmax of f_t               the foresight weights: the alignment of y_t
    g_t    = sum_j beta_tj h_j
    logits = W_g tanh(W_p g_t)                   W_g: the translator's generator, frozen

It is trained as Zenkel, DeNero & Wu (2019) train their alignment layer: predict y_t from the source
context g_t alone (cross-entropy, no alignment labels). The query knows y_t, and g_t is a mix of
encoder states, so the weights that predict y_t best put their mass on the source words that
translate it. Fitting it is seq2seq.alignment.foresight's; this module is the math.

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, T target length,
E embedding, H hidden, A attention size, V vocabulary.
"""

from typing import Any

import torch
from torch import Tensor, nn

from seq2seq.models.attention import AdditiveScorer, masked_softmax
from seq2seq.models.interface import Seq2Seq


class ForesightHead(nn.Module):
    """The foresight head of a GRU translator with hidden size H and embeddings of size E.

    Args:
        hidden_size: H, the translator's decoder state and encoder output size.
        emb_size: E, its target embedding size (and its generator's input size).
        attn_size: A, the scorer's size (None: H).
    """

    def __init__(self, hidden_size: int, emb_size: int, attn_size: int | None = None) -> None:
        super().__init__()
        self.sizes = {"hidden_size": hidden_size, "emb_size": emb_size, "attn_size": attn_size}
        self.scorer = AdditiveScorer(hidden_size + emb_size, hidden_size, attn_size)
        self.predict = nn.Linear(hidden_size, emb_size)  # W_p: context -> the generator's input

    def forward(
        self, dec_states: Tensor, tgt_emb: Tensor, enc_out: Tensor, src_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The foresight weights and the features that predict y_t from them.

        Args: dec_states (B, T, H) s_1..s_T; tgt_emb (B, T, E) of y_1..y_T (the pieces aligned);
        enc_out (B, S, H); src_mask (B, S) bool. Returns weights (B, T, S) and features (B, T, E)
        for the generator.
        """
        query = torch.cat([dec_states, tgt_emb], dim=-1)  # (B, T, H + E)
        proj_keys = self.scorer.project_keys(enc_out)  # (B, S, A), once for all steps
        scores = torch.stack([self.scorer(q, proj_keys) for q in query.unbind(1)], 1)  # (B, T, S)
        weights = masked_softmax(scores, src_mask.unsqueeze(1))  # (B, T, S)
        context = torch.bmm(weights, enc_out)  # (B, T, H)
        return weights, torch.tanh(self.predict(context))  # (B, T, S), (B, T, E)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the head (`from_state` rebuilds it): sizes and weights."""
        return {"sizes": dict(self.sizes), "weights": self.state_dict()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "ForesightHead":
        """The head `state()` described."""
        head = cls(**state["sizes"])
        head.load_state_dict(state["weights"])
        return head


def head_for(model: Seq2Seq, attn_size: int | None = None) -> ForesightHead:
    """A fresh head sized for `model`, which must be a GRU translator (it reads the decoder's states)."""
    decoder = getattr(model, "decoder", None)
    if not hasattr(decoder, "unroll"):
        raise ValueError(
            f"a foresight head reads a GRU decoder's states; {type(model).__name__} has none"
        )
    hidden = decoder.bridge.out_features  # H
    return ForesightHead(hidden, decoder.embedding.embedding_dim, attn_size)


def translator_states(model: Seq2Seq, batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """What the head reads of the translator, teacher-forced on `batch` (a `collate`d one, on the
    model's device): the translator runs as in teacher forcing (`encode`, then its decoder's `unroll`
    over y_0..y_{T-1}). Gradients are the caller's business (the fit runs this under no_grad).

    Returns dec_states (B, T, H) s_1..s_T, tgt_emb (B, T, E) of y_1..y_T, enc_out (B, S, H) and
    src_mask, tgt_mask as the batch's.
    """
    decoder = model.decoder
    state = model.encode(batch["src"], batch["src_lens"], batch["src_mask"])
    emb_in = decoder.embed(batch["tgt_in"])  # (B, T, E) of y_0..y_{T-1}
    dec_states, _, _ = decoder.unroll(state, emb_in)  # (B, T, H) s_1..s_T
    return {
        "dec_states": dec_states,
        "tgt_emb": decoder.embedding(batch["tgt_out"]),  # (B, T, E) of y_1..y_T: the pieces aligned
        "enc_out": state["enc_out"],  # (B, S, H)
        "src_mask": batch["src_mask"],  # (B, S)
        "tgt_mask": batch["tgt_mask"],  # (B, T)
    }


def foresight_weights(head: ForesightHead, states: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The head over `translator_states`: weights (B, T, S), zero on padding steps, and its
    features (B, T, E)."""
    weights, features = head(
        states["dec_states"], states["tgt_emb"], states["enc_out"], states["src_mask"]
    )  # (B, T, S), (B, T, E)
    return weights * states["tgt_mask"].unsqueeze(-1), features
