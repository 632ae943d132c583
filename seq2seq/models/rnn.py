"""The Bahdanau translator: a bidirectional GRU encoder and a GRU decoder with switchable attention.

Decoder step t (Bahdanau et al., 2015), with s_{t-1} the previous decoder state and h_j the encoder states:

    e_tj = a(s_{t-1}, h_j)                    a = additive | dot | scaled   (seq2seq.models.attention)
    c_t  = sum_j alpha_tj h_j                 alpha_t = masked softmax of e_t
    s_t  = GRU([emb(y_{t-1}); c_t], s_{t-1})
    o_t  = tanh(W_o [s_t; c_t; emb(y_{t-1})])    logits_t = W_g o_t

s_0 = tanh(W_init h_1^backward): the backward GRU's state at the first position has read the whole
sentence. The encoder's output size equals the decoder's hidden size (each direction has half), so `dot`
and `scaled` compare vectors of the same size with no hidden projection.

Dimension letters (the table in seq2seq.models.interface): B batch, S source length, T target length,
E embedding, H hidden, A additive-attention size, V vocabulary.
"""

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from seq2seq.models.attention import (
    AdditiveScorer,
    attend,
    lengths_to_mask,
    make_scorer,
    masked_softmax,
)
from seq2seq.models.deferred import (
    Bank,
    CellStep,
    CellWeights,
    ContextStep,
    EnergyStep,
    SourceBank,
    SourceShared,
)
from seq2seq.models.dropout import Dropout
from seq2seq.models.interface import Seq2Seq, State


