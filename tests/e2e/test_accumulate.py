"""One update's gradient over two DDP ranks (torchrun, gloo), each with two accumulated batches, is
that of one batch; a training run's epochs hold whole updates, so validation falls on their
boundaries.

Run as a script (`python tests/e2e/test_accumulate.py OUT` under torchrun), this file is the DDP
worker.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seq2seq.data.batching import collate
from tests.conftest import ROOT
from tests.unit.training.test_accumulate import items, make_system, one_update, reference, tokens

DDP_SPLITS = [[[2, 2, 2], [5, 6]], [[9], [3, 3]]]  # rank 0's micro-batches, rank 1's


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_ranks_with_two_accumulated_batches_each_give_the_gradient_of_one_batch(
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), __file__,
               str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two processes on two shared cores
    env["PYTHONPATH"] = str(ROOT)  # the worker, this file, imports the unit half
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
