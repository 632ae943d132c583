"""The decoder seam (seq2seq.models.bahdanau) and its first variant, the conditional GRU
(seq2seq.models.cgru): a variant written in the textbook's terms trains through the seam, `cgru` is
Nematus's step and learns, kernels leave it alone, old checkpoints load as `bahdanau`, and names and
defaults are stated once."""

import copy
import inspect

import pytest
import torch
from torch import Tensor

from seq2seq.benchmarks.reference import reference_loss
from seq2seq.commands import train
from seq2seq.data.batching import collate
from seq2seq.decoding.loading import load_model
from seq2seq.decoding.search import SearchConfig, beam_search, greedy_search
from seq2seq.decoding.translator import Translator
from seq2seq.models.attention import SCORERS, attend
from seq2seq.models.bahdanau import BahdanauDecoder
from seq2seq.models.build import MODELS, build_model, model_args_from, model_keys
from seq2seq.models.cgru import ConditionalGRUDecoder
from seq2seq.models.config import ModelConfig
from seq2seq.models.interface import State
from seq2seq.models.kernels import accelerate, textbook
from seq2seq.models.kernels.decoder import DeferredConditionalGRUDecoder
from seq2seq.models.rnn import DECODERS, RNNSeq2Seq
from seq2seq.training.losses import batch_loss
from seq2seq.training.system import adam
from tests.unit.models.kernels.test_kernels import BATCHES, assert_same_training
from tests.unit.training.test_system import reverse_batch


