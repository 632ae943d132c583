import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from seq2seq.data.tokenizer import BOS, EOS
from seq2seq.decoding.search import greedy_search
from seq2seq.models.attention import SCORERS, lengths_to_mask
from seq2seq.models.kernels import accelerate
from seq2seq.models.rnn import RNNSeq2Seq
from seq2seq.training import losses as loss
from seq2seq.training.losses import batch_loss, output_loss
from seq2seq.training.system import adam, lr_factor, warmup_steps


def chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of loss.ROWS rows whatever the vocabulary: a few rows make several chunks."""
    monkeypatch.setattr(loss, "CHUNK_LOGITS", 1)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_output_loss_equals_torch_cross_entropy_of_the_output_layer(
    smoothing: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunked(monkeypatch)
    torch.manual_seed(0)
    rows, generator = torch.randn(150, 5), torch.nn.Linear(5, 11)  # chunks of 64, 64 and 22 rows
    target = torch.randint(0, 11, (150,))
    loss_sum, nll = output_loss(rows, generator.weight, generator.bias, target, smoothing)
    logits = generator(rows)
    expected = F.cross_entropy(logits, target, label_smoothing=smoothing, reduction="sum")
    torch.testing.assert_close(loss_sum, expected)
    torch.testing.assert_close(nll, F.cross_entropy(logits, target, reduction="sum"))
    assert not nll.requires_grad  # a figure to report, not to train on


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_output_loss_gradients_equal_autograd_of_torch_cross_entropy(
    smoothing: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunked(monkeypatch)
    torch.manual_seed(3)
    rows = torch.randn(70, 4, dtype=torch.double, requires_grad=True)  # two chunks
    generator = torch.nn.Linear(4, 9).double()
    target = torch.randint(0, 9, (70,))

    def ours(rows, weight, bias):
        return output_loss(rows, weight, bias, target, smoothing)[0]

    inputs = (rows, generator.weight.detach().clone().requires_grad_(),
              generator.bias.detach().clone().requires_grad_())  # fmt: skip
    assert torch.autograd.gradcheck(ours, inputs)
    got = torch.autograd.grad(0.7 * ours(*inputs), inputs)
    theirs = F.cross_entropy(F.linear(*inputs), target, label_smoothing=smoothing, reduction="sum")
    for a, b in zip(got, torch.autograd.grad(0.7 * theirs, inputs), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("bf16", [False, True])
def test_output_loss_buffers_kept_between_calls_change_no_result(
    bf16: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunked(monkeypatch)
    monkeypatch.setattr(loss, "_KEPT", {})
    torch.manual_seed(4)
    generator = torch.nn.Linear(5, 11)
    calls = [(torch.randn(n, 5), torch.randint(0, 11, (n,))) for n in (150, 30, 200, 70)]

    def run(rows: torch.Tensor, target: torch.Tensor) -> list[torch.Tensor]:
        rows = rows.clone().requires_grad_()
        generator.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss_sum, nll = output_loss(rows, generator.weight, generator.bias, target, 0.1)
        loss_sum.backward()
        return [loss_sum.detach(), nll, rows.grad, generator.weight.grad, generator.bias.grad]

    reused = [run(*call) for call in calls]  # buffers made by the first call, grown by the third
    # The logits; under bf16 also their fp32 copy, the weight cast, its gradient's product twice.
    assert len(loss._KEPT) == (5 if bf16 else 1)
    assert all(t.size(0) == loss.ROWS for (name, *_), t in loss._KEPT.items() if name == "logits")
    for call, got in zip(calls, reused, strict=True):
        loss._KEPT.clear()  # each call on buffers of its own
        for a, b in zip(got, run(*call), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Buffers filled with junk before a call change nothing either: none is read before written.
    for t in loss._KEPT.values():
        t.fill_(float("nan"))
    for a, b in zip(run(*calls[-1]), reused[-1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_output_loss_without_gradients_keeps_nothing_for_backward() -> None:
    rows, generator = torch.randn(9, 5), torch.nn.Linear(5, 11)
    target = torch.randint(0, 11, (9,))
    with torch.no_grad():
        loss_sum, nll = output_loss(rows, generator.weight, generator.bias, target, 0.1)
    assert loss_sum.grad_fn is None
    torch.testing.assert_close(
        loss_sum, output_loss(rows, generator.weight, generator.bias, target, 0.1)[0].detach()
    )


def test_under_bf16_autocast_the_output_loss_is_fp32_with_fp32_gradients() -> None:
    rows = torch.randn(5, 6, requires_grad=True)
    generator = torch.nn.Linear(6, 7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_sum, nll = output_loss(
            rows, generator.weight, generator.bias, torch.randint(0, 7, (5,)), 0.1
        )
    assert loss_sum.dtype == nll.dtype == torch.float32
    loss_sum.backward()
    for grad in (rows.grad, generator.weight.grad, generator.bias.grad):
        assert grad.dtype == torch.float32 and torch.isfinite(grad).all() and grad.any()


class OutputLayerCalls(TorchFunctionMode):
    """Records the rows and input dtype of every matmul that makes (rows, vocab) logits."""

    MATMULS = (F.linear, torch.mm, torch.addmm)

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.calls = vocab, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self.MATMULS and out.dim() == 2 and out.size(1) == self.vocab:
            rows = args[1] if func is torch.addmm else args[0]  # (rows, O)
            self.calls.append((rows.size(0), rows.dtype))
        return out


def test_the_output_layer_sees_row_counts_in_multiples_of_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunked(monkeypatch)
    model, batch = RNNSeq2Seq(14, 8, 16, dropout=0.0), reverse_batch(n=30)
    with OutputLayerCalls(14) as seen:
        batch_loss(model, batch, 0.1)
    real = int(batch["tgt_mask"].sum())
    rows = [n for n, _ in seen.calls]
    assert real > loss.ROWS and rows[:-1] == [loss.ROWS] * (len(rows) - 1)  # several chunks
    assert rows[-1] == loss.ROWS and sum(rows) == -(-real // loss.ROWS) * loss.ROWS > real


def test_under_cpu_bf16_autocast_only_the_output_layer_runs_in_bf16() -> None:
    # The model as training and decoding run it, its kernels plugged in (seq2seq.models.kernels).
    model, batch = accelerate(RNNSeq2Seq(14, 8, 16, dropout=0.0)), reverse_batch()
    dtypes = {}
    for name in ("encoder", "decoder"):

        def hook(module, args, out, name=name) -> None:
            dtypes.setdefault(name, out[0].dtype)

        getattr(model, name).register_forward_hook(hook)
    with torch.autocast("cpu", dtype=torch.bfloat16), OutputLayerCalls(14) as seen:
        batch_loss(model, batch, 0.1)
        logits, _, _ = model.step(model.encode(batch["src"], batch["src_lens"], batch["src_mask"]),
                                  batch["tgt_in"][:, 0])  # fmt: skip
    assert dtypes == {"encoder": torch.float32, "decoder": torch.float32}
    assert [dtype for _, dtype in seen.calls] == [torch.bfloat16, torch.float32]  # loss, search
    assert logits.dtype == torch.float32  # search: one step, all of it fp32


def reverse_batch(n: int = 6, vocab: int = 14) -> dict[str, torch.Tensor]:
    """n random sentences and their reversals, in the batch format of seq2seq.data.datamodule."""
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(3, 7, (n,), generator=gen)  # words per sentence
    S = int(lens.max()) + 1
    src_mask = lengths_to_mask(lens + 1, S)  # (B, S): words + EOS
    words = torch.randint(4, vocab, (n, S), generator=gen)
    src = words.masked_fill(~src_mask, 0)
    src[torch.arange(n), lens] = EOS
    tgt_out = torch.zeros_like(src)
    for b in range(n):  # a test fixture, not a hot path
        tgt_out[b, : lens[b]] = words[b, : lens[b]].flip(0)
        tgt_out[b, lens[b]] = EOS
    tgt_in = torch.cat([torch.full((n, 1), BOS), tgt_out[:, :-1]], 1).masked_fill(~src_mask, 0)
    return {"src": src, "src_lens": lens + 1, "src_mask": src_mask, "tgt_in": tgt_in,
            "tgt_out": tgt_out, "tgt_mask": src_mask}  # fmt: skip


@pytest.mark.parametrize("score", SCORERS)
def test_tiny_model_learns_to_reverse_a_handful_of_sentences(score: str) -> None:
    torch.manual_seed(0)
    model = RNNSeq2Seq(vocab_size=14, emb_size=16, hidden_size=32, score=score, dropout=0.0)
    batch = reverse_batch()
    optimizer = adam(model.parameters(), 1e-2)  # training's
    for _ in range(150):
        loss_sum, _, tokens, _ = batch_loss(model, batch, label_smoothing=0.0)
        optimizer.zero_grad()
        (loss_sum / tokens).backward()
        optimizer.step()
    assert float(loss_sum / tokens) < 0.05
    hyps = greedy_search(model.eval(), batch["src"], batch["src_lens"], batch["src_mask"])
    for b, ids in enumerate(hyps.tokens):
        n = int(batch["src_lens"][b]) - 1
        assert ids == batch["tgt_out"][b, :n].tolist()


def test_training_adam_is_fused_and_steps_as_torchs_default_kernels() -> None:
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(RNNSeq2Seq(vocab_size=14, emb_size=16, hidden_size=32, dropout=0.0))
    ours = adam(models[0].parameters(), 1e-2)
    default = torch.optim.Adam(models[1].parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9)
    assert ours.param_groups[0]["fused"] and not default.param_groups[0]["fused"]
    for _ in range(5):
        # Both take the first model's gradients: computed on each model's own weights, a gradient
        # near zero would differ by rounding, and Adam's m / sqrt(v) magnifies that in the weights.
        loss_sum, _, tokens, _ = batch_loss(models[0], reverse_batch(), label_smoothing=0.1)
        ours.zero_grad()
        (loss_sum / tokens).backward()
        for a, b in zip(*(m.parameters() for m in models), strict=True):
            b.grad = a.grad.clone()
        ours.step()
        default.step()
    torch.manual_seed(0)
    start = RNNSeq2Seq(vocab_size=14, emb_size=16, hidden_size=32, dropout=0.0)
    for a, b, before in zip(*(m.parameters() for m in (*models, start)), strict=True):
        # Five steps of lr 1e-2 move a weight by up to 5e-2; the kernels differ in rounding alone.
        assert (a - before).abs().max() > 1e-3
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_cosine_schedule_warms_up_then_decays_to_the_floor() -> None:
    factors = [lr_factor(s, "cosine", warmup=10, total=110, floor=0.1) for s in range(120)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[9:], factors[10:], strict=False))
    assert factors[110] == pytest.approx(0.1) and factors[119] == pytest.approx(0.1)


def test_inverse_sqrt_schedule_peaks_at_warmup_and_falls_as_one_over_sqrt() -> None:
    factor = lambda step: lr_factor(step, "inverse_sqrt", warmup=100, total=10**6, floor=0.0)  # noqa: E731
    assert factor(99) == pytest.approx(1.0)
    assert factor(399) == pytest.approx(0.5) and factor(1599) == pytest.approx(0.25)
    assert lr_factor(10**6, "inverse_sqrt", 100, 10**6, floor=0.05) == 0.05
    assert math.isclose(factor(0), 0.01)


def test_warm_up_left_unset_is_cut_to_a_tenth_of_the_run_and_a_given_one_is_taken_whole() -> None:
    assert warmup_steps(None, 6_100) == 500  # the Transformer's 25 epochs
    assert warmup_steps(None, 3_690) == 369  # the GRU's 30 epochs of 4,096-token batches
    assert warmup_steps(None, 60) == 6
    assert warmup_steps(2_000, 6_000) == 2_000  # Wu et al.'s, a third of the run
    assert warmup_steps(0, 60) == 0


@pytest.mark.parametrize("key", ["attn_entropy", "max_weight", "score_std"])
def test_validation_attention_statistics_are_means_per_target_row_whatever_the_batching(
    tiny_tokenizer, key
) -> None:
    from seq2seq.alignment.stats import means
    from seq2seq.training.system import TranslationSystem

    torch.manual_seed(0)
    model = RNNSeq2Seq(vocab_size=tiny_tokenizer.vocab_size, emb_size=8, hidden_size=16,
                       score="additive", dropout=0.0).eval()  # fmt: skip
    system = TranslationSystem(model, tiny_tokenizer)
    whole = {**reverse_batch(), "index": torch.arange(6)}
    parts = [{k: v[rows] for k, v in whole.items()} for rows in (slice(0, 1), slice(1, 6))]

    def per_row(batches: list[dict]) -> float:
        system.on_validation_epoch_start()
        with torch.no_grad():
            for i, batch in enumerate(batches):
                system.validation_step(batch, i)
        assert system._val_sums[1] == system._val_sums[5]  # tokens == rows: each real target row
        return means(system._val_sums[2:], with_scores=system._val_scored)[key]

    # One sentence, then five, weigh their rows as one batch of six does (padding rows and padded
    # source positions count nowhere); a mean of the two batch means would weigh the single
    # sentence's rows five times as much.
    one, five = (per_row([part]) for part in parts)
    assert per_row(parts) == pytest.approx(per_row([whole]), rel=1e-5)
    assert per_row(parts) != pytest.approx((one + five) / 2, rel=1e-3)
