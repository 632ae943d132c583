"""A sitting whose --max-minutes are spent before it begins neither trains nor scores (a study's runs
as processes, stopped and continued: tests/e2e/test_study_runs.py)."""

import json
import subprocess
import time
from pathlib import Path

import pytest

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


def test_runs_share_the_cores_the_job_may_use_not_the_hosts(tmp_path, monkeypatch, capsys):
    """An array task allocated 2 of a host's 64 cores: 2 threads for one run, 1 each for two."""
    from seq2seq.commands import study as study_script
    from seq2seq.study import scheduler

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {4, 5}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    folder, work = tmp_path / "study", tmp_path / "work"
    spec = ["--variant", "a", "--score additive", "--seeds", "1"]
    assert study_script.main(["commands", str(folder), "--work-dir", str(work), *spec]) == 0
    study, threads = Study(folder, work), []

    class NotStarted(Exception):
        pass

    def one_command(study, run, count, max_minutes=None):  # the run's command: never started
        threads.append(count)
        raise NotStarted

    def train_and_score(study, spec, run, count, *rest):
        threads.append(count)
        return 0

    monkeypatch.setattr(scheduler, "one_command", one_command)
    with pytest.raises(NotStarted):
        scheduler.run_all(study, None, parallel=2, threads=None)
    monkeypatch.setattr(scheduler, "train_and_score", train_and_score)
    assert scheduler.run_one(study, Run("a", 1), threads=None) == 0
    assert threads == [1, 2]


def test_a_run_s_lock_held_by_its_record_on_another_node_is_waited_for(
    tmp_path, monkeypatch, capsys
):
    """Where the file system's locks reach one node only (NFS nolock, Lustre localflock), this node
    can lock a run that a task on node-b trains: its record says so, and the run is waited for."""
    import os
    import threading

    from seq2seq.data import cachelock
    from seq2seq.data.owners import Owner

    monkeypatch.setattr(cachelock, "POLL_SECONDS", 0.01)
    study, run = Study(tmp_path / "study", tmp_path / "work"), Run("a", 1)
    lock = study.lock_path(run)
    lock.parent.mkdir(parents=True)
    lock.write_text(f"{Owner('node-b', 4242, 7).tag}\n")
    got = threading.Event()

    def second_task() -> None:
        with process.run_lock(study, run):
            got.set()

    task = threading.Thread(target=second_task)
    task.start()
    try:
        assert not got.wait(0.5), "took a run that node-b holds"
    finally:
        os.truncate(lock, 0)  # node-b's task ended (or a user emptied the record as told)
        task.join(10)
    assert got.is_set()
    err = capsys.readouterr().err
    assert f"{lock} names pid 4242 on node-b as its holder" in err
    assert "a-seed1: waiting for pid 4242 on node-b, which is training or scoring it" in err
