"""`python -m seq2seq study` end to end: a tiny study (2 variants x 2 seeds) trained, killed mid-run with a real
SIGKILL, started again, finished without retraining, and reported; its figures checked by hand and its
p-values against sacrebleu's own command line. The score curves of a resumed run, through
docs/tools/score_curves.py run as a user runs it."""

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seq2seq.study import report as report_module
from seq2seq.study.layout import Study
from seq2seq.study.scheduler import run_all
from seq2seq.study.spec import Run
from tests.conftest import ROOT, tiny_train_args

STUDY = ("-m", "seq2seq", "study")  # `python -m seq2seq study`


RUNS = ["a-seed1", "d-seed1", "a-seed2", "d-seed2"]  # the order `run` takes them in


def common_flags(corpus: Path) -> str:
    flags = tiny_train_args(corpus, Path("unused"), "--max-steps", "120", "--max-epochs", "1000",
                            "--val-every", "30", "--lr", "1e-2", "--warmup-steps", "10",
                            "--dropout", "0", "--keep-best", "2")  # fmt: skip
    at = flags.index("--log-dir")  # the study sets the log folder itself
    return " ".join(flags[:at] + flags[at + 2 :])


def study_command(folder: Path, work: Path, corpus: Path) -> list[str]:
    return [sys.executable, *STUDY, "run", str(folder), "--work-dir", str(work),
            "--variant", "a", "--score additive", "--variant", "d", "--score dot",
            "--seeds", "1", "2", "--flags", common_flags(corpus), "--threads", "1"]  # fmt: skip


def sittings(work: Path, run: str) -> list[dict]:
    path = work / "runs" / run / "sittings.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def global_step(work: Path, run: str) -> int:
    path = work / "runs" / run / "version_0" / "checkpoints" / "last.ckpt"
    return torch.load(path, weights_only=False)["global_step"]