class UpdateThenAttend(BahdanauDecoder):
    """A variant written in the textbook's terms, through the seam alone: Luong's order, the state
    updated first from the previous word (no context fed in), then the attention queried with it."""

    def attend_and_update(self, state: State, emb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        prev = state["dec_state"]  # s_{t-1}, (B, H)
        no_context = prev.new_zeros(prev.shape)  # (B, H)
        dec_state = self.cell(torch.cat([emb, no_context], dim=-1), prev)  # s_t, (B, H)
        scores = self.scorer(dec_state, state["proj_keys"])  # (B, S)
        context, weights = attend(scores, state["src_mask"], state["enc_out"])  # (B, H), (B, S)
        return dec_state, context, weights


def train_on_reverse(model: torch.nn.Module, updates: int) -> list[float]:
    """Losses per token of `updates` Adam updates on one batch of reversed sentences."""
    batch = reverse_batch()
    optimizer = adam(model.parameters(), 1e-2)  # training's
    losses = []
    for _ in range(updates):
        loss_sum, _, tokens, _ = batch_loss(model, batch, label_smoothing=0.0)
        optimizer.zero_grad()
        (loss_sum / tokens).backward()
        optimizer.step()
        losses.append(float(loss_sum.detach() / tokens))
    return losses


def test_a_decoder_variant_registered_by_name_trains_through_the_seam(monkeypatch) -> None:
    monkeypatch.setitem(DECODERS, "update-then-attend", UpdateThenAttend)
    args = {"model": "rnn", "vocab_size": 14, "emb_size": 16, "hidden_size": 32, "dropout": 0.0}
    torch.manual_seed(0)
    model = accelerate(build_model({**args, "decoder": "update-then-attend"}))  # as training does
    assert type(model.decoder) is UpdateThenAttend  # no kernel took it over
    rebuilt = build_model(model.model_args)  # what a checkpoint rebuilds it from
    assert type(rebuilt.decoder) is UpdateThenAttend
    losses = train_on_reverse(model, 40)
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("score", SCORERS)
def test_cgru_learns_to_reverse_a_handful_of_sentences(score: str) -> None:
    torch.manual_seed(0)
    model = RNNSeq2Seq(14, emb_size=16, hidden_size=32, score=score, decoder="cgru", dropout=0.0)
    # With its kernel, as training runs it: on a CPU, the deferred steps.
    assert type(accelerate(model).decoder) is DeferredConditionalGRUDecoder
    losses = train_on_reverse(model, 100)
    assert losses[-1] < 0.05
    batch = reverse_batch()
    hyps = greedy_search(model.eval(), batch["src"], batch["src_lens"], batch["src_mask"])
    for b, ids in enumerate(hyps.tokens):
        n = int(batch["src_lens"][b]) - 1
        assert ids == batch["tgt_out"][b, :n].tolist()


def tiny_state(model: RNNSeq2Seq) -> State:
    batch = BATCHES[0]
    return model.encode(batch["src"], batch["src_lens"], batch["src_mask"])


@pytest.mark.parametrize("score", SCORERS)
def test_cgru_step_is_nematus_conditional_gru(score: str) -> None:
    """s'_t = GRU1(E y, s_{t-1}); alpha_t from a(s'_t, h); s_t = GRU2(c_t, s'_t); computed by hand
    with torch's GRU cell function on the modules' weights."""
    torch.manual_seed(0)
    model = RNNSeq2Seq(30, emb_size=8, hidden_size=12, score=score, decoder="cgru", dropout=0.0)
    state = tiny_state(model)
    emb = model.decoder.embed(torch.tensor([5, 6, 7]))  # (B, E)
    dec_state, context, weights = model.decoder.attend_and_update(state, emb)
    gru1, gru2, scorer = model.decoder.query_cell, model.decoder.cell, model.decoder.scorer
    cell_weights = lambda c: (c.weight_ih, c.weight_hh, c.bias_ih, c.bias_hh)  # noqa: E731
    query = torch.gru_cell(emb, state["dec_state"], *cell_weights(gru1))  # (B, H)
    scores = scorer(query, scorer.project_keys(state["enc_out"]))  # (B, S)
    alpha = scores.masked_fill(~state["src_mask"], float("-inf")).softmax(-1)  # (B, S)
    c = torch.bmm(alpha.unsqueeze(1), state["enc_out"]).squeeze(1)  # (B, H)
    torch.testing.assert_close(weights, alpha)
    torch.testing.assert_close(context, c)
    torch.testing.assert_close(dec_state, torch.gru_cell(c, query, *cell_weights(gru2)))


@pytest.mark.parametrize("decoder", DECODERS)
def test_each_decoder_builds_only_the_cells_it_keeps(decoder: str, monkeypatch) -> None:
    """`make_cell` is where a variant states its cell: no cell is built and thrown away (which would
    also spend the seed's random draws on weights nobody uses)."""
    built = []

    class Recorded(torch.nn.GRUCell):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(torch.nn, "GRUCell", Recorded)
    model = RNNSeq2Seq(30, emb_size=8, hidden_size=12, decoder=decoder, dropout=0.0)
    kept = [m for m in model.decoder.modules() if isinstance(m, torch.nn.GRUCell)]
    assert [id(c) for c in built] == [id(c) for c in kept]
    assert model.decoder.cell.input_size == (12 if decoder == "cgru" else 8 + 12)


@pytest.mark.parametrize("decoder", DECODERS)
def test_only_cgrus_attention_reads_the_previous_word(decoder: str) -> None:
    """DESIGN section 9: Bahdanau's query s_{t-1} has not read y_{t-1}; the conditional GRU's has."""
    torch.manual_seed(0)
    model = RNNSeq2Seq(30, emb_size=8, hidden_size=12, decoder=decoder, dropout=0.0)
    state = tiny_state(model)
    words = [model.decoder.embed(torch.tensor([w] * 3)) for w in (5, 9)]  # two y_{t-1}, (B, E)
    first, second = (model.decoder.attend_and_update(state, emb)[2] for emb in words)  # (B, S)
    assert torch.equal(first, second) == (decoder == "bahdanau")


def test_cgru_trains_and_searches_alike_with_the_kernels_plugged_in() -> None:
    torch.manual_seed(0)
    plain = RNNSeq2Seq(30, emb_size=8, hidden_size=12, decoder="cgru", dropout=0.0).train()
    kernels = accelerate(copy.deepcopy(plain))
    assert type(kernels.decoder) is DeferredConditionalGRUDecoder  # its kernel
    assert isinstance(kernels.decoder, ConditionalGRUDecoder)
    for batch in BATCHES:
        assert_same_training(plain, kernels, batch)
    batch = BATCHES[1]
    args = batch["src"], batch["src_lens"], batch["src_mask"]
    want, got = (beam_search(m.eval(), *args, SearchConfig(beam=3)) for m in (plain, kernels))
    assert got.tokens == want.tokens
    torch.testing.assert_close(got.scores, want.scores)


def test_an_old_checkpoint_loads_as_bahdanau_and_reads_as_the_textbook_spec(
    premove_checkpoint,
) -> None:
    """Written before `--decoder` existed: its model_args name no decoder. It loads as `bahdanau`,
    its loss on the loaded weights is the written-out reference's, and it translates as a model
    built with `decoder="bahdanau"` from the same weights."""
    model, tokenizer = load_model(premove_checkpoint)
    assert "decoder" not in model.model_args
    assert isinstance(model.decoder, BahdanauDecoder)  # its kernel
    plain = textbook(copy.deepcopy(model))
    assert type(plain.decoder) is BahdanauDecoder
    pairs = [("Ein Hund läuft im Park", "A dog runs in the park"), ("Zwei Männer", "Two men")]
    ids = [(tokenizer.encode(s), tokenizer.encode(t)) for s, t in pairs]
    batch = collate([{"src_ids": s, "tgt_ids": t, "index": i} for i, (s, t) in enumerate(ids)])
    with torch.no_grad():
        want = reference_loss(plain, batch, 0.1)[0]
        got = batch_loss(model, batch, 0.1)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    explicit = build_model({**model.model_args, "decoder": "bahdanau"})
    explicit.load_state_dict(model.state_dict())
    sentences = [s for s, _ in pairs]
    loaded = Translator.load(premove_checkpoint).translate(sentences, beam=3)
    again = Translator(accelerate(explicit).eval(), tokenizer).translate(sentences, beam=3)
    assert [(h.text, h.score) for h in loaded] == [(h.text, h.score) for h in again]


def test_the_decoder_flag_reaches_model_args_and_the_model() -> None:
    args = model_args_from(ModelConfig(decoder="cgru", emb_size=8, hidden_size=12), 30)
    assert args["decoder"] == "cgru"
    assert type(build_model(args).decoder) is ConditionalGRUDecoder


def test_train_help_offers_every_decoder(capsys) -> None:
    with pytest.raises(SystemExit):
        train.main(["--help"])
    assert f"--decoder {{{','.join(DECODERS)}}}" in capsys.readouterr().out
    assert list(DECODERS) == ["bahdanau", "cgru"]


@pytest.mark.parametrize("kind", MODELS)
def test_each_model_constructor_defaults_to_the_configs_values(kind: str) -> None:
    """`RNNSeq2Seq(vocab)` builds what `train.py --model rnn` does, and the same for the Transformer."""
    config = ModelConfig(model=kind)
    defaults = inspect.signature(MODELS[kind]).parameters
    for key in model_keys(kind):
        assert defaults[key].default == getattr(config, key), key


def test_an_unknown_decoder_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="bahdanau, cgru"):
        RNNSeq2Seq(30, emb_size=8, hidden_size=12, decoder="luong")
