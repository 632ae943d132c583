"""Greedy and beam search: invariants on tiny random GRU translators (no golden ids)."""

import pytest
import torch
from torch import Tensor, nn

from seq2seq.data.tokenizer import BOS, EOS
from seq2seq.decoding.search import (
    SearchConfig,
    beam_search,
    gnmt_penalty,
    greedy_search,
    translate_batch,
)
from seq2seq.decoding.search_config import NEVER, step_log_probs
from seq2seq.errors import UserError
from seq2seq.models.attention import lengths_to_mask
from seq2seq.models.interface import State
from seq2seq.models.rnn import RNNSeq2Seq
from seq2seq.models.transformer import TransformerSeq2Seq

V = 24


def tiny_model(seed: int = 2, eos_bias: float = 0.3) -> RNNSeq2Seq:
    """Untied output layer with unit-variance weights: peaked distributions, EOS at varied steps."""
    torch.manual_seed(seed)
    model = RNNSeq2Seq(V, emb_size=8, hidden_size=12, dropout=0.0, tie_embeddings=False).eval()
    nn.init.normal_(model.generator.weight, std=1.0)
    with torch.no_grad():
        model.generator.bias[EOS] = eos_bias
    return model


def tiny_batch(lens: list[int], seed: int = 102) -> tuple[Tensor, Tensor, Tensor]:
    torch.manual_seed(seed)
    src_lens = torch.tensor(lens)
    src_mask = lengths_to_mask(src_lens)  # (B, S)
    src = torch.randint(4, V, src_mask.shape).masked_fill(~src_mask, 0)  # (B, S)
    return src, src_lens, src_mask


def rescore(model: RNNSeq2Seq, src: Tensor, lens: Tensor, mask: Tensor, ids: list[int]):
    """Teacher-forced total log-prob of ids + EOS for one sentence, and its weights (len + 1, S)."""
    tgt_in = torch.tensor([[BOS, *ids]])  # (1, L + 1)
    logits, weights = model(src[None], lens[None], mask[None], tgt_in)  # (1, L + 1, V)
    log_probs = logits.log_softmax(-1)[0]  # (L + 1, V)
    total = log_probs.gather(1, torch.tensor([*ids, EOS])[:, None]).sum()
    return total, weights[0, :, : int(lens)]