class BiGRUEncoder(nn.Module):
    """Embedding, dropout, and a bidirectional GRU; output (B, S, H), zero on padding.

    The backward direction starts at each sentence's last real token, not at padding. The GRU runs over
    packed sequences, except when a CPU computes gradients: there each direction is its own call over
    the padded batch, the backward one over each row reversed within its length. The packed CPU kernel
    slices its precomputed input gates a step at a time, and each slice's backward fills a
    (tokens, 3H/2) gradient. On a 2-core AVX2 EPYC (torch 2.13, 2 threads), Multi30k's training batches
    (5.5% of source positions padding) took 116 ms forward and backward that way against 143 ms packed.
    Without gradients packed is faster, as it computes no padding: 184 against 215 ms for the
    encoder's forward over 400 validation sentences in translation's batches.
    """

    def __init__(self, embedding: nn.Embedding, hidden_size: int, num_layers: int, dropout: float):
        super().__init__()
        if hidden_size % 2:
            raise ValueError(f"hidden size must be even (half per direction), got {hidden_size}")
        self.embedding = embedding
        self.dropout = Dropout(dropout)
        self.rnn = nn.GRU(
            embedding.embedding_dim,
            hidden_size // 2,
            num_layers=num_layers,
            batch_first=True,
            bidirectional=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.between_layers = Dropout(self.rnn.dropout)  # the unpacked path's, as nn.GRU's own

    def forward(self, src: Tensor, src_lens: Tensor) -> Tensor:
        """Args: src (B, S) ids; src_lens (B,). Returns enc_out (B, S, H)."""
        emb = self.dropout(self.embedding(src))  # (B, S, E)
        if src.device.type == "cpu" and torch.is_grad_enabled():
            return self.unpacked(emb, src_lens)  # (B, S, H)
        # pack_padded_sequence wants the lengths on the CPU: one small copy per batch.
        packed = pack_padded_sequence(emb, src_lens.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        enc_out, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        return enc_out  # (B, S, H)

    def unpacked(self, emb: Tensor, src_lens: Tensor) -> Tensor:
        """The GRU of `self.rnn`, its weights, one direction at a time over the padded batch.

        Args: emb (B, S, E); src_lens (B,). Returns (B, S, H), zero on padding. What a direction
        computes at padding positions only ever reaches later padding positions, which are zeroed.
        """
        B, S, _ = emb.shape
        positions = torch.arange(S, device=emb.device)  # (S,)
        real = lengths_to_mask(src_lens, S)  # (B, S)
        # Each row reversed within its length (position j <-> len - 1 - j), padding left in place.
        flip = torch.where(real, src_lens.unsqueeze(1) - 1 - positions, positions)  # (B, S)
        h0 = emb.new_zeros(1, B, self.rnn.hidden_size)  # (1, B, H/2)
        x = emb  # (B, S, in)
        for layer in range(self.rnn.num_layers):
            if layer:
                x = self.between_layers(x)
            reversed_x = x.gather(1, flip.unsqueeze(-1).expand_as(x))  # (B, S, in)
            forward = self.direction(x, h0, f"l{layer}")  # (B, S, H/2)
            backward = self.direction(reversed_x, h0, f"l{layer}_reverse")  # (B, S, H/2)
            backward = backward.gather(1, flip.unsqueeze(-1).expand_as(backward))  # back in order
            x = torch.cat([forward, backward], dim=-1)  # (B, S, H)
        return x * real.unsqueeze(-1)  # (B, S, H)

    def direction(self, x: Tensor, h0: Tensor, suffix: str) -> Tensor:
        """One layer and direction of `self.rnn` (its weights named `*_{suffix}`), left to right.
        Args: x (B, S, in); h0 (1, B, H/2). Returns outputs (B, S, H/2)."""
        weights = [getattr(self.rnn, f"{name}_{suffix}") for name in ("weight_ih", "weight_hh")]
        biases = [getattr(self.rnn, f"{name}_{suffix}") for name in ("bias_ih", "bias_hh")]
        # gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
        out, _ = torch.gru(x, h0, weights + biases, True, 1, 0.0, self.training, False, True)
        return out  # (B, S, H/2)


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
        self.dropout = Dropout(dropout)
        self.bridge = nn.Linear(hidden_size // 2, hidden_size)  # W_init
        self.scorer = make_scorer(score, hidden_size, hidden_size, attn_size)
        self.cell = nn.GRUCell(emb_size + hidden_size, hidden_size)
        self.readout = nn.Linear(
            2 * hidden_size + emb_size, emb_size
        )  # W_o; emb_size so W_g can be tied

    def init_state(self, enc_out: Tensor, src_mask: Tensor) -> State:
        """The state search and teacher forcing start from; keys are projected here, once per batch."""
        half = enc_out.size(-1) // 2
        dec_state = torch.tanh(
            self.bridge(enc_out[:, 0, half:])
        )  # (B, H) from the backward state at 1
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

    def deferred_steps(
        self, state: State, emb: Tensor, rows: list[int]
    ) -> tuple[Callable[[State, Tensor], tuple[Tensor, Tensor, Tensor]], list[Tensor]]:
        """`attend_and_update` for training on a CPU, with gradients gathered over the steps.

        state: the batch's, before its first step; emb (B, T, E); rows: per step, the rows still
        decoding. Returns the step and, for each step, what it takes in place of the embedding: its
        rows of W_ie y + b_ih (rows[t], 3H), the embeddings' share of the cell's input gates, computed
        for all steps in one matmul. The step computes what `attend_and_update` does through
        `seq2seq.models.deferred`: the GRU cell's weight gradients, the embeddings', the encoder
        outputs' and (additive scorer) the keys' and w_v's are taken once per batch.
        """
        cell, scorer = self.cell, self.scorer
        cell_bank = Bank(rows, emb.size(0), cell, cell.weight_ih)
        embedded, *weights = CellWeights.apply(
            cell_bank, emb, cell.weight_ih, cell.bias_ih, cell.weight_hh, cell.bias_hh
        )  # (M, 3H), then w_ih, w_hh, b_hh
        additive = isinstance(scorer, AdditiveScorer)
        keys = state["proj_keys"] if additive else None  # (B, S, A)
        source_bank = SourceBank(state["enc_out"], len(rows), keys)
        source = [state["enc_out"]] + ([keys, scorer.energy.weight] if additive else [])
        enc_out, *energy = SourceShared.apply(source_bank, *source)

        def step(run: State, embedded: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            prev = run["dec_state"]  # s_{t-1}, (B', H)
            if additive:
                query = scorer.project_query(prev)  # (B', A)
                limit = scorer.RECOMPUTE_ABOVE
                scores = EnergyStep.apply(query, *energy, source_bank, limit)  # (B', S)
            else:
                scores = scorer(prev, run["proj_keys"])  # (B', S)
            alpha = masked_softmax(scores, run["src_mask"])  # (B', S)
            context = ContextStep.apply(alpha, enc_out, source_bank)  # (B', H)
            return CellStep.apply(embedded, context, prev, *weights, cell_bank), context, alpha

        return step, list(embedded.split(rows))

    def output_features(self, dec_state: Tensor, context: Tensor, emb: Tensor) -> Tensor:
        """o = tanh(W_o [s; c; emb]) for any leading shape: (…, H), (…, H), (…, E) -> (…, E)."""
        return self.dropout(torch.tanh(self.readout(torch.cat([dec_state, context, emb], dim=-1))))

    def unroll(
        self, state: State, emb: Tensor, rows: list[int] | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Steps from state["dec_state"] over emb (B, T, E) of y_0..y_{T-1}.

        rows: for each step, how many leading rows still decode, non-increasing (rows in order of
        target length, longest first); the others have ended, and their s_t, c_t and alpha_t are zero.
        None: every row, every step.

        Returns s_1..s_T (B, T, H), c_1..c_T (B, T, H) and alpha (B, T, S). seq2seq.models.fast compiles
        this loop a few steps at a time.
        """
        B, T = emb.shape[:2]
        states, contexts, weights = [], [], []
        run = state
        rows = [B] * T if rows is None else rows
        if _steps_deferred(emb):
            step, inputs = self.deferred_steps(state, emb, rows)  # (rows[t], 3H) each
        else:  # (B, E) each: one backward node, not one a step
            step, inputs = self.attend_and_update, emb.unbind(1)
        for n, input_t in zip(rows, inputs, strict=True):
            if n < run["dec_state"].size(0):  # sliced when rows end, not every step: views
                run = {name: value[:n] for name, value in run.items()}  # (n, ...)
            # (n, H), (n, H), (n, S)
            dec_state, context, alpha = step(run, input_t[:n])
            run = {**run, "dec_state": dec_state}
            for outputs, value in ((states, dec_state), (contexts, context), (weights, alpha)):
                outputs.append(F.pad(value, (0, 0, 0, B - n)) if n < B else value)  # (B, ...)
        return torch.stack(states, 1), torch.stack(contexts, 1), torch.stack(weights, 1)

    def forward(self, state: State, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced unroll. Args: tgt_in (B, T). Returns features (B, T, E), weights (B, T, S).

        Rows in order of target length, longest first (as `seq2seq.data.batching.collate` makes
        them), stop stepping when their target ends: 8.5% of the (B, T) steps of Multi30k's training
        batches are padding. Rows in another order step to the end. Either way the weights of padding
        steps are zero.
        """
        emb = self.embed(tgt_in)  # (B, T, E)
        real = tgt_in != self.embedding.padding_idx  # (B, T)
        lengths = real.sum(1)  # (B,) steps each row decodes
        rows = None
        if bool((lengths[:-1] >= lengths[1:]).all()):
            rows = real.sum(0).tolist()  # per step, the rows still decoding: a prefix
        states, contexts, weights = self.unroll(state, emb, rows)  # (B, T, H), (B, T, H), (B, T, S)
        # The readout runs once over all steps after the loop: one large matmul instead of T small ones.
        features = self.output_features(states, contexts, emb)  # (B, T, E)
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
        with _fp32_on_cpu(src):
            return self.decoder.init_state(self.encoder(src, src_lens), src_mask)

    def source_state(self, name: str) -> bool:
        return name in ("enc_out", "proj_keys", "src_mask")

    def decode(self, state: State, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
        """Args: tgt_in (B, T). Returns features (B, T, E) and weights (B, T, S)."""
        with _fp32_on_cpu(tgt_in):
            return self.decoder(state, tgt_in)

    def step(
        self, state: State, prev: Tensor, out: Tensor | None = None
    ) -> tuple[Tensor, Tensor, State]:
        """Args: prev (B,) previous tokens; out: a (B, V) buffer for the logits, or None. Returns
        logits (B, V), weights (B, S), new state."""
        with _fp32_on_cpu(prev):
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


def _fp32_on_cpu(like: Tensor) -> contextlib.AbstractContextManager:
    """Autocast off on a CPU: the recurrent parts run in fp32 there, under bf16-mixed too.

    Under CPU autocast every matmul goes to oneDNN, which builds a primitive for each new shape, and
    the memory of those is not given back. Here shapes change with every batch (B sentences, the
    packed GRU's per-step sizes, B x S keys). Default bf16 runs, resident MB at updates 0 / 100 / 200:
    with only the loss's rows padded 549 / 1,812 / 1,912; with this too 550 / 1,112 / 1,121. Training's
    output layer (about a third of an update's FLOPs, seq2seq.training.losses.ROWS) stays in bf16.
    """
    on_cpu = like.device.type == "cpu" and torch.is_autocast_enabled("cpu")
    return torch.autocast("cpu", enabled=False) if on_cpu else contextlib.nullcontext()


def _steps_deferred(like: Tensor) -> bool:
    """Whether teacher forcing steps through `seq2seq.models.deferred`: when a CPU computes
    gradients in fp32 (autocast off, as `_fp32_on_cpu` leaves it), eagerly. GPUs, and compiled
    code, keep the modules (`attend_and_update`)."""
    return (
        like.device.type == "cpu"
        and torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )
