import math

import pytest
import torch

from seq2seq.models.attention import (
    SCORERS,
    AdditiveScorer,
    attend,
    lengths_to_mask,
    make_scorer,
    masked_softmax,
)


@pytest.mark.parametrize("name", SCORERS)
def test_padding_gets_no_weight_and_rows_sum_to_one(name: str) -> None:
    torch.manual_seed(0)
    scorer = make_scorer(name, query_size=8, key_size=8)
    query, keys = torch.randn(3, 8), torch.randn(3, 7, 8)
    mask = lengths_to_mask(torch.tensor([7, 4, 0]), max_len=7)  # (B, S); row 2 is all padding
    context, weights = attend(scorer(query, scorer.project_keys(keys)), mask, keys)
    assert (weights[~mask] == 0).all()
    assert (weights[2] == 0).all() and (context[2] == 0).all()
    torch.testing.assert_close(weights[:2].sum(-1), torch.ones(2))
    torch.testing.assert_close(context[1], weights[1, :4] @ keys[1, :4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_all_padding_row_is_zero_with_finite_gradients(dtype: torch.dtype) -> None:
    scores = torch.randn(2, 5, dtype=dtype, requires_grad=True)
    mask = torch.tensor([[True, True, False, False, False], [False] * 5])
    weights = masked_softmax(scores, mask)
    assert torch.isfinite(weights).all()
    assert (weights[1] == 0).all()
    (weights * torch.arange(5, dtype=dtype)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert (scores.grad[1] == 0).all()


@pytest.mark.parametrize("name", ["dot", "scaled"])
def test_dot_scorers_reject_mismatched_sizes(name: str) -> None:
    with pytest.raises(ValueError, match="8 and 6"):
        make_scorer(name, query_size=8, key_size=6)


def test_unknown_scorer_is_refused() -> None:
    with pytest.raises(ValueError, match="additive, dot, scaled"):
        make_scorer("cosine", 4, 4)


def test_scaled_equals_dot_over_sqrt_d() -> None:
    query, keys = torch.randn(4, 16), torch.randn(4, 9, 16)
    dot, scaled = make_scorer("dot", 16, 16), make_scorer("scaled", 16, 16)
    expected = dot(query, dot.project_keys(keys)) / math.sqrt(16)
    torch.testing.assert_close(scaled(query, scaled.project_keys(keys)), expected)


def test_dot_score_is_the_inner_product() -> None:
    query, keys = torch.randn(2, 5), torch.randn(2, 3, 5)
    scorer = make_scorer("dot", 5, 5)
    expected = torch.stack(
        [torch.stack([query[b] @ keys[b, j] for j in range(3)]) for b in range(2)]
    )
    torch.testing.assert_close(scorer(query, scorer.project_keys(keys)), expected)


def test_additive_score_equals_the_formula_by_hand() -> None:
    torch.manual_seed(1)
    scorer = AdditiveScorer(query_size=6, key_size=4, attn_size=5)
    query, keys = torch.randn(2, 6), torch.randn(2, 3, 4)
    W_q, W_k = scorer.query_proj.weight, scorer.key_proj.weight
    w_v = scorer.energy.weight.squeeze(0)
    expected = torch.empty(2, 3)
    for b in range(2):
        for j in range(3):
            expected[b, j] = w_v @ torch.tanh(W_q @ query[b] + W_k @ keys[b, j])
    torch.testing.assert_close(scorer(query, scorer.project_keys(keys)), expected)


def test_additive_scorer_keeps_no_state_between_calls() -> None:
    scorer = AdditiveScorer(4, 4, 4)
    keys_a, keys_b, query = torch.randn(1, 3, 4), torch.randn(1, 3, 4), torch.randn(1, 4)
    proj_a = scorer.project_keys(keys_a)
    scorer.project_keys(keys_b)  # projecting other keys must not change what proj_a scores
    torch.testing.assert_close(scorer(query, proj_a), scorer(query, scorer.project_keys(keys_a)))