@pytest.mark.parametrize("seed", [2, 3, 4, 5])
def test_beam_one_equals_greedy(seed: int) -> None:
    model, (src, lens, mask) = tiny_model(seed), tiny_batch([7, 5, 3, 1, 6, 2], seed + 100)
    greedy = greedy_search(model, src, lens, mask)
    beam = beam_search(model, src, lens, mask, SearchConfig(beam=1, length_penalty=1.0))
    assert beam.tokens == greedy.tokens
    torch.testing.assert_close(beam.scores, greedy.scores)
    for b, g in zip(beam.weights, greedy.weights, strict=True):
        torch.testing.assert_close(b, g)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_nbest_sorted_and_scores_are_the_models(alpha: float) -> None:
    model, (src, lens, mask) = tiny_model(), tiny_batch([7, 5, 3, 1, 6, 2])
    hyps = beam_search(model, src, lens, mask, SearchConfig(beam=4, length_penalty=alpha, nbest=3))
    for b, nbest in enumerate(hyps.nbest):
        assert len(nbest.tokens) == 3
        assert (nbest.normalized[:-1] >= nbest.normalized[1:]).all()  # best first
        for ids, score, norm, weights in zip(
            nbest.tokens, nbest.scores, nbest.normalized, nbest.weights, strict=True
        ):
            assert EOS not in ids and BOS not in ids
            total, forced = rescore(model, src[b], lens[b], mask[b], ids)
            torch.testing.assert_close(score, total, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(norm, score / gnmt_penalty(len(ids) + 1, alpha))
            # The back-tracked weights are those of the hypothesis, not of whatever beam held its slot.
            torch.testing.assert_close(weights, forced, atol=1e-5, rtol=1e-4)
    assert hyps.tokens == [h.tokens[0] for h in hyps.nbest]


def test_beam_is_not_worse_than_greedy_under_the_model() -> None:
    # Beam search is no guarantee (the greedy path can fall out of the beam), so we ask for the
    # total over a few models and most sentences, with alpha = 0 so both rank by log-probability.
    better, total_beam, total_greedy = [], 0.0, 0.0
    for seed in range(2, 6):
        model, (src, lens, mask) = tiny_model(seed), tiny_batch([7, 5, 3, 1, 6, 2], seed + 100)
        greedy = greedy_search(model, src, lens, mask)
        beam = beam_search(model, src, lens, mask, SearchConfig(beam=5, length_penalty=0.0))
        better += (beam.scores >= greedy.scores - 1e-4).tolist()
        total_beam += float(beam.scores.sum())
        total_greedy += float(greedy.scores.sum())
    assert total_beam > total_greedy
    assert sum(better) >= 0.9 * len(better)


@pytest.mark.parametrize("beam", [1, 3])
def test_sentence_decodes_the_same_alone_and_in_a_padded_batch(beam: int) -> None:
    model, (src, lens, mask) = tiny_model(), tiny_batch([7, 5, 3, 1, 6, 2])
    batch = {"src": src, "src_lens": lens, "src_mask": mask}
    together = translate_batch(model, batch, SearchConfig(beam=beam))
    for b in range(len(lens)):
        n = int(lens[b])
        alone = translate_batch(
            model,
            {
                "src": src[b : b + 1, :n],
                "src_lens": lens[b : b + 1],
                "src_mask": mask[b : b + 1, :n],
            },
            SearchConfig(beam=beam),
        )
        assert alone.tokens[0] == together.tokens[b]
        torch.testing.assert_close(alone.scores[0], together.scores[b], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(alone.weights[0], together.weights[b], atol=1e-5, rtol=1e-4)


class EOSModel(RNNSeq2Seq):
    """A translator that all but insists on EOS, and counts its decoder steps."""

    steps = 0

    def step(self, state: State, prev: Tensor, out: Tensor | None = None) -> tuple:
        self.steps += 1
        logits, weights, state = super().step(state, prev, out)
        return (
            logits.index_add(1, torch.tensor([EOS]), torch.full((len(prev), 1), 50.0)),
            weights,
            state,
        )


@pytest.mark.parametrize("beam", [1, 5])
def test_a_model_forced_to_emit_eos_stops_at_once(beam: int) -> None:
    torch.manual_seed(0)
    model = EOSModel(V, emb_size=8, hidden_size=12, dropout=0.0).eval()
    src, lens, mask = tiny_batch([4, 2])
    hyps = translate_batch(
        model, {"src": src, "src_lens": lens, "src_mask": mask}, SearchConfig(beam=beam)
    )
    assert hyps.tokens == [[], []]
    assert [w.shape for w in hyps.weights] == [(1, 4), (1, 2)]
    assert model.steps <= (1 if beam > 1 else 4)  # greedy checks for the end every 4 steps


def test_nbest_must_fit_in_the_beam() -> None:
    model, (src, lens, mask) = tiny_model(), tiny_batch([3])
    with pytest.raises(UserError, match="nbest"):
        beam_search(model, src, lens, mask, SearchConfig(beam=2, nbest=3))


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"beam": 0}, "`beam` must be at least 1, got 0"),
        (
            {"length_penalty": -1.0},
            "`length_penalty` must be zero or more, got -1.0",
        ),  # as training's
        ({"max_len_ratio": 0.0}, "`max_len_ratio` must be positive, got 0.0"),
        ({"max_len_extra": -1}, "`max_len_extra` must be zero or more, got -1"),
    ],
)
def test_a_setting_out_of_its_range_is_refused_by_name(setting: dict, message: str) -> None:
    with pytest.raises(UserError) as refused:
        SearchConfig(**setting)
    assert str(refused.value) == message


