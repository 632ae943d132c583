"""The additive scorer's kernel (seq2seq.models.kernels.additive) against the textbook
`AdditiveScorer`: scores and gradients, with and without gradients, recomputed or kept, in chunks."""

import copy

import pytest
import torch
from torch.overrides import TorchFunctionMode

from seq2seq.models.attention import AdditiveScorer
from seq2seq.models.kernels import accelerate, additive
from seq2seq.models.kernels.additive import AdditiveEnergy, SigmoidAdditiveScorer


def pair(query_size: int, key_size: int, attn_size: int) -> tuple[AdditiveScorer, AdditiveScorer]:
    """A textbook scorer and its kernel, of the same weights."""
    plain = AdditiveScorer(query_size, key_size, attn_size)
    return plain, accelerate(copy.deepcopy(plain))


@pytest.mark.parametrize("source_len", [3, SigmoidAdditiveScorer.RECOMPUTE_ABOVE + 2])
@pytest.mark.parametrize("grad", [True, False])
def test_kernel_equals_the_textbook_scorer_in_scores_and_gradients(
    source_len: int, grad: bool
) -> None:
    """Kept or recomputed energies (with gradients), chunked ones (without), against the formula."""
    torch.manual_seed(3)
    plain, kernel = pair(6, 4, 5)
    assert type(kernel) is SigmoidAdditiveScorer
    query, keys = torch.randn(3, 6, requires_grad=grad), torch.randn(3, source_len, 4)
    upstream = torch.randn(3, source_len)  # (B, S)
    results = []
    for scorer in (plain, kernel):
        with torch.set_grad_enabled(grad):
            scores = scorer(query, scorer.project_keys(keys))  # (B, S)
        if grad:
            grads = torch.autograd.grad((scores * upstream).sum(), (query, *scorer.parameters()))
            results.append((scores.detach(), grads))
        else:
            results.append((scores, ()))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)


def test_additive_energy_gradients_equal_autograd_of_the_formula() -> None:
    torch.manual_seed(2)
    q = torch.randn(3, 5, dtype=torch.double, requires_grad=True)  # (B, A)
    k = torch.randn(3, 4, 5, dtype=torch.double, requires_grad=True)  # (B, S, A)
    w = torch.randn(1, 5, dtype=torch.double, requires_grad=True)  # (1, A)
    assert torch.autograd.gradcheck(AdditiveEnergy.apply, (q, k, w))
    upstream = torch.randn(3, 4, dtype=torch.double)  # (B, S)
    ours = torch.autograd.grad((AdditiveEnergy.apply(q, k, w) * upstream).sum(), (q, k, w))
    # q and k doubled, as SigmoidAdditiveScorer passes them: what autograd would differentiate
    plain = (torch.tanh((q.unsqueeze(1) + k) / 2) @ w.T).squeeze(-1)
    expected = torch.autograd.grad((plain * upstream).sum(), (q, k, w))
    for got, want in zip(ours, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_additive_energy_keeps_only_its_inputs_for_backward() -> None:
    """Nothing of size B x S x A is saved per decoder step beyond the projected keys themselves."""
    scorer = SigmoidAdditiveScorer(8, 8, 16)
    source_len = SigmoidAdditiveScorer.RECOMPUTE_ABOVE + 1  # long sources: recomputed
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
    scorer = SigmoidAdditiveScorer(8, 8, 16)
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
    scorer = SigmoidAdditiveScorer(8, 8, 16)
    long_len = SigmoidAdditiveScorer.RECOMPUTE_ABOVE + 3
    keys, query = torch.randn(2, long_len, 8), torch.randn(2, 8)
    grads = []
    for recompute_above in (
        long_len,
        SigmoidAdditiveScorer.RECOMPUTE_ABOVE,
    ):  # kept, then recomputed
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
    scorer = SigmoidAdditiveScorer(query_size=6, key_size=4, attn_size=A)
    query, keys = torch.randn(B, 6), torch.randn(B, S, 4)
    proj_keys = scorer.project_keys(keys).detach()  # (B, S, A)
    whole = scorer(query, proj_keys).detach()  # gradients on: one (B, S, A) energy tensor
    monkeypatch.setattr(additive, "SCORE_CHUNK", rows_per_chunk * S * A)
    with torch.no_grad(), EnergySizes() as seen:
        chunked = scorer(query, proj_keys)  # (B, S)
    assert seen.sizes == [rows_per_chunk * S * A] * (B // rows_per_chunk) + [
        (B % rows_per_chunk) * S * A
    ] * (B % rows_per_chunk > 0)
    torch.testing.assert_close(chunked, whole)


def test_additive_scores_without_gradients_under_bf16_autocast_match_the_whole() -> None:
    torch.manual_seed(6)
    scorer = SigmoidAdditiveScorer(8, 8, 16)
    keys, query = torch.randn(3, 5, 8), torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        proj_keys = scorer.project_keys(keys).detach()  # (B, S, A) in bf16
        whole = scorer(query, proj_keys).detach()
        with torch.no_grad():
            chunked = scorer(query, proj_keys)
    assert chunked.dtype == whole.dtype == torch.bfloat16
    torch.testing.assert_close(chunked, whole, atol=0.05, rtol=0.02)
