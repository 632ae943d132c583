"""`python -m seq2seq train` on several CPU processes (DDP over gloo): two ranks under torchrun, and two
"machines" on localhost (`--num-nodes 2`, NODE_RANK 0 and 1, one process each).

On a cold cache exactly one tokenizer is trained and one cache written, both ranks train, and the
validation BLEU that the ranks gather equals a one-process `evaluate.py` of the final checkpoint. A
stop that one rank alone finds during validation stops both at the same batch.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from seq2seq.commands import evaluate as evaluate_command
from tests.conftest import tiny_train_args, write_corpus

TRAIN = ("-m", "seq2seq", "train")  # `python -m seq2seq train`; torchrun takes -m too
# A wider model at a high rate reaches a BLEU above zero within 40 steps: equal BLEU means something.
LEARNS = ("--emb-size", "32", "--hidden-size", "64", "--lr", "1e-2", "--dropout", "0",
          "--word-dropout", "0", "--label-smoothing", "0", "--max-epochs", "1000", "--val-every", "20")  # fmt: skip
# Imported by every Python process of a run (PYTHONPATH): appends a line per tokenizer training,
# which it slows down so that a second process, unless held back until the first is done, would
# find no tokenizer either and train its own.
PROBE = """
import os
import time
from seq2seq.data.tokenizer import Tokenizer

_train = Tokenizer.train.__func__


def _counted(cls, *args, **kwargs):
    with open(os.environ["SEQ2SEQ_TEST_TRAINED"], "a") as log:
        log.write(f"{os.getpid()}\\n")
    time.sleep(2)
    return _train(cls, *args, **kwargs)


Tokenizer.train = classmethod(_counted)
"""


# Imported by every process of a run (PYTHONPATH): rank 0 alone finds its --max-minutes spent at the
# first batch of a validation pass; rank 1's budget is untouched.
SPENT_ON_RANK_0 = """
import os
import seq2seq.training.system as system

_real = system.TranslationSystem.validation_step


def _step(self, batch, batch_idx):
    if os.environ.get("RANK") == "0" and batch_idx == 0 and not self.trainer.sanity_checking:
        for callback in self.trainer.callbacks:
            if type(callback).__name__ == "PoliteStop":
                callback.started -= callback.budget
    return _real(self, batch, batch_idx)


