"""The Bahdanau translator: a bidirectional GRU encoder and a GRU decoder with switchable attention.

The decoder is chosen by name (`--decoder`, a key of DECODERS): `bahdanau`, the step of Bahdanau et
al. (2015) as DESIGN section 1 writes it (seq2seq.models.bahdanau), or `cgru`, the conditional GRU of
Nematus and Marian (seq2seq.models.cgru). A checkpoint written before the choice existed names none
and loads as `bahdanau`. The scorer is chosen the same way (`--score`, seq2seq.models.attention).

The encoder's output size equals the decoder's hidden size (each direction has half), so `dot` and
`scaled` compare vectors of the same size with no hidden projection.

These modules are the specification; training and decoding plug the speed paths of
seq2seq.models.kernels into them (same parameters, same numbers to float tolerance).

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, T target length,
E embedding, H hidden, A additive-attention size, V vocabulary.
"""

from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seq2seq.models.bahdanau import BahdanauDecoder
from seq2seq.models.cgru import ConditionalGRUDecoder
from seq2seq.models.interface import Seq2Seq, State
from seq2seq.recipes import RECIPES


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

    def flops_per_token(self) -> int:
        """Forward matmul FLOPs per source token: both directions of every layer's GRU."""
        rnn = self.rnn
        h, H = rnn.hidden_size, 2 * rnn.hidden_size
        sizes = [rnn.input_size] + [H] * (rnn.num_layers - 1)  # each layer's input
        return sum(2 * 2 * 3 * h * (size + h) for size in sizes)


# The decoders by name: `--decoder`'s choices (seq2seq.models.config). Each is a `BahdanauDecoder` or a
# variant of it through its seam (seq2seq.models.bahdanau), built with the same arguments.
DECODERS: dict[str, type[BahdanauDecoder]] = {
    "bahdanau": BahdanauDecoder,
    "cgru": ConditionalGRUDecoder,
}


class RNNSeq2Seq(Seq2Seq):
    """Bidirectional GRU encoder + a GRU decoder (DECODERS) over one joint vocabulary.

    With `tie_embeddings`, the source embedding, target embedding and output layer share one matrix
    (Press & Wolf, 2017), which a joint subword vocabulary allows and small corpora reward. The
    defaults are `ModelConfig`'s, the recipe's for `--model rnn` (seq2seq.recipes).
    """

    def __init__(
        self,
        vocab_size: int,
        emb_size: int = int(RECIPES["rnn"]["emb_size"]),
        hidden_size: int = 512,
        score: str = "additive",
        attn_size: int | None = None,
        decoder: str = "bahdanau",
        enc_layers: int = 1,
        dropout: float = float(RECIPES["rnn"]["dropout"]),
        tie_embeddings: bool = True,
    ) -> None:
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}; choose one of {', '.join(DECODERS)}")
        src_embedding = nn.Embedding(vocab_size, emb_size, padding_idx=0)
        tgt_embedding = (
            src_embedding if tie_embeddings else nn.Embedding(vocab_size, emb_size, padding_idx=0)
        )
        self.encoder = BiGRUEncoder(src_embedding, hidden_size, enc_layers, dropout)
        self.decoder = DECODERS[decoder](tgt_embedding, hidden_size, score, attn_size, dropout)
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
        and elementwise work (gates, tanh, softmax) are not counted. Each part states its own: the
        encoder per source token, the decoder per sentence and per step (its scorer's among them),
        and the generator here.
        """
        start, step = self.decoder.flops(src_len)  # once a sentence; each target token
        generator = 2 * self.generator.in_features * self.generator.out_features  # W_g
        forward = src_len * self.encoder.flops_per_token() + start + tgt_len * (step + generator)
        return 3 * forward / tgt_len
