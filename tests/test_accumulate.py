"""One update's gradient is that of the mean loss per real target token of the update, however its
tokens are split: into accumulated batches (in-process) or also over two DDP ranks (torchrun, gloo).

Run as a script (`python tests/test_accumulate.py OUT` under torchrun), this file is the DDP worker.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

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
DDP_SPLITS = [[[2, 2, 2], [5, 6]], [[9], [3, 3]]]  # rank 0's micro-batches, rank 1's


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
    return TranslationSystem(model, None, OptimConfig(label_smoothing=0.1, clip_norm=clip_norm))


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_with_two_accumulated_batches_each_give_the_gradient_of_one_batch(
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), __file__,
               str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two processes on two shared cores
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    parts = [items(lens, 10 * rank + k) for rank, split in enumerate(DDP_SPLITS)
             for k, lens in enumerate(split)]  # fmt: skip
    expected, loss = reference(parts)
    for rank in range(2):  # DDP leaves the same gradient on every rank
        result = torch.load(tmp_path / f"rank{rank}.pt")
        assert result["grads"].keys() == expected.keys()
        for name in expected:
            torch.testing.assert_close(result["grads"][name], expected[name])
        assert result["metrics"]["train/smoothed_loss"] == pytest.approx(loss, rel=1e-5)
        # The job's tokens per second: both ranks' batches, summed at the update.
        assert result["metrics"]["train/tokens_per_sec"] == tokens(parts)


def ddp_worker(out: Path) -> None:
    """One rank of the torchrun test: its own two micro-batches, one update, its gradient saved."""
    rank = int(os.environ["RANK"])
    batches = [collate(items(lens, 10 * rank + k)) for k, lens in enumerate(DDP_SPLITS[rank])]
    grads, metrics = one_update(make_system(), batches, devices=2, strategy="ddp")
    torch.save({"grads": grads, "metrics": metrics}, out / f"rank{rank}.pt")


if __name__ == "__main__":
    torch.set_num_threads(1)
    ddp_worker(Path(sys.argv[1]))


def test_every_epoch_holds_whole_updates_so_validation_falls_on_their_boundaries(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seq2seq.commands import train
    from seq2seq.data.batching import TokenBudgetBatchSampler
    from tests.conftest import tiny_train_args

    lengths = [5, 9, 3, 7, 11, 4, 6, 8, 2, 10] * 7  # 70 examples, a few dozen batches
    for accumulate in (1, 3, 4):
        sampler = TokenBudgetBatchSampler(lengths, 30, shuffle=True, multiple_of=accumulate)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            assert len(sampler) % accumulate == 0 and len(list(sampler)) == len(sampler) > 0
    # A run whose epochs (9 batches of the tiny corpus) are not multiples of 4: validation every 3
    # updates (12 batches) used to fall mid-window from the second epoch on, and the checkpoint
    # written there dropped the window's pending gradients on resume.
    monkeypatch.chdir(tmp_path)
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", "--accumulate-grad-batches", "4")
    args += ["--max-steps", "9", "--val-every", "3", "--keep-best", "5"]
    assert train.main(args) == 0
    ckpts = sorted((tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints").iterdir())
    states = [torch.load(p, weights_only=True)["TranslationDataModule"] for p in ckpts]
    assert len(states) >= 3 and {s["epoch"] for s in states} != {0}  # later epochs are there
    assert all(s["batches_done"] % 4 == 0 for s in states), states