def test_a_killed_study_resumes_and_reports_what_sacrebleu_prints(
    tiny_corpus, tmp_path, monkeypatch
):
    folder, work = tmp_path / "study", tmp_path / "work"
    command = study_command(folder, work, tiny_corpus)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    # Kill the whole study (runner, run, train.py) once the first run is done and the second has a
    # checkpoint to resume from but has not finished training.
    last = work / "runs" / RUNS[1] / "version_0" / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 240
    while not (last.exists() and (folder / "runs" / RUNS[0] / "result.json").exists()):
        assert process.poll() is None, "the study ended before it could be killed"
        assert time.monotonic() < deadline, "the second run never wrote a checkpoint"
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (work / "runs" / RUNS[1] / "trained.json").exists()  # killed mid-training
    killed_at = global_step(work, RUNS[1])
    assert 0 < killed_at < 120
    assert Study(folder, work).progress(Run("d", 1)).startswith(f"update {killed_at} of 120 (")
    first_result = (folder / "runs" / RUNS[0] / "result.json").read_bytes()
    bleu = json.loads(first_result)["bleu"]
    assert Study(folder, work).progress(Run("a", 1)).startswith(f"BLEU {bleu:.2f}, chrF ")

    # Two runs at a time from here (one thread each): the rest of the study, on both cores.
    done = subprocess.run([*command, "--parallel", "2"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "1 of 4 runs done; 3 to go" in done.stdout
    # The finished run was neither retrained nor rescored; the killed one resumed from its checkpoint.
    assert len(sittings(work, RUNS[0])) == 1
    assert (folder / "runs" / RUNS[0] / "result.json").read_bytes() == first_result
    resumed = sittings(work, RUNS[1])
    assert len(resumed) == 2 and "--resume" in resumed[1]["command"]
    assert "--resume" not in resumed[0]["command"]
    for run in RUNS:
        assert global_step(work, run) == 120
        assert (folder / "runs" / run / "test.hyp").read_text().count("\n") == 20

    # Started once more, there is nothing left to do.
    again = subprocess.run(command, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "4 of 4 runs done; 0 to go" in again.stdout

    # The report at the end is built by a new process, with the code of now: a study that ran for
    # days while its checkout changed under it would otherwise load the report's modules anew into
    # a process that holds the old ones. Here the scheduler's own report code is broken.
    def stale(*args: object) -> None:
        raise AssertionError("the report was built by the scheduler's own, stale code")

    (folder / "report.md").unlink()
    monkeypatch.setattr(report_module, "build_report", stale)
    assert run_all(Study(folder, work), None, parallel=1, threads=1) == 0
    assert "| a | d | all |" in (folder / "report.md").read_text()

    report = json.loads((folder / "report.json").read_text())
    results = {run: json.loads((folder / "runs" / run / "result.json").read_text()) for run in RUNS}
    for variant in ("a", "d"):
        bleu = [results[f"{variant}-seed{s}"]["bleu"] for s in (1, 2)]
        summary = report["variants"][variant]["bleu"]
        assert summary["mean"] == pytest.approx((bleu[0] + bleu[1]) / 2)
        assert summary["sd"] == pytest.approx(abs(bleu[0] - bleu[1]) / 2**0.5)
        assert summary["ci95"] == pytest.approx(12.7062 * summary["sd"] / 2**0.5)  # t(0.975, 1)
        entropy = [results[f"{variant}-seed{s}"]["attn_entropy"] for s in (1, 2)]
        assert report["variants"][variant]["attn_entropy"]["sd"] == pytest.approx(
            statistics.stdev(entropy)
        )
    # The variants translate differently, so the paired tests below compare something.
    assert results["a-seed2"]["chrf"] != results["d-seed2"]["chrf"]
    assert (folder / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| a | d | all |" in (folder / "report.md").read_text()

    # The p-values are sacrebleu's own: its command line on the same files prints the same.
    refs = tiny_corpus / "test.en"
    rows = {row["seeds"]: row for row in report["significance"]}
    for test, key in (("--paired-bs", "p_bs"), ("--paired-ar", "p_ar")):
        hyps = [folder / "runs" / run / "test.hyp" for run in ("a-seed2", "d-seed2")]
        printed = subprocess.run(
            ["sacrebleu", str(refs), "-i", *map(str, hyps), test, "-m", "bleu"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        system = json.loads(printed)[1]
        assert rows["2"][key] == pytest.approx(system["BLEU"]["p_value"])
        # All seeds resample source sentences with every seed's outputs of them, which sacrebleu's
        # command cannot: tests/unit/study/test_report_significance.py checks that line.

    # A stop while a run is scored ends the scoring and its evaluate.py too; the run stays
    # `trained` and the next start scores it again, to the same figures.
    result = folder / "runs" / "a-seed2" / "result.json"
    first = json.loads(result.read_text())
    result.unlink()
    one = [sys.executable, *STUDY, "one", str(folder), "a", "2", "--work-dir", str(work),
           "--threads", "1"]  # fmt: skip
    process = subprocess.Popen(one, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any("seq2seq evaluate" in line for line in commands_naming(work)):
        assert process.poll() is None, "the scoring ended before it could be stopped"
        assert time.monotonic() < deadline, "seq2seq evaluate never started"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 4
    assert "scoring stopped by SIGTERM" in err
    time.sleep(0.5)  # a killed child is gone at once; one left running would still be here
    assert commands_naming(work) == []
    assert not result.exists()
    assert Study(folder, work).state(Run("a", 2)) == "trained"
    assert subprocess.run(one, env=env, capture_output=True).returncode == 0
    again = json.loads(result.read_text())
    assert (again["bleu"], again["chrf"]) == (first["bleu"], first["chrf"])


def commands_naming(path: Path) -> list[str]:
    """The command lines of the running processes that name `path` (zombies have none)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:  # ended while we looked
            continue
        line = " ".join(word.decode(errors="replace") for word in words)
        if str(path) in line:
            found.append(line)
    return found


def test_score_curves_join_the_sittings_of_a_resumed_run(tmp_path):
    """seq2seq.study.events.run_curves (docs/tools/score_curves.py's): two sittings' events read
    as one curve per statistic, a validation the resumed sitting repeated taken from the later
    sitting."""
    from torch.utils.tensorboard import SummaryWriter

    from seq2seq.study.events import run_curves

    version = tmp_path / "dot-seed1" / "version_0"
    sittings = [{10: 3.0, 20: 2.5}, {20: 2.0, 30: 1.5}]  # update -> val/score_std
    for k, points in enumerate(sittings):
        writer = SummaryWriter(str(version), filename_suffix=f".{k}")
        for step, value in points.items():
            writer.add_scalar("val/score_std", value, step)
            writer.add_scalar("val/max_weight", value / 10, step)
        writer.close()
        time.sleep(1.1)  # events files are named by the second they were opened in

    assert run_curves(tmp_path / "dot-seed1")["val/score_std"] == [
        (10, 3.0), (20, 2.0), (30, 1.5)
    ]  # fmt: skip
    # The analysis program over the package's curves: run as a user runs it, not loaded by path.
    tool = [sys.executable, str(ROOT / "docs" / "tools" / "score_curves.py")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    png = tmp_path / "curves.png"
    done = subprocess.run([*tool, str(tmp_path / "dot-seed1"), "--at", "1", "3", "4", "--png",
                           str(png)], env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = done.stdout.splitlines()
    assert rows[2] == "| dot-seed1 | score sd | 3.000 | 1.500 | - |"
    assert rows[3] == "| dot-seed1 | max weight | 0.300 | 0.150 | - |"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "empty" / "version_0").mkdir(parents=True)
    done = subprocess.run([*tool, str(tmp_path / "empty")], env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "empty: no val/score_std in version_*/ events" in done.stderr
