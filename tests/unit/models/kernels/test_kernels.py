"""`seq2seq.models.kernels.accelerate`: one switch plugs the speed paths into a built model, which then
trains and decodes as the textbook model does (values and gradients, to float tolerance); checkpoints
and copies are unchanged; a module it does not know, such as a scorer a test writes in ten lines in
the textbook's terms, keeps its own code and trains."""

import copy
import re

import pytest
import torch
from torch import Tensor, nn

from seq2seq.data.tokenizer import BOS
from seq2seq.decoding.search import SearchConfig, beam_search
from seq2seq.models.attention import SCORERS, AdditiveScorer, lengths_to_mask
from seq2seq.models.build import build_model
from seq2seq.models.kernels import KERNELS, accelerate, textbook
from seq2seq.models.kernels.dropout import UniformDropout
from seq2seq.models.kernels.multihead import CausalFusedAttention
from seq2seq.models.multihead import MultiHeadAttention
from seq2seq.models.rnn import RNNSeq2Seq
from seq2seq.models.transformer import TransformerSeq2Seq
from seq2seq.training.losses import batch_loss

V = 30


def tiny_batch(src_lens: list[int], tgt_lens: list[int], seed: int = 1) -> dict[str, Tensor]:
    """Rows longest target first, as collate orders them."""
    gen = torch.Generator().manual_seed(seed)
    src_mask = lengths_to_mask(torch.tensor(src_lens))  # (B, S)
    tgt_mask = lengths_to_mask(torch.tensor(tgt_lens))  # (B, T)
    src = torch.randint(4, V, src_mask.shape, generator=gen).masked_fill(~src_mask, 0)  # (B, S)
    tgt_out = torch.randint(4, V, tgt_mask.shape, generator=gen).masked_fill(~tgt_mask, 0)
    tgt_in = torch.cat([torch.full_like(tgt_out[:, :1], BOS), tgt_out[:, :-1]], 1)  # (B, T)
    return {"src": src, "src_lens": torch.tensor(src_lens), "src_mask": src_mask,
            "tgt_in": tgt_in.masked_fill(~tgt_mask, 0), "tgt_out": tgt_out, "tgt_mask": tgt_mask}  # fmt: skip


BATCHES = [tiny_batch([7, 5, 3], [6, 4, 1]), tiny_batch([30, 9, 4, 2], [5, 3, 3, 2], seed=2)]


def loss_and_grads(model: nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, dict]:
    """Smoothed loss sum, attention weights and every parameter's gradient, by name."""
    model.zero_grad()
    loss, _, _, weights = batch_loss(model, batch, 0.1)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), weights.detach(), grads


def assert_same_training(plain: nn.Module, kernels: nn.Module, batch: dict[str, Tensor]) -> None:
    loss, weights, grads = loss_and_grads(plain, batch)
    kernel_loss, kernel_weights, kernel_grads = loss_and_grads(kernels, batch)
    torch.testing.assert_close(kernel_loss, loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernel_weights, weights, rtol=1e-5, atol=1e-6)
    assert kernel_grads.keys() == grads.keys()
    for name, want in grads.items():
        torch.testing.assert_close(kernel_grads[name], want, rtol=1e-4, atol=1e-6, msg=name)


def rnn(score: str = "additive", **kwargs) -> RNNSeq2Seq:
    torch.manual_seed(0)
    return RNNSeq2Seq(V, emb_size=8, hidden_size=12, score=score, dropout=0.0, **kwargs)


def test_accelerate_swaps_the_known_modules_keeps_every_parameter_and_undoes() -> None:
    model = rnn(enc_layers=2)
    before = {name: p for name, p in model.state_dict(keep_vars=True).items()}
    assert accelerate(model) is model
    kinds = {type(m) for m in model.modules()}
    assert kinds.isdisjoint(KERNELS)  # every textbook module it knows is a kernel now
    assert {KERNELS[k] for k in (AdditiveScorer, RNNSeq2Seq, nn.Dropout)} <= kinds
    after = model.state_dict(keep_vars=True)
    assert list(after) == list(before) and all(after[k] is before[k] for k in before)
    assert accelerate(model) is model and {type(m) for m in model.modules()} == kinds  # idempotent
    copied = copy.deepcopy(model)  # copies (the heatmaps' CPU copy) keep the kernels
    assert {type(m) for m in copied.modules()} == kinds
    textbook(model)
    assert {type(m) for m in model.modules()}.isdisjoint(KERNELS.values())


def test_a_checkpoint_of_the_textbook_model_loads_into_the_kernels_and_back(tmp_path) -> None:
    plain = build_model({"model": "rnn", "vocab_size": V, "emb_size": 8, "hidden_size": 12})
    path = tmp_path / "weights.pt"
    torch.save(accelerate(copy.deepcopy(plain)).state_dict(), path)  # as training saves
    fresh = build_model(plain.model_args)
    fresh.load_state_dict(torch.load(path, weights_only=True))  # strict: the same keys
    for (name, want), got in zip(
        plain.state_dict().items(), fresh.state_dict().values(), strict=True
    ):
        assert torch.equal(got, want), name