class TwoHeadModel(RNNSeq2Seq):
    """Reports its attention as two identical heads, (B, N, S), like a multi-head model."""

    def step(self, state: State, prev: Tensor, out: Tensor | None = None) -> tuple:
        logits, weights, state = super().step(state, prev, out)
        return logits, torch.stack([weights, weights], 1), state  # (B, 2, S)


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("heads", [False, True])
def test_weights_cover_each_output_token_and_sum_to_one(beam: int, heads: bool) -> None:
    torch.manual_seed(2)
    model = (TwoHeadModel if heads else RNNSeq2Seq)(
        V, emb_size=8, hidden_size=12, dropout=0.0
    ).eval()
    src, lens, mask = tiny_batch([7, 5, 3, 1])
    hyps = translate_batch(
        model, {"src": src, "src_lens": lens, "src_mask": mask}, SearchConfig(beam=beam)
    )
    for ids, weights, n in zip(hyps.tokens, hyps.weights, lens.tolist(), strict=True):
        assert weights.shape == ((len(ids) + 1, 2, n) if heads else (len(ids) + 1, n))
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_log_probs_are_the_log_softmax_with_never_banned(dtype: torch.dtype) -> None:
    torch.manual_seed(7)
    logits = (torch.randn(6, V) * 4).to(dtype)  # (B, V)
    expected = logits.float().log_softmax(-1)  # computed first: the fp32 logits are overwritten
    expected[:, list(NEVER)] = -torch.inf
    got = step_log_probs(logits)
    assert got.dtype == torch.float32
    assert torch.equal(got, expected)


@pytest.mark.parametrize("kind", ["rnn", "transformer"])
def test_a_step_writes_its_logits_into_the_buffer_it_is_given(kind: str) -> None:
    """Searches on a CPU pass one logits buffer to every step; what comes back is the same."""
    model = tiny_model() if kind == "rnn" else tiny_transformer()
    src, src_lens, src_mask = tiny_batch([5, 3])
    state = model.encode(src, src_lens, src_mask)
    prev = torch.full((2,), BOS)
    with torch.no_grad():
        plain, weights, _ = model.step(state, prev)  # (B, V)
        buffer = torch.full((2, V), torch.nan)
        into, weights_into, _ = model.step(state, prev, buffer)
    assert into.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(into, plain)
    torch.testing.assert_close(weights_into, weights)


@pytest.mark.parametrize("beam", [1, 3])
def test_a_search_reuses_one_logits_buffer_and_finds_what_it_finds_without(
    beam: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_model(seed=3)
    src, src_lens, src_mask = tiny_batch([6, 2, 4])
    step, given = model.step, []

    def recording(state: State, prev: Tensor, out: Tensor | None = None) -> tuple:
        given.append(out)
        return step(state, prev, out)

    monkeypatch.setattr(model, "step", recording)
    config = SearchConfig(beam=beam)
    with_buffer = translate_batch(
        model, {"src": src, "src_lens": src_lens, "src_mask": src_mask}, config
    )
    assert len(given) > 2 and all(out is not None for out in given)
    assert len({out.data_ptr() for out in given}) == 1  # one buffer, its first rows
    module = "seq2seq.decoding.search" if beam == 1 else "seq2seq.decoding.beam"
    monkeypatch.setattr(f"{module}.logits_buffer", lambda *args: None)
    given.clear()
    without = translate_batch(
        model, {"src": src, "src_lens": src_lens, "src_mask": src_mask}, config
    )
    assert given and all(out is None for out in given)
    assert with_buffer.tokens == without.tokens
    torch.testing.assert_close(with_buffer.scores, without.scores)


def tiny_transformer() -> TransformerSeq2Seq:
    torch.manual_seed(0)
    sizes = dict(d_model=16, heads=4, layers=2, ff_size=32, dropout=0.0, attn_dropout=0.0)
    return TransformerSeq2Seq(V, **sizes).eval()


def test_greedy_drops_finished_sentences_and_finds_what_each_finds_alone() -> None:
    model = tiny_model(seed=2, eos_bias=1.0)
    src, src_lens, src_mask = tiny_batch([6, 2, 4, 7, 3])
    step, rows = model.step, []

    def recording(state: State, prev: Tensor, out: Tensor | None = None) -> tuple:
        rows.append(len(prev))
        return step(state, prev, out)

    model.step = recording
    together = greedy_search(model, src, src_lens, src_mask)
    lengths = [len(ids) for ids in together.tokens]
    # Every 4 steps, the sentences that have ended (EOS at step len + 1) leave the batch.
    expected = [sum(length + 1 > t // 4 * 4 for length in lengths) for t in range(len(rows))]
    assert rows == expected and rows[-1] < rows[0]
    model.step = step
    for b in range(len(lengths)):
        n = int(src_lens[b])
        alone = greedy_search(
            model, src[b : b + 1, :n], src_lens[b : b + 1], src_mask[b : b + 1, :n]
        )
        assert alone.tokens[0] == together.tokens[b]
        torch.testing.assert_close(alone.scores[0], together.scores[b])
        torch.testing.assert_close(alone.weights[0], together.weights[b])
