"""The conditional GRU decoder (`--decoder cgru`): the decoder of Nematus and Marian.

Decoder step t (Sennrich et al., 2017, "Nematus: a Toolkit for Neural Machine Translation", section
2.3), with s_{t-1} the previous decoder state, E y_{t-1} the previous target word's embedding and h_j
the encoder states:

    s'_t = GRU1(E y_{t-1}, s_{t-1})           the query has read y_{t-1}
    e_tj = a(s'_t, h_j)                       a = additive | dot | scaled   (seq2seq.models.attention)
    c_t  = sum_j alpha_tj h_j                 alpha_t = masked softmax of e_t
    s_t  = GRU2(c_t, s'_t)                    c_t the input, s'_t the state
    o_t  = tanh(W_o [s_t; c_t; E y_{t-1}])    logits_t = W_g o_t   (as the Bahdanau decoder)

Bahdanau's query s_{t-1} has not seen the word the decoder has just emitted; s'_t has, so the
attention of step t can depend on y_{t-1} (DESIGN section 9). The rest of the decoder, s_0 from the
encoder, the embeddings, the readout, teacher forcing and search, is `BahdanauDecoder`'s: this
class is a variant through its seam, `attend_and_update`, and trains and decodes on the code below.
For speed, seq2seq.models.kernels plugs in `DeferredConditionalGRUDecoder`, which computes the same
step with each GRU's gradients gathered once a batch when a CPU trains.

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, E embedding,
H hidden.
"""

from torch import Tensor, nn

from seq2seq.models.attention import attend
from seq2seq.models.bahdanau import BahdanauDecoder, gru_cell_flops
from seq2seq.models.interface import State


class ConditionalGRUDecoder(BahdanauDecoder):
    """Two GRU transitions a step with the attention between them: GRU1 reads the previous word and
    gives the query s'_t; GRU2 reads the context c_t into s'_t and gives s_t. Arguments as
    `BahdanauDecoder`'s."""

    def __init__(
        self,
        embedding: nn.Embedding,
        hidden_size: int,
        score: str,
        attn_size: int | None,
        dropout: float,
    ) -> None:
        super().__init__(embedding, hidden_size, score, attn_size, dropout)  # self.cell: GRU2
        self.query_cell = nn.GRUCell(embedding.embedding_dim, hidden_size)  # GRU1: input E y_{t-1}

    def make_cell(self, emb_size: int, hidden_size: int) -> nn.GRUCell:
        """GRU2, in the place of Bahdanau's cell GRU([emb; c], s): input c_t (H), state s'_t (H)."""
        return nn.GRUCell(hidden_size, hidden_size)

    def attend_and_update(self, state: State, emb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One conditional GRU step. Args: state, with "dec_state" s_{t-1} (B, H); emb (B, E) of
        y_{t-1}. Returns s_t (B, H), c_t (B, H) and alpha_t (B, S), the weights of the query s'_t."""
        query = self.query_cell(emb, state["dec_state"])  # s'_t = GRU1(E y_{t-1}, s_{t-1}), (B, H)
        scores = self.scorer(query, state["proj_keys"])  # e_t = a(s'_t, h), (B, S)
        context, weights = attend(scores, state["src_mask"], state["enc_out"])  # (B, H), (B, S)
        dec_state = self.cell(context, query)  # s_t = GRU2(c_t, s'_t), (B, H)
        return dec_state, context, weights

    def flops(self, src_len: Tensor | float) -> tuple[Tensor | float, Tensor | float]:
        """`BahdanauDecoder.flops` (whose cell term is GRU2's here) and GRU1's step."""
        start, step = super().flops(src_len)
        return start, step + gru_cell_flops(self.query_cell)