@pytest.mark.parametrize("score", SCORERS)
@pytest.mark.parametrize("layers", [1, 2])
def test_kernels_train_as_the_textbook_model(score: str, layers: int) -> None:
    """Loss, attention and every gradient; the second batch's 30 source positions take the
    additive kernel's recomputed energies, and its rows end at different steps."""
    plain = rnn(score, enc_layers=layers).train()  # dropout 0: both draw nothing
    kernels = accelerate(copy.deepcopy(plain))
    for batch in BATCHES:
        assert_same_training(plain, kernels, batch)


@pytest.mark.parametrize("score", ["additive", "dot"])
def test_kernels_search_as_the_textbook_model(score: str) -> None:
    plain = rnn(score).eval()
    with torch.no_grad():
        nn.init.normal_(plain.generator.weight, std=1.0)  # peaked: hypotheses end at various steps
    kernels = accelerate(copy.deepcopy(plain))
    batch = BATCHES[1]
    args = batch["src"], batch["src_lens"], batch["src_mask"]
    want, got = (beam_search(m, *args, SearchConfig(beam=3)) for m in (plain, kernels))
    assert got.tokens == want.tokens
    torch.testing.assert_close(got.scores, want.scores, rtol=1e-4, atol=1e-4)


def test_transformer_kernels_train_as_the_textbook_model() -> None:
    torch.manual_seed(0)
    model = TransformerSeq2Seq(
        V, d_model=16, heads=2, layers=1, ff_size=32, dropout=0.0, attn_dropout=0.0
    )
    dropouts = [name for name, m in model.named_modules() if type(m) is nn.Dropout]
    plain = copy.deepcopy(model).train()
    accelerate(model).train()
    assert dropouts and all(type(model.get_submodule(n)) is UniformDropout for n in dropouts)
    assert type(model.decoder[0].self_attn) is CausalFusedAttention
    for batch in BATCHES:
        assert_same_training(plain, model, batch)


class BilinearScorer(nn.Module):
    """Luong's "general" score q^T W k, written in the textbook's terms only."""

    def __init__(self, query_size: int, key_size: int) -> None:
        super().__init__()
        self.key_proj = nn.Linear(key_size, query_size, bias=False)  # W

    def project_keys(self, keys: Tensor) -> Tensor:
        return self.key_proj(keys)  # (B, S, H): W k_j, once per batch

    def forward(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        return torch.bmm(proj_keys, query.unsqueeze(-1)).squeeze(-1)  # (B, S)


class AdditiveVariant(AdditiveScorer):
    """A subclass of a textbook module: someone's variant, kept as it is (exact types only)."""

    def forward(self, query: Tensor, proj_keys: Tensor) -> Tensor:
        return super().forward(query, proj_keys) / 2  # (B, S)


@pytest.mark.parametrize("scorer", [BilinearScorer, AdditiveVariant])
def test_a_scorer_the_kernels_do_not_know_trains_with_them_and_without(scorer: type) -> None:
    """Kernels on and off give the same gradients, and the new scorer learns with the kernels on."""
    plain = rnn().train()
    plain.decoder.scorer = scorer(12, 12, 12) if scorer is AdditiveVariant else scorer(12, 12)
    kernels = accelerate(copy.deepcopy(plain))
    assert type(kernels.decoder.scorer) is scorer  # left to its own code
    assert type(kernels.decoder) is not type(plain.decoder)  # the decoder's kernel runs it
    for batch in BATCHES:
        assert_same_training(plain, kernels, batch)
    batch = BATCHES[0]
    optimizer = torch.optim.Adam(kernels.parameters(), lr=0.03)
    losses = []
    for _ in range(30):  # the copy task of one batch: overfits
        loss, _, tokens, _ = batch_loss(kernels, batch, 0.0)
        optimizer.zero_grad()
        (loss / tokens).backward()
        optimizer.step()
        losses.append(loss.item() / tokens.item())
    assert losses[-1] < 0.5 * losses[0]
    assert kernels.decoder.scorer.key_proj.weight.grad.abs().sum() > 0  # the new scorer learned too


def test_the_packages_links_into_the_benchmark_log_name_its_headings() -> None:
    """The package keeps no timings; where a reader needs the why it links docs/results/benchmarks.md."""
    from tests.unit.test_docs import ROOT, anchors

    known = anchors(ROOT / "docs" / "results" / "benchmarks.md")
    cited = {
        anchor
        for module in (ROOT / "seq2seq").rglob("*.py")
        for anchor in re.findall(r"docs/results/benchmarks\.md#([\w-]+)", module.read_text("utf-8"))
    }
    assert len(cited) >= 4 and sorted(cited - known) == []


@pytest.mark.parametrize("padding", [False, True])
def test_causal_attention_kernel_equals_the_textbook_module(padding: bool) -> None:
    """Causal self-attention over a whole prefix: `is_causal` (no padding) or the textbook's mask."""
    torch.manual_seed(4)
    plain = MultiHeadAttention(16, 4)
    kernel = accelerate(copy.deepcopy(plain))
    assert type(kernel) is CausalFusedAttention
    x = torch.randn(3, 7, 16, requires_grad=True)  # (B, T, H)
    mask = lengths_to_mask(torch.tensor([7, 5, 2]), 7) if padding else None  # (B, T)
    upstream = torch.randn(3, 7, 16)
    results = []
    for module in (plain, kernel):
        out, _ = module(x, x, x, key_padding_mask=mask, causal=True)  # (B, T, H)
        results.append(
            (out, torch.autograd.grad((out * upstream).sum(), (x, *module.parameters())))
        )
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)
