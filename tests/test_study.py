"""`python -m seq2seq study` end to end: a tiny study (2 variants x 2 seeds) trained, killed mid-run with a real
SIGKILL, started again, finished without retraining, and reported; its figures checked by hand and its
p-values against sacrebleu's own command line."""

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

from seq2seq.commands import study as study_script
from seq2seq.study.layout import Study
from seq2seq.study.spec import Run
from tests.conftest import tiny_train_args

STUDY = ("-m", "seq2seq", "study")  # `python -m seq2seq study`
ROOT = Path(__file__).resolve().parents[1]
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


@pytest.mark.slow
def test_a_killed_study_resumes_and_reports_what_sacrebleu_prints(tiny_corpus, tmp_path):
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
        # All seeds: the concatenated files, as a user would make them.
        for variant in ("a", "d"):
            text = "".join((folder / "runs" / f"{variant}-seed{s}" / "test.hyp").read_text()
                           for s in (1, 2))  # fmt: skip
            (tmp_path / f"{variant}.all").write_text(text)
        (tmp_path / "refs.all").write_text(refs.read_text() * 2)
        printed = subprocess.run(
            ["sacrebleu", str(tmp_path / "refs.all"), "-i", str(tmp_path / "a.all"),
             str(tmp_path / "d.all"), test, "-m", "bleu"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert rows["all"][key] == pytest.approx(json.loads(printed)[1]["BLEU"]["p_value"])

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


def test_bad_specs_are_refused_in_one_line_before_any_training(tmp_path, capsys):
    folder = tmp_path / "study"
    cases = [
        (["--variant", "a", "--score additive", "--seeds", "1", "1"], "--seeds lists a seed twice"),
        (["--variant", "a", "--score addtive", "--seeds", "1"], "variant a: train.py refuses"),
        (["--variant", "a", "--seed 3", "--seeds", "1"], "--seed is set by the study itself"),
        (["--variant", "a/b", "--score dot", "--seeds", "1"], "variant name 'a/b'"),
        (["--seeds", "1"], "at least one variant"),
    ]
    for flags, message in cases:
        assert study_script.main(["run", str(folder), "--work-dir", str(tmp_path), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and message in err[-1], err
    assert not folder.exists()  # nothing written, nothing trained
    assert study_script.main(["status", str(folder)]) == 2
    assert "no study.json" in capsys.readouterr().err


def test_a_saved_study_refuses_another_spec_and_lists_its_commands(tmp_path, capsys):
    folder, work = tmp_path / "study", tmp_path / "work"
    spec = [
        "--variant",
        "a",
        "--score additive",
        "--variant",
        "d",
        "--score dot",
        "--seeds",
        "1",
        "2",
    ]
    assert study_script.main(["commands", str(folder), "--work-dir", str(work), *spec]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # `python LINE` runs the run: `python -m seq2seq study one DIR VARIANT SEED ...`
    assert all(line.split()[:4] == ["-m", "seq2seq", "study", "one"] for line in lines)
    assert [line.split()[5:7] for line in lines] == [["a", "1"], ["d", "1"], ["a", "2"], ["d", "2"]]
    assert all(f"--work-dir {work}" in line for line in lines)
    other = ["--variant", "a", "--score scaled", "--seeds", "1"]
    assert study_script.main(["commands", str(folder), "--work-dir", str(work), *other]) == 2
    assert "holds another study" in capsys.readouterr().err
    assert study_script.main(["status", str(folder), "--work-dir", str(work)]) == 0
    assert capsys.readouterr().out.split() == ["a-seed1", "new", "d-seed1", "new", "a-seed2",
                                               "new", "d-seed2", "new"]  # fmt: skip


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


def test_report_lists_a_runs_commits_in_sitting_order_and_explains_all_only_when_shown():
    from seq2seq.study.report import FIGURES, markdown, summarize
    from seq2seq.study.spec import StudySpec

    def run(seed: int, commits: list[str]) -> dict:
        trained = [{"commit": c, "cpu": "test CPU"} for c in commits]
        return {"variant": "a", "seed": seed, "bleu": 30.0, "chrf": 50.0, "aer": None,
                "checkpoint_rule": "best single", "updates": 10, "train_hours": 0.1,
                "trained": trained, "bleu_signature": "b", "chrf_signature": "c"}  # fmt: skip

    # the later commit sorts first by name: the table must follow the sittings, not the alphabet
    runs = [run(1, ["f" * 40, "0" * 39 + "1", "f" * 40]), run(2, ["1" * 40 + "+dirty"])]
    figures = {key: summarize([]) for key, _, _ in FIGURES}
    figures["bleu"] = summarize([30.0])
    report = {"variants": {"a": {**figures, "seeds": [1]}}, "runs": runs}
    row = {"baseline": "a", "system": "b", "seeds": "1", "bleu_baseline": 30.0,
           "bleu_system": 31.0, "delta": 1.0, "bleu_agreement": 0.64, "chrf_baseline": 50.0,
           "chrf_system": 51.0, "chrf_delta": 1.0, "chrf_agreement": 0.71, "p_bs": 0.2,
           "p_ar": 0.01, "p_bs_holm": 0.4, "p_ar_holm": 0.02}  # fmt: skip
    spec = StudySpec(variants={"a": [], "b": []}, seeds=[1])

    text = markdown(Study("s"), spec, {**report, "significance": [row]})
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if "-seed" in line}
    assert "| fffffff, 0000000 |" in rows["| a-seed1"]
    assert "| 1111111+ |" in rows["| a-seed2"]
    assert "`all`" not in text and "Bold: adjusted p < 0.05" in text
    # the raw p-values plain, the adjusted ones beside them, bold only where they stay below 0.05
    assert "| 0.2000 | 0.4000 | 0.0100 | **0.0200** |" in text

    text = markdown(Study("s"), spec, {**report, "significance": [row, {**row, "seeds": "all"}]})
    assert "`all`: each variant's hypotheses of every seed concatenated" in text
