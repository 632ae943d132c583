import pytest
import torch
from torch import nn

from seq2seq.models.attention import lengths_to_mask
from seq2seq.models.multihead import MultiHeadAttention

H, N = 16, 4


def copied_pair(bias: bool = True) -> tuple[MultiHeadAttention, nn.MultiheadAttention]:
    """Ours and torch's, with the same parameters (torch's in_proj_weight holds W_q, W_k, W_v stacked)."""
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(H, N, bias=bias, batch_first=True).eval()
    ours = MultiHeadAttention(H, N, bias=bias).eval()
    with torch.no_grad():
        for proj, weight in zip(
            (ours.q_proj, ours.k_proj, ours.v_proj), theirs.in_proj_weight.chunk(3), strict=True
        ):
            proj.weight.copy_(weight)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        if bias:
            for proj, b in zip(
                (ours.q_proj, ours.k_proj, ours.v_proj), theirs.in_proj_bias.chunk(3), strict=True
            ):
                proj.bias.copy_(torch.randn_like(b))  # torch starts them at 0: make them count
                b.copy_(proj.bias)
            ours.out_proj.bias.copy_(torch.randn(H))
            theirs.out_proj.bias.copy_(ours.out_proj.bias)
    return ours, theirs


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_matches_torch(need_weights: bool, causal: bool, bias: bool) -> None:
    ours, theirs = copied_pair(bias)
    x = torch.randn(3, 6, H)  # (B, T, H)
    mask = lengths_to_mask(torch.tensor([6, 4, 1]), 6)  # (B, S)
    future = torch.ones(6, 6, dtype=torch.bool).triu(1) if causal else None  # torch: True = ignore
    expected, expected_weights = theirs(
        x, x, x, key_padding_mask=~mask, attn_mask=future, average_attn_weights=False
    )
    out, weights = ours(x, x, x, key_padding_mask=mask, causal=causal, need_weights=need_weights)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if need_weights:
        assert weights.shape == (3, N, 6, 6)
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)
    else:
        assert weights is None


@pytest.mark.parametrize("need_weights", [False, True])
def test_cross_attention_matches_torch(need_weights: bool) -> None:
    ours, theirs = copied_pair()
    query, memory = torch.randn(3, 4, H), torch.randn(3, 7, H)  # (B, T, H), (B, S, H)
    mask = lengths_to_mask(torch.tensor([7, 5, 2]), 7)  # (B, S)
    expected, expected_weights = theirs(
        query, memory, memory, key_padding_mask=~mask, average_attn_weights=False
    )
    out, weights = ours(query, memory, memory, key_padding_mask=mask, need_weights=need_weights)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if need_weights:
        torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)
        assert (weights.masked_fill(mask[:, None, None], 0.0) == 0).all()  # padding gets exactly 0


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_all_padding_row_gives_zeros_not_nan(need_weights: bool, causal: bool) -> None:
    ours, _ = copied_pair()
    x = torch.randn(2, 5, H, requires_grad=True)
    mask = lengths_to_mask(torch.tensor([5, 0]), 5)  # row 1 has no key at all
    out, weights = ours(x, x, x, key_padding_mask=mask, causal=causal, need_weights=need_weights)
    # Its context is zero, so its output is W_o's bias alone (on the fused path this pins down torch's
    # own handling of such rows, which older releases turned into NaN).
    torch.testing.assert_close(out[1], ours.out_proj.bias.expand(5, H))
    if need_weights:
        assert (weights[1] == 0).all() and not weights.isnan().any()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_returned_weights_are_not_dropped_out() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(H, N, dropout=0.5).train()
    x = torch.randn(2, 5, H)
    mask = lengths_to_mask(torch.tensor([5, 3]), 5)
    _, weights = mha(x, x, x, key_padding_mask=mask, need_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, N, 5))  # dropout would break the sums


def test_cached_keys_equal_full_causal_attention() -> None:
    ours, _ = copied_pair()
    x = torch.randn(2, 6, H)  # (B, T, H)
    full, full_weights = ours(x, x, x, causal=True, need_weights=True)
    torch.testing.assert_close(ours(x, x, x, causal=True)[0], full)  # the fused kernel's is_causal
    k, v = ours.project_kv(x, x)  # (B, N, T, D) each
    for t in range(6):  # one step at a time, as a decoder's cache grows
        out, weights = ours.attend_kv(
            x[:, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], causal=True
        )
        torch.testing.assert_close(out[:, 0], full[:, t])
    # Several new queries after a cached prefix: the causal mask aligns them to the last keys.
    for need_weights in (False, True):
        out, weights = ours.attend_kv(x[:, 2:], k, v, causal=True, need_weights=need_weights)
        torch.testing.assert_close(out, full[:, 2:])
    torch.testing.assert_close(weights, full_weights[:, :, 2:])


def test_rejects_indivisible_width() -> None:
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 4)
