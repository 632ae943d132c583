import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from seq2seq.models import attention
from seq2seq.models.attention import (
    AdditiveEnergy,
    AdditiveScorer,
    attend,
    lengths_to_mask,
    make_scorer,
    masked_softmax,
)

SCORERS = ["additive", "dot", "scaled"]


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


def test_additive_energy_gradients_equal_autograd_of_the_formula() -> None:
    torch.manual_seed(2)
    q = torch.randn(3, 5, dtype=torch.double, requires_grad=True)  # (B, A)
    k = torch.randn(3, 4, 5, dtype=torch.double, requires_grad=True)  # (B, S, A)
    w = torch.randn(1, 5, dtype=torch.double, requires_grad=True)  # (1, A)
    assert torch.autograd.gradcheck(AdditiveEnergy.apply, (q, k, w))
    upstream = torch.randn(3, 4, dtype=torch.double)  # (B, S)
    ours = torch.autograd.grad((AdditiveEnergy.apply(q, k, w) * upstream).sum(), (q, k, w))
    # q and k doubled, as AdditiveScorer passes them: what autograd would differentiate
    plain = (torch.tanh((q.unsqueeze(1) + k) / 2) @ w.T).squeeze(-1)
    expected = torch.autograd.grad((plain * upstream).sum(), (q, k, w))
    for got, want in zip(ours, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_additive_energy_keeps_only_its_inputs_for_backward() -> None:
    """Nothing of size B x S x A is saved per decoder step beyond the projected keys themselves."""
    scorer = AdditiveScorer(8, 8, 16)
    source_len = AdditiveScorer.RECOMPUTE_ABOVE + 1  # long sources: recomputed
    proj_keys = scorer.project_keys(torch.randn(4, source_len, 8))  # (B, S, A)
    query = torch.randn(4, 8, requires_grad=True)
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        scorer(query, proj_keys).sum().backward()
    big = [t for t in saved if t.numel() >= proj_keys.numel()]
    assert big and all(t.data_ptr() == proj_keys.data_ptr() for t in big)


def test_additive_scorer_under_bf16_autocast_gives_parameter_dtype_gradients() -> None:
    scorer = AdditiveScorer(8, 8, 16)
    keys, query = torch.randn(2, 5, 8), torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = scorer(query, scorer.project_keys(keys))  # (B, S)
    assert scores.dtype == torch.bfloat16
    scores.float().sum().backward()
    for p in scorer.parameters():
        assert p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
    reference = scorer(query, scorer.project_keys(keys))
    torch.testing.assert_close(scores.float(), reference, atol=0.05, rtol=0.05)


def test_additive_scores_and_gradients_agree_on_both_sides_of_the_recompute_length() -> None:
    torch.manual_seed(4)
    scorer = AdditiveScorer(8, 8, 16)
    long_len = AdditiveScorer.RECOMPUTE_ABOVE + 3
    keys, query = torch.randn(2, long_len, 8), torch.randn(2, 8)
    grads = []
    for recompute_above in (long_len, AdditiveScorer.RECOMPUTE_ABOVE):  # kept, then recomputed
        scorer.RECOMPUTE_ABOVE = recompute_above
        scorer.zero_grad()
        scores = scorer(query, scorer.project_keys(keys))  # (B, S)
        (scores * torch.linspace(-1, 1, long_len)).sum().backward()
        grads.append((scores.detach(), [p.grad.clone() for p in scorer.parameters()]))
    (kept, kept_grads), (recomputed, recomputed_grads) = grads
    torch.testing.assert_close(kept, recomputed)
    for a, b in zip(kept_grads, recomputed_grads, strict=True):
        torch.testing.assert_close(a, b)


class EnergySizes(TorchFunctionMode):
    """Records the size of every (rows, S, A) energy tensor put through the sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.sigmoid, torch.Tensor.sigmoid, torch.Tensor.sigmoid_):
            self.sizes.append(out.numel())
        return out


@pytest.mark.parametrize("rows_per_chunk", [1, 2, 5])
def test_additive_scores_without_gradients_come_in_chunks_equal_to_the_whole(
    monkeypatch: pytest.MonkeyPatch, rows_per_chunk: int
) -> None:
    torch.manual_seed(5)
    B, S, A = 5, 3, 4  # 2 rows a chunk: chunks of 2, 2 and 1
    scorer = AdditiveScorer(query_size=6, key_size=4, attn_size=A)
    query, keys = torch.randn(B, 6), torch.randn(B, S, 4)
    proj_keys = scorer.project_keys(keys).detach()  # (B, S, A)
    whole = scorer(query, proj_keys).detach()  # gradients on: one (B, S, A) energy tensor
    monkeypatch.setattr(attention, "SCORE_CHUNK", rows_per_chunk * S * A)
    with torch.no_grad(), EnergySizes() as seen:
        chunked = scorer(query, proj_keys)  # (B, S)
    assert seen.sizes == [rows_per_chunk * S * A] * (B // rows_per_chunk) + [
        (B % rows_per_chunk) * S * A
    ] * (B % rows_per_chunk > 0)
    torch.testing.assert_close(chunked, whole)


def test_additive_scores_without_gradients_under_bf16_autocast_match_the_whole() -> None:
    torch.manual_seed(6)
    scorer = AdditiveScorer(8, 8, 16)
    keys, query = torch.randn(3, 5, 8), torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        proj_keys = scorer.project_keys(keys).detach()  # (B, S, A) in bf16
        whole = scorer(query, proj_keys).detach()
        with torch.no_grad():
            chunked = scorer(query, proj_keys)
    assert chunked.dtype == whole.dtype == torch.bfloat16
    torch.testing.assert_close(chunked, whole, atol=0.05, rtol=0.02)
