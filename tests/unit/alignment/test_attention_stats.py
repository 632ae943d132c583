"""Attention statistics: the scores the hook records are the ones the weights came from, and the
per-row means equal a computation by hand."""

import math

import pytest
import torch

from seq2seq.alignment.stats import means, recorded_scores, row_sums, stacked_scores
from seq2seq.models.attention import SCORERS, lengths_to_mask, masked_softmax
from seq2seq.models.kernels import accelerate
from seq2seq.models.rnn import RNNSeq2Seq
from seq2seq.models.transformer import TransformerSeq2Seq


@pytest.mark.parametrize("score", SCORERS)
def test_recorded_scores_are_the_scores_behind_the_weights(score) -> None:
    torch.manual_seed(0)
    model = RNNSeq2Seq(vocab_size=20, emb_size=8, hidden_size=16, score=score, dropout=0.0)
    accelerate(model).eval()  # as validation runs it: rows whose target ended stop stepping
    src_lens = torch.tensor([5, 3])
    src_mask = lengths_to_mask(src_lens)  # (2, 5)
    src = torch.randint(4, 20, (2, 5)).masked_fill(~src_mask, 0)
    real = lengths_to_mask(torch.tensor([4, 2]), 4)  # (2, 4): the second target ends first
    tgt_in = torch.randint(4, 20, (2, 4)).masked_fill(~real, 0)
    with torch.no_grad(), recorded_scores(model) as recorded:
        state = model.encode(src, src_lens, src_mask)
        _, weights = model.decode(state, tgt_in)  # (2, 4, 5)
    assert [len(s) for s in recorded] == [2, 2, 1, 1]  # the ended row is not scored
    scores = stacked_scores(recorded, 4)  # (2, 4, 5)
    assert scores is not None and scores.shape == (2, 4, 5)
    assert (scores[~real] == 0).all() and (weights[~real] == 0).all()
    expected = masked_softmax(scores, src_mask[:, None, :].expand_as(scores))
    torch.testing.assert_close(weights[real], expected[real])
    with torch.no_grad(), recorded_scores(model) as after:  # the hook is gone once the block ends
        pass
    model.decode(model.encode(src, src_lens, src_mask), tgt_in)
    assert after == []


def test_a_model_without_one_scorer_records_nothing() -> None:
    model = TransformerSeq2Seq(vocab_size=20, d_model=16, heads=2, layers=1, ff_size=32)
    with recorded_scores(model) as recorded:
        pass
    assert recorded == [] and stacked_scores(recorded, 3) is None


def test_row_means_equal_a_hand_computation() -> None:
    # Two sentences: 2 real target rows over 3 real source positions, 1 row over 2 positions.
    scores = torch.tensor(
        [[[1.0, 2.0, 4.0], [0.0, 0.0, 3.0]], [[2.0, -2.0, 99.0], [7.0, 7.0, 7.0]]]
    )
    src_mask = torch.tensor([[True, True, True], [True, True, False]])
    tgt_mask = torch.tensor([[True, True], [True, False]])
    weights = masked_softmax(scores, src_mask[:, None, :].expand_as(scores))
    rows = [(scores[0, 0], weights[0, 0]), (scores[0, 1], weights[0, 1]),
            (scores[1, 0, :2], weights[1, 0, :2])]  # fmt: skip
    std = [float(e.std(unbiased=False)) for e, _ in rows]
    peak = [float(w.max()) for _, w in rows]
    entropy = [-sum(p * math.log(p) for p in w.tolist() if p > 0) for _, w in rows]
    got = means(row_sums(weights, tgt_mask, src_mask, scores), with_scores=True)
    assert got["score_std"] == pytest.approx(sum(std) / 3)
    assert got["max_weight"] == pytest.approx(sum(peak) / 3)
    assert got["attn_entropy"] == pytest.approx(sum(entropy) / 3, rel=1e-5)
    assert (
        means(row_sums(weights, tgt_mask, src_mask, None), with_scores=False)["score_std"] is None
    )
