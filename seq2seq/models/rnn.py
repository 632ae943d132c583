"""The Bahdanau translator: a bidirectional GRU encoder and a GRU decoder with switchable attention.

Decoder step t (Bahdanau et al., 2015), with s_{t-1} the previous decoder state and h_j the encoder states:

    e_tj = a(s_{t-1}, h_j)                    a = additive | dot | scaled   (seq2seq.models.attention)
    c_t  = sum_j alpha_tj h_j                 alpha_t = masked softmax of e_t
    s_t  = GRU([emb(y_{t-1}); c_t], s_{t-1})
    o_t  = tanh(W_o [s_t; c_t; emb(y_{t-1})])    logits_t = W_g o_t

s_0 = tanh(W_init h_1^backward): the backward GRU's state at the first position has read the whole
sentence. The encoder's output size equals the decoder's hidden size (each direction has half), so `dot`
and `scaled` compare vectors of the same size with no hidden projection.

These modules are the specification; training and decoding plug the speed paths of
seq2seq.models.kernels into them (same parameters, same numbers to float tolerance).

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, T target length,
E embedding, H hidden, A additive-attention size, V vocabulary.
"""

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seq2seq.models.attention import attend, make_scorer
from seq2seq.models.interface import Seq2Seq, State


class BiGRUEncoder(nn.Module):
    """Embedding, dropout, and a bidirectional GRU over packed sequences; output (B, S, H), zero on padding.

    Packing makes the backward direction start at each sentence's last real token, not at padding.
    """

    def __init__(self, embedding: nn.Embedding, hidden_size: int, num_layers: int, dropout: float):
        super().__init__()
        if hidden_size % 2:
            raise ValueError(f"hidden size must be even (half per direction), got {hidden_size}")
        self.embedding = embedding
        self.dropout = nn.Dropout(dropout)
        self.rnn = nn.GRU(
            embedding.embedding_dim,
            hidden_size // 2,
            num_layers=num_layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )

    def forward(self, src: Tensor, src_lens: Tensor) -> Tensor:
        """Args: src (B, S) ids; src_lens (B,). Returns enc_out (B, S, H)."""
        emb = self.dropout(self.embedding(src))  # (B, S, E)
        # pack_padded_sequence wants the lengths on the CPU: one small copy per batch.
        packed = pack_padded_sequence(emb, src_lens.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        enc_out, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        return enc_out  # (B, S, H)


class BahdanauDecoder(nn.Module):
    """GRU decoder whose query is the previous state s_{t-1}; the context enters the GRU input."""

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
        self.cell = nn.GRUCell(emb_size + hidden_size, hidden_size)
        self.readout = nn.Linear(2 * hidden_size + emb_size, emb_size)  # W_o; E so W_g can be tied

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
        """One Bahdanau step. Args: emb (B, E) of y_{t-1}. Returns s_t (B, H), c_t (B, H), alpha_t (B, S)."""
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


class RNNSeq2Seq(Seq2Seq):
    """Bidirectional GRU encoder + Bahdanau decoder over one joint vocabulary.

    With `tie_embeddings`, the source embedding, target embedding and output layer share one matrix
    (Press & Wolf, 2017), which a joint subword vocabulary allows and small corpora reward.
    """

    def __init__(
        self,
        vocab_size: int,
        emb_size: int = 256,
        hidden_size: int = 512,
        score: str = "additive",
        attn_size: int | None = None,
        enc_layers: int = 1,
        dropout: float = 0.3,
        tie_embeddings: bool = True,
    ) -> None:
        super().__init__()
        src_embedding = nn.Embedding(vocab_size, emb_size, padding_idx=0)
        tgt_embedding = (
            src_embedding if tie_embeddings else nn.Embedding(vocab_size, emb_size, padding_idx=0)
        )
        self.encoder = BiGRUEncoder(src_embedding, hidden_size, enc_layers, dropout)
        self.decoder = BahdanauDecoder(tgt_embedding, hidden_size, score, attn_size, dropout)
        self.generator = nn.Linear(emb_size, vocab_size)
        for embedding in {src_embedding, tgt_embedding}:
            # Unit-variance embeddings would give the tied output layer logits of std ~sqrt(E) at start.
            nn.init.normal_(embedding.weight, std=emb_size**-0.5)
            nn.init.zeros_(embedding.weight[0])
        if tie_embeddings:
            self.generator.weight = tgt_embedding.weight

    def encode(self, src: Tensor, src_lens: Tensor, src_mask: Tensor) -> State:
        """Args: src (B, S); src_lens (B,); src_mask (B, S). Returns the decoder's initial state."""
        return self.decoder.init_state(self.encoder(src, src_lens), src_mask)

    def source_state(self, name: str) -> bool:
        return name in ("enc_out", "proj_keys", "src_mask")

    def decode(self, state: State, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Args: tgt_in (B, T). Returns features (B, T, E) and weights (B, T, S)."""
        return self.decoder(state, tgt_in)

    def step(
        self, state: State, prev: Tensor, out: Tensor | None = None
    ) -> tuple[Tensor, Tensor, State]:
        """Args: prev (B,) previous tokens; out: a (B, V) buffer for the logits, or None. Returns
        logits (B, V), weights (B, S), new state."""
        emb = self.decoder.embed(prev)  # (B, E)
        dec_state, context, weights = self.decoder.attend_and_update(state, emb)
        features = self.decoder.output_features(dec_state, context, emb)  # (B, E)
        logits = self.logits(features, out)  # (B, V)
        return logits, weights, {**state, "dec_state": dec_state}

    def flops_per_token(self, src_len: Tensor | float, tgt_len: Tensor | float) -> Tensor | float:
        """Matmul FLOPs of a training update (forward + backward) per target token of one sentence pair.

        Args: src_len, tgt_len: real source and target tokens (EOS, BOS included); floats, or tensors of
        lengths (B,) for one figure per pair. 2 FLOPs per multiply-add; backward = 2 x forward; padding
        and elementwise work (gates, tanh, softmax) are not counted.
        """
        E, H = self.encoder.embedding.embedding_dim, self.decoder.bridge.out_features
        V, h, layers = self.generator.out_features, H // 2, self.encoder.rnn.num_layers
        key_proj = getattr(self.decoder.scorer, "key_proj", None)
        A = key_proj.out_features if key_proj is not None else 0  # dot, scaled: no projections
        per_src = sum(2 * 2 * 3 * h * ((E if i == 0 else H) + h) for i in range(layers))  # biGRU
        per_src += 2 * H * A  # keys projected once per sentence
        # Per target token: the GRU cell, the readout and the generator.
        per_tgt = 2 * 3 * H * (E + 2 * H) + 2 * (2 * H + E) * E + 2 * E * V
        per_tgt += 2 * H * A  # query projection
        per_pair = (2 * A if A else 2 * H) + 2 * H  # score and context per (target, source) pair
        forward = src_len * per_src + tgt_len * (per_tgt + src_len * per_pair) + 2 * h * H  # bridge
        return 3 * forward / tgt_len
