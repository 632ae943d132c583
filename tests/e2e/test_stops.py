"""Polite stops with real signals: train.py given SIGTERM, or the --stop-signal, in the middle of an
update saves last.ckpt on the update's boundary, says so in one line and exits with status 4; the same
command with --resume then ends where a run that was never stopped ends, weights bit for bit."""

import gc
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seq2seq.commands import train as train_command
from seq2seq.errors import STOPPED
from seq2seq.signals import handling
from tests.conftest import ROOT, tiny_train_args

TRAIN = ("-m", "seq2seq", "train")  # `python -m seq2seq train`


SHIM = ROOT / "scripts" / "train.py"


# Two batches an update, so a signal can land in the middle of one; no validation checkpoint comes
# before the stop; both kinds of dropout on, whose draws a resume continues: runs compare bit for bit.
FLAGS = ("--accumulate-grad-batches", "2", "--max-steps", "60", "--max-epochs", "1000",
         "--val-every", "1000", "--dropout", "0.3", "--word-dropout", "0.1")  # fmt: skip


def _env() -> dict[str, str]:
    root = str(ROOT)
    return {**os.environ, "PYTHONPATH": root, "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _weights(run: Path) -> dict:
    last = run / "rnn-additive" / "version_0" / "checkpoints" / "last.ckpt"
    return torch.load(last, weights_only=True)


@pytest.fixture(scope="module")
def straight(tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """last.ckpt of the run never stopped."""
    root = tmp_path_factory.mktemp("straight")
    args = tiny_train_args(tiny_corpus, root / "runs", *FLAGS)
    done = subprocess.run([sys.executable, *TRAIN, *args], cwd=root, env=_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return _weights(root / "runs")


@pytest.mark.parametrize("signame, flag", [("SIGTERM", ()), ("SIGUSR1", ())])
def test_a_signal_mid_update_saves_and_the_resumed_run_ends_as_if_never_stopped(
    tiny_corpus: Path, tmp_path: Path, straight: dict, signame: str, flag: tuple
) -> None:
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", *FLAGS, *flag)
    log = tmp_path / "train.log"
    with open(log, "w") as out:
        run = subprocess.Popen([sys.executable, *TRAIN, *args], cwd=tmp_path, env=_env(),
                               stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            # The bar counts updates, shown as each ends: the next one is under way, its first of
            # two batches training, when the signal lands.
            while not re.search(r"Epoch \d+/\d+: .*\| [3-9]/60 ", log.read_text()):
                assert run.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, "training never started"
                time.sleep(0.01)
            run.send_signal(getattr(signal, signame))
            status = run.wait(60)
        finally:
            if run.poll() is None:
                run.kill()
    assert status == STOPPED, log.read_text()[-2000:]
    last = Path("runs") / "rnn-additive" / "version_0" / "checkpoints" / "last.ckpt"
    step = _weights(tmp_path / "runs")["global_step"]
    assert 0 < step < 60
    assert log.read_text().strip().splitlines()[-1] == (
        f"stopped by {signame}: saved {tmp_path / last} at update {step}; continue with the same "
        f"command and --resume {tmp_path / last}"
    )
    assert not list(tmp_path.glob("hpc_ckpt*"))  # Lightning's SLURM files: not ours, not written
    resumed = subprocess.run([sys.executable, *TRAIN, *args, "--resume", str(tmp_path / last)],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True,
                             timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = _weights(tmp_path / "runs")
    assert after["global_step"] == straight["global_step"] == 60
    for name, value in straight["state_dict"].items():  # nothing lost, nothing trained twice
        assert torch.equal(after["state_dict"][name], value), name


def test_a_signal_before_training_begins_exits_4_with_nothing_saved(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    # SIGTERM while the data is prepared: the stop is noted and honoured before any update.
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", *FLAGS)
    code = (
        "import os, signal, sys\n"
        "import seq2seq.data.datamodule as data\n"
        "real = data.TranslationDataModule.setup\n"
        "def setup(self, stage=None):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real(self, stage)\n"
        "data.TranslationDataModule.setup = setup\n"
        "from seq2seq.commands.train import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == STOPPED, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "stopped by SIGTERM before training began; nothing new to save"
    )
    assert not list((tmp_path / "runs").rglob("*.ckpt"))


# train.py whose data module signals its own process from inside `train_dataloader`: Lightning has
# begun fitting (where it used to register its own SIGTERM handler), training has not started.
SIGNAL_IN_TRAIN_DATALOADER = (
    "import os, signal, sys\n"
    "import seq2seq.data.datamodule as data\n"
    "real = data.TranslationDataModule.train_dataloader\n"
    "def train_dataloader(self):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    return real(self)\n"
    "data.TranslationDataModule.train_dataloader = train_dataloader\n"
    "from seq2seq.commands.train import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_a_signal_while_lightning_sets_up_saves_the_sittings_update_and_keeps_the_marker(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    args = tiny_train_args(tiny_corpus, tmp_path / "runs", *FLAGS, "--max-steps", "4")
    ckpts = tmp_path / "runs" / "rnn-additive" / "version_0" / "checkpoints"
    last, marker = ckpts / "last.ckpt", ckpts / "stopped.json"
    for sitting, resume in ((1, []), (2, ["--resume", str(last)])):
        # Each sitting is signalled before its first update: it trains that update (the stop acts
        # on the next update boundary), saves it and says so, and stopped.json names it.
        done = subprocess.run([sys.executable, "-c", SIGNAL_IN_TRAIN_DATALOADER, *args, *resume],
                              cwd=tmp_path, env=_env(), capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert done.returncode == STOPPED, done.stderr[-2000:]
        assert done.stderr.strip().splitlines()[-1] == (
            f"stopped by SIGTERM: saved {last} at update {sitting}; continue with the same "
            f"command and --resume {last}"
        )
        assert torch.load(last, weights_only=True)["global_step"] == sitting
        record = json.loads(marker.read_text())
        assert record == {"reason": "stopped by SIGTERM", "step": sitting, "checkpoint": str(last)}
    # The chain goes on to its end; the finished run leaves no marker.
    done = subprocess.run([sys.executable, *TRAIN, *args, "--resume", str(last)], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert torch.load(last, weights_only=True)["global_step"] == 4
    assert not marker.exists()


def test_lightning_registers_no_signal_handler_of_its_own(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In-process: inside `train_dataloader` (Lightning's registration is behind it), SIGTERM and the
    # stop signal are still PoliteStop's.
    from seq2seq.data.datamodule import TranslationDataModule

    monkeypatch.chdir(tmp_path)
    loader, seen = TranslationDataModule.train_dataloader, []

    def train_dataloader(self: TranslationDataModule):
        seen.append({sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)})
        return loader(self)

    monkeypatch.setattr(TranslationDataModule, "train_dataloader", train_dataloader)
    assert (
        train_command.main(tiny_train_args(tiny_corpus, tmp_path / "runs", "--max-steps", "2")) == 0
    )
    (handlers,) = seen
    for handler in handlers.values():
        assert getattr(handler, "__self__", None).__class__.__name__ == "PoliteStop", handler


def test_an_abbreviated_flag_is_refused_in_one_line_with_status_2(tmp_path: Path) -> None:
    # docs/guides/errors.md: argparse's refusals are one line too, `<prog>: error: <reason> (see --help)`;
    # the shim scripts/train.py keeps its own name as <prog>, `python -m seq2seq train` says so.
    for command, prog in [((str(SHIM),), "train.py"), (TRAIN, "seq2seq train")]:
        done = subprocess.run([sys.executable, *command, "--scor", "additive"], cwd=tmp_path,
                              env=_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            f"{prog}: error: unrecognized arguments: --scor additive (see --help)"
        ]


def test_after_a_run_stopped_before_training_the_next_handler_hears_its_signal(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seq2seq.data.datamodule import TranslationDataModule

    monkeypatch.chdir(tmp_path)
    setup = TranslationDataModule.setup

    def reading(self: TranslationDataModule, stage: str | None = None) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # noted by the run's handler: no training starts
        setup(self, stage)

    monkeypatch.setattr(TranslationDataModule, "setup", reading)
    train, noted = train_command, []
    with handling([signal.SIGUSR1], lambda signum, frame: noted.append("before")):
        assert train.main(tiny_train_args(tiny_corpus, tmp_path / "runs")) == STOPPED
        # The next run in this process takes the signal over; whatever the stopped run left
        # behind (its handlers, their restoring) must not take it back, now or when collected.
        with handling([signal.SIGUSR1], lambda signum, frame: noted.append("next")):
            gc.collect()
            os.kill(os.getpid(), signal.SIGUSR1)
    assert noted == ["next"]
