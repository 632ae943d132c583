"""A sitting whose --max-minutes are spent before it begins neither trains nor scores (a study's runs
as processes, stopped and continued: tests/e2e/test_study_runs.py)."""

import json
import subprocess
import time
from pathlib import Path

from seq2seq.study import process
from seq2seq.study.layout import Study
from seq2seq.study.spec import Run


def sittings(work: Path, run: str) -> list[dict]:
    path = work / "runs" / run / "sittings.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_sitting_whose_time_is_spent_neither_trains_nor_scores(tmp_path, capsys):
    from seq2seq.study import scheduler

    study, run = Study(tmp_path / "study", tmp_path / "work"), Run("a", 1)
    spent = process.Budget(0.001, started=time.monotonic() - 1)  # 0.06 s, a second ago
    children: list[subprocess.Popen] = []
    # A new run: no train.py is started (the lock wait took the sitting's time).
    assert scheduler.train_and_score(study, None, run, 1, spent, children, []) == 4
    assert children == [] and sittings(study.work_dir, "a-seed1") == []
    assert capsys.readouterr().err == (
        "a-seed1: --max-minutes 0.001 spent before training began; start it again to continue\n"
    )
    # A trained run: its scoring waits for the next start.
    study.run_dir(run).mkdir(parents=True)
    study.trained_marker(run).write_text("{}\n")
    assert scheduler.train_and_score(study, None, run, 1, spent, children, []) == 4
    assert children == [] and study.state(run) == "trained"
    assert capsys.readouterr().err == (
        "a-seed1: --max-minutes 0.001 spent: trained, scored at the next start\n"
    )
    assert process.Budget(None).left() is None and not process.Budget(None).spent()
