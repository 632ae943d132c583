"""The Bahdanau decoder, and the seam its variants plug into.

Decoder step t (Bahdanau et al., 2015), with s_{t-1} the previous decoder state and h_j the encoder states:

    e_tj = a(s_{t-1}, h_j)                    a = additive | dot | scaled   (seq2seq.models.attention)
    c_t  = sum_j alpha_tj h_j                 alpha_t = masked softmax of e_t
    s_t  = GRU([emb(y_{t-1}); c_t], s_{t-1})
    o_t  = tanh(W_o [s_t; c_t; emb(y_{t-1})])    logits_t = W_g o_t   (W_g: the model's generator)

s_0 = tanh(W_init h_1^backward): the backward GRU's state at the first position has read the whole
sentence.

The seam: a decoder is these steps, `init_state`, `embed`, `attend_and_update`, `output_features`,
`unroll`, and a variant changes one of them, `attend_and_update`: how the step attends and how it
updates the state. It subclasses `BahdanauDecoder`, overrides that method (with `make_cell`, when its
state update reads other inputs than [emb; c], and `__init__`, to add the parameters its step needs),
and is registered by name in `seq2seq.models.rnn.DECODERS`, which
`--decoder` offers. Everything else (the initial state, the embeddings, the readout, teacher forcing,
search) is this class's. The kernels (seq2seq.models.kernels) plug in by exact type, so a variant runs
on its own code, as written.

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, T target length,
E embedding, H hidden, A additive-attention size.
"""

import torch
from torch import Tensor, nn

from seq2seq.models.attention import attend, make_scorer
from seq2seq.models.interface import State


def gru_cell_flops(cell: nn.GRUCell) -> int:
    """Forward matmul FLOPs of one step of `cell` for one row: W_i x and W_h s for 3 gates each."""
    return 2 * 3 * cell.hidden_size * (cell.input_size + cell.hidden_size)


class BahdanauDecoder(nn.Module):
    """GRU decoder whose query is the previous state s_{t-1}; the context enters the GRU input.

    Args:
        embedding: the target embedding (E), shared with the encoder's when tied.
        hidden_size: H, the decoder state's size, equal to the encoder output's.
        score: the scorer's name (a key of seq2seq.models.attention.SCORERS).
        attn_size: the additive scorer's size A (None: H).
        dropout: on the embeddings and the output features.
    """

    def __init__(
        self,
        embedding: nn.Embedding,
        hidden_size: int,
        score: str,
        attn_size: int | None,
        dropout: float,
    ) -> None:
        super().__init__()
        emb_size = embedding.embedding_dim
        self.embedding = embedding
        self.dropout = nn.Dropout(dropout)
        self.bridge = nn.Linear(hidden_size // 2, hidden_size)  # W_init
        self.scorer = make_scorer(score, hidden_size, hidden_size, attn_size)
        self.cell = self.make_cell(emb_size, hidden_size)
        self.readout = nn.Linear(2 * hidden_size + emb_size, emb_size)  # W_o; E so W_g can be tied

    def make_cell(self, emb_size: int, hidden_size: int) -> nn.GRUCell:
        """The cell that gives s_t: GRU([emb(y_{t-1}); c_t], s_{t-1}), input E + H, state H."""
        return nn.GRUCell(emb_size + hidden_size, hidden_size)

    def init_state(self, enc_out: Tensor, src_mask: Tensor) -> State:
        """The state search and teacher forcing start from; keys are projected here, once per batch."""
        half = enc_out.size(-1) // 2
        dec_state = torch.tanh(self.bridge(enc_out[:, 0, half:]))  # (B, H): backward state at 1
        proj_keys = self.scorer.project_keys(enc_out)  # (B, S, A) or (B, S, H)
        return {
            "enc_out": enc_out,
            "proj_keys": proj_keys,
            "src_mask": src_mask,
            "dec_state": dec_state,
        }

    def embed(self, tokens: Tensor) -> Tensor:
        """Args: tokens (B,) or (B, T). Returns embeddings (…, E) after dropout."""
        return self.dropout(self.embedding(tokens))

    def attend_and_update(self, state: State, emb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One Bahdanau step: the seam a variant overrides.

        Args: state: the batch's (`init_state`'s, with "dec_state" s_{t-1} (B, H)); emb (B, E) of
        y_{t-1}. Returns s_t (B, H), c_t (B, H) and alpha_t (B, S), the weights c_t was read with.
        """
        prev = state["dec_state"]  # s_{t-1}, (B, H)
        scores = self.scorer(prev, state["proj_keys"])  # (B, S)
        context, weights = attend(scores, state["src_mask"], state["enc_out"])  # (B, H), (B, S)
        dec_state = self.cell(torch.cat([emb, context], dim=-1), prev)  # (B, H)
        return dec_state, context, weights

    def output_features(self, dec_state: Tensor, context: Tensor, emb: Tensor) -> Tensor:
        """o = tanh(W_o [s; c; emb]) for any leading shape: (…, H), (…, H), (…, E) -> (…, E)."""
        return self.dropout(torch.tanh(self.readout(torch.cat([dec_state, context, emb], dim=-1))))

    def unroll(self, state: State, emb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Steps t = 1..T from state["dec_state"] = s_0 over emb (B, T, E) of y_0..y_{T-1}.

        Returns s_1..s_T (B, T, H), c_1..c_T (B, T, H) and alpha_1..alpha_T (B, T, S).
        """
        states, contexts, weights = [], [], []
        run = state
        for emb_t in emb.unbind(1):  # (B, E) of y_{t-1}
            dec_state, context, alpha = self.attend_and_update(run, emb_t)  # (B, H), (B, H), (B, S)
            run = {**run, "dec_state": dec_state}
            states.append(dec_state)
            contexts.append(context)
            weights.append(alpha)
        return torch.stack(states, 1), torch.stack(contexts, 1), torch.stack(weights, 1)

    def forward(self, state: State, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced unroll. Args: tgt_in (B, T). Returns features (B, T, E), weights (B, T, S).

        The weights of padding steps (after a row's target has ended) are zero.
        """
        emb = self.embed(tgt_in)  # (B, T, E)
        states, contexts, weights = self.unroll(state, emb)  # (B, T, H), (B, T, H), (B, T, S)
        # The readout runs once over all steps after the loop: one large matmul instead of T small ones.
        features = self.output_features(states, contexts, emb)  # (B, T, E)
        real = tgt_in != self.embedding.padding_idx  # (B, T)
        return features, weights * real.unsqueeze(-1)  # (B, T, E), (B, T, S)

    def flops(self, src_len: Tensor | float) -> tuple[Tensor | float, Tensor | float]:
        """Forward matmul FLOPs (2 a multiply-add) for one sentence of `src_len` source tokens:
        (those of the initial state, once a sentence: W_init and the keys; those of one step: the
        score, the context, the GRU cell and the readout). A variant whose step does other work
        states it by overriding this too."""
        H = self.bridge.out_features
        keys, score = self.scorer.flops(src_len)
        readout = 2 * self.readout.in_features * self.readout.out_features  # W_o
        start = 2 * self.bridge.in_features * H + keys
        step = score + src_len * 2 * H + gru_cell_flops(self.cell) + readout  # context: S x H
        return start, step