system.TranslationSystem.validation_step = _step
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def probed_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a run's processes: one thread each (two processes on two shared cores)
    and the probe that counts tokenizer trainings."""
    probe = tmp_path / "probe"
    probe.mkdir(exist_ok=True)
    (probe / "sitecustomize.py").write_text(PROBE)
    path = os.pathsep.join(filter(None, [str(probe), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path,
            "SEQ2SEQ_TEST_TRAINED": str(tmp_path / "trained.txt"), **extra}  # fmt: skip


def ddp_flags(corpus: Path, tmp_path: Path, *extra: str) -> list[str]:
    return tiny_train_args(corpus, tmp_path / "runs", *LEARNS, "--cache-dir",
                           str(tmp_path / "cache"), "--strategy", "ddp", *extra)  # fmt: skip


def torchrun(flags: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *TRAIN,
               *flags, "--devices", "2"]  # fmt: skip
    run = subprocess.run(
        command, cwd=tmp_path, env=probed_env(tmp_path), capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def check_cold_cache_built_once(tmp_path: Path) -> None:
    """One tokenizer training among all processes; one model file, one encoded cache per split."""
    assert len((tmp_path / "trained.txt").read_text().split()) == 1
    cache = tmp_path / "cache"
    assert len(list(cache.glob("*.model"))) == 1 and not list(cache.glob("*.tmp"))
    encoded = sorted(p.name for p in (cache / "encoded").iterdir())
    assert len(encoded) == 3 and not [name for name in encoded if name.startswith(".")]
    for split in ("train", "val", "test"):
        assert len([name for name in encoded if f"-{split}-" in name]) == 1, encoded


def check_bleu_equals_one_process_evaluation(run_dir: Path, steps: int) -> None:
    """The last validation's BLEU, gathered over the ranks, is evaluate.py's on last.ckpt."""
    events = EventAccumulator(str(run_dir))
    events.Reload()
    bleus = events.Scalars("val/bleu")
    assert bleus[-1].step == steps - 1  # Lightning logs at the step before the counter moves
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == steps
    out = run_dir / "eval.json"
    argv = [str(last), "--split", "val", "--beam", "1", "--device", "cpu", "--json", str(out)]
    assert evaluate_command.main(argv) == 0
    single = json.loads(out.read_text())
    assert bleus[-1].value > 0  # else equality would prove little
    assert single["bleu"] == pytest.approx(bleus[-1].value, abs=1e-4)  # events store float32


def test_torchrun_two_processes_build_the_cache_once_train_resume_and_validate_like_one(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    first = torchrun(ddp_flags(tiny_corpus, tmp_path, "--max-steps", "20"), tmp_path)
    assert "All distributed processes registered. Starting with 2 processes" in first.stderr
    assert first.stdout.count("Logging to") == 1  # rank 0 alone prints, logs and checkpoints
    check_cold_cache_built_once(tmp_path)
    run_dir = tmp_path / "runs" / "rnn-additive" / "version_0"
    last = run_dir / "checkpoints" / "last.ckpt"
    resumed = torchrun(
        ddp_flags(tiny_corpus, tmp_path, "--max-steps", "40", "--resume", str(last)), tmp_path
    )
    assert f"Resuming {last} at step 20" in resumed.stdout
    assert [p.name for p in run_dir.parent.iterdir()] == ["version_0"]  # the same run, continued
    check_cold_cache_built_once(tmp_path)  # the resumed run trained no tokenizer
    check_bleu_equals_one_process_evaluation(run_dir, 40)


def test_two_machines_on_localhost_build_the_cache_once_train_and_validate_like_one(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    flags = ddp_flags(tiny_corpus, tmp_path, "--max-steps", "40", "--num-nodes", "2")
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    nodes = [
        subprocess.Popen(
            [sys.executable, *TRAIN, *flags],
            cwd=tmp_path,
            env=probed_env(tmp_path, NODE_RANK=str(rank), **common),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        outputs = [node.communicate(timeout=240) for node in nodes]
    finally:
        for node in nodes:  # a failed or hung run leaves no process behind
            node.kill()
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr[-3000:]
    assert "All distributed processes registered. Starting with 2 processes" in outputs[0][1]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in outputs[1][1]  # the second machine joined as rank 1
    assert [out.count("Logging to") for out, _ in outputs] == [1, 0]
    check_cold_cache_built_once(tmp_path)
    check_bleu_equals_one_process_evaluation(tmp_path / "runs" / "rnn-additive" / "version_0", 40)


def test_a_stop_one_rank_finds_during_validation_stops_both_at_the_same_batch(
    tmp_path: Path,
) -> None:
    # 300 validation pairs: several batches a rank, so the pass has a next batch to stop at.
    corpus = write_corpus(tmp_path / "corpus", {"train": 200, "val": 300, "test": 20})
    spent = tmp_path / "spent"
    spent.mkdir()
    (spent / "sitecustomize.py").write_text(SPENT_ON_RANK_0)
    flags = ddp_flags(corpus, tmp_path, "--max-steps", "20", "--val-every", "10")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *TRAIN,
               *flags, "--devices", "2", "--max-minutes", "60"]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(spent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    # Without the agreement rank 1 would wait in a collective for ever: the timeout fails the test.
    stopped = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=240)  # fmt: skip
    assert stopped.returncode != 0, stopped.stderr[-3000:]  # torchrun reports a rank's 4 as 1
    run_dir = tmp_path / "runs" / "rnn-additive" / "version_0"
    last = run_dir / "checkpoints" / "last.ckpt"
    marker = json.loads((last.parent / "stopped.json").read_text())
    assert marker == {"reason": "stopped by --max-minutes 60", "step": 10, "checkpoint": str(last)}
    assert torch.load(last, weights_only=False)["global_step"] == 10
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert "val/bleu" not in events.Tags()["scalars"]  # the pass ended before its end: no BLEU
    # The resumed run validates update 10 again, whole, then trains to 20: one BLEU per update
    # validated, none from the stopped pass.
    torchrun(ddp_flags(corpus, tmp_path, "--max-steps", "20", "--val-every", "10", "--resume",
                       str(last)), tmp_path)  # fmt: skip
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert [scalar.step for scalar in events.Scalars("val/bleu")] == [9, 19]
    assert torch.load(last, weights_only=False)["global_step"] == 20
