"""One update's gradient is that of the mean loss per real target token of the update, however its
tokens are split into accumulated batches, clipped or not (in-process; over two DDP ranks under
torchrun, and a run's epochs of whole updates: tests/e2e/test_accumulate.py)."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from seq2seq.data.batching import collate
from seq2seq.models.build import build_model, model_args_from
from seq2seq.training import callbacks
from seq2seq.training.config import OptimConfig, TrainConfig
from seq2seq.training.losses import batch_loss
from seq2seq.training.system import TranslationSystem

VOCAB = 20
# Target lengths (words; EOS adds one) of the sentences of each micro-batch. Their real target
# tokens differ (9 vs 19; 9, 13, 10, 8), so weighting batches alike (a mean per batch) would not do.
HALVES = [[2, 2, 2], [9, 8]]


def items(tgt_lens: list[int], seed: int) -> list[dict]:
    """Random sentence pairs with the given target lengths, as the data module's items."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(tgt_lens):
        src_len = int(torch.randint(2, 8, (), generator=gen))
        src, tgt = (torch.randint(4, VOCAB, (k,), generator=gen).tolist() for k in (src_len, n))
        out.append({"src_ids": src, "tgt_ids": tgt, "index": seed * 100 + i})
    return out


def make_system(clip_norm: float = 0.0) -> TranslationSystem:
    """The same tiny GRU, without dropout, every call. Training alone needs no tokenizer."""
    torch.manual_seed(0)
    cfg = TrainConfig(emb_size=16, hidden_size=32, dropout=0.0)
    model = build_model(model_args_from(cfg, VOCAB))
    return TranslationSystem(
        model, None, OptimConfig(label_smoothing=0.1, clip_norm=clip_norm, word_dropout=0.0)
    )


def reference(parts: list[list[dict]]) -> tuple[dict[str, torch.Tensor], float]:
    """Gradient and value of (smoothed loss sum / real tokens) of all parts as ONE batch."""
    system = make_system()
    loss_sum, _, tokens, _ = batch_loss(system.model, collate(sum(parts, [])), 0.1)
    loss = loss_sum / tokens
    loss.backward()
    return {n: p.grad for n, p in system.named_parameters() if p.grad is not None}, loss.item()


class GradientOfFirstUpdate(L.Callback):
    """Keeps the gradients of the first optimizer step (in .grad until the next window opens)."""

    grads: dict[str, torch.Tensor] | None = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object
    ) -> None:
        if trainer.global_step == 1 and self.grads is None:
            self.grads = {
                n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None
            }


class SecondPerReading:
    """A clock for TokensPerSecond that moves one second per reading: a window that opens at the
    first batch and is read once at the update has lasted 1 s, so tokens/sec = the tokens counted."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def one_update(
    system: TranslationSystem, batches: list[dict], **trainer_kwargs: object
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Fit `system` for one update over `batches` (accumulated); its gradient and logged metrics."""
    capture = GradientOfFirstUpdate()
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, accumulate_grad_batches=len(batches),
        callbacks=[capture, callbacks.TokensPerSecond()], log_every_n_steps=1,
        limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False,  # each rank: its own batches
        **trainer_kwargs,
    )  # fmt: skip
    clock, callbacks.time = callbacks.time, SecondPerReading()
    try:
        trainer.fit(system, DataLoader(batches, batch_size=None))  # each item is a collated batch
    finally:
        callbacks.time = clock
    return capture.grads, {k: float(v) for k, v in trainer.callback_metrics.items()}


def tokens(parts: list[list[dict]]) -> int:
    """Real target tokens of the pairs (EOS included)."""
    return sum(len(item["tgt_ids"]) + 1 for part in parts for item in part)


def test_two_accumulated_half_batches_give_the_gradient_of_one_full_batch() -> None:
    halves = [items(lens, seed) for seed, lens in enumerate(HALVES)]
    expected, loss = reference(halves)
    split, split_metrics = one_update(make_system(), [collate(h) for h in halves], devices=1)
    full, full_metrics = one_update(make_system(), [collate(sum(halves, []))], devices=1)
    assert split.keys() == full.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(split[name], expected[name])
        torch.testing.assert_close(full[name], expected[name])
    # The logged loss is the update's loss per real token, not the last micro-batch's.
    assert split_metrics["train/smoothed_loss"] == pytest.approx(loss, rel=1e-5)
    assert full_metrics["train/smoothed_loss"] == pytest.approx(loss, rel=1e-5)
    # train/loss is val/loss's quantity: the plain NLL per real token of the update.
    _, nll_sum, count, _ = batch_loss(make_system().model, collate(sum(halves, [])), 0.1)
    assert split_metrics["train/loss"] == pytest.approx((nll_sum / count).item(), rel=1e-5)
    assert split_metrics["train/loss"] < split_metrics["train/smoothed_loss"]
    # tokens/sec counts both batches, once, at the update (1 s by the clock above).
    assert split_metrics["train/tokens_per_sec"] == full_metrics["train/tokens_per_sec"]
    assert split_metrics["train/tokens_per_sec"] == tokens(halves)
    # A mean per batch, averaged over the two batches, is another gradient: the test can tell.
    a, b = (reference([half])[0] for half in halves)
    assert any(not torch.allclose((a[n] + b[n]) / 2, expected[n]) for n in expected)


def test_clipping_acts_on_the_normalised_gradient_and_logs_its_norm() -> None:
    halves = [items(lens, seed) for seed, lens in enumerate(HALVES)]
    expected, _ = reference(halves)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in expected.values()]))
    max_norm = float(norm) / 4  # so clipping must act
    grads, metrics = one_update(make_system(max_norm), [collate(h) for h in halves], devices=1)
    assert metrics["train/grad_norm"] == pytest.approx(float(norm), rel=1e-5)
    for name in expected:  # clip_grad_norm_ scales by max_norm / (norm + 1e-6)
        torch.testing.assert_close(grads[name], expected[name] * max_norm / (float(norm) + 1e-6))
