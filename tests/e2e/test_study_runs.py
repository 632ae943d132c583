"""A study's runs as processes: started from another folder with relative paths, stopped by
--max-minutes and by a real SIGTERM (status 4 each time, the run never trained by a stopped sitting),
continued to its end; one process per run (a second waits on the run's lock, saying for whom, and a
stop ends its wait with status 4); a stop that comes while a child starts reaches it."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seq2seq.machine import native_bf16
from seq2seq.study import process
from seq2seq.study.layout import Study
from seq2seq.study.spec import Run
from tests.conftest import ROOT, tiny_train_args
from tests.unit.study.test_study_runs import sittings

STUDY = ("-m", "seq2seq", "study")  # `python -m seq2seq study`
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def tiny_flags(corpus: str) -> str:
    flags = tiny_train_args(Path(corpus), Path("unused"), "--max-steps", "40", "--max-epochs",
                            "1000", "--val-every", "20", "--keep-best", "2")  # fmt: skip
    at = flags.index("--log-dir")  # the study sets the log folder itself
    return " ".join(flags[:at] + flags[at + 2 :])


def wait_until(condition, what: str, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_study_from_another_folder_stops_and_resumes_to_its_end(tiny_corpus, tmp_path):
    caller = tmp_path / "caller"
    shutil.copytree(tiny_corpus, caller / "corpus")
    # DIR, --work-dir and the corpus all relative to the caller's folder, not the checkout's
    command = [sys.executable, *STUDY, "run", "study", "--work-dir", "work", "--variant", "a",
               "--score additive", "--seeds", "1", "--flags", tiny_flags("corpus"),
               "--threads", "1"]  # fmt: skip
    work, study, run = caller / "work", Study(caller / "study", caller / "work"), Run("a", 1)

    # Sitting 1: --max-minutes spent (0.6 ms) before anything could be prepared or trained: the
    # sitting ends with status 4 and the run is as it was, new.
    first = subprocess.run([*command, "--max-minutes", "0.00001"], cwd=caller, env=ENV,
                           capture_output=True, text=True)  # fmt: skip
    assert first.returncode == 4, first.stderr
    assert "stopped by --max-minutes: a-seed1" in first.stderr
    assert study.state(run) == "new"
    spec = json.loads((caller / "study" / "study.json").read_text())
    # Saved relative to the folder the study runs in (its children run there too), so the caller's
    # folder moves or is cloned with its study.
    assert spec["flags"][spec["flags"].index("--data-dir") + 1] == "corpus"

    # Sitting 2: a real SIGTERM to study.py run while its run's train.py waits for the data cache's
    # lock (held here, as another rank's builder would hold it): passed on to train.py, which stops
    # before training with nothing to save; status 4, and the run is still new (not trained, and
    # not scored).
    from seq2seq.data.cachelock import exclusive
    from seq2seq.data.prepare import cache_lock
    from seq2seq.training.config import parse_args

    with contextlib.chdir(caller):  # the spec's paths are the caller's folder's, as the runs' are
        lock = cache_lock(parse_args([*spec["flags"], "--cache-dir", str(work / "cache")]))
    log = work / "runs" / "a-seed1" / "train.log"
    with exclusive(lock, print):
        stopped = subprocess.Popen(command, cwd=caller, env=ENV, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)  # fmt: skip
        try:
            wait_until(lambda: log.exists() and "waiting for" in log.read_text(),
                       "train.py never waited for the cache lock")  # fmt: skip
            stopped.send_signal(signal.SIGTERM)
            _, err = stopped.communicate(timeout=120)
        finally:
            if stopped.poll() is None:
                stopped.kill()
    assert stopped.returncode == 4, err
    assert log.read_text().strip().splitlines()[-1] == (
        "stopped by SIGTERM before training began; nothing new to save"
    )
    assert study.state(run) == "new"

    # Sitting 3: to the end, scored, reported; from another folder still.
    done = subprocess.run(command, cwd=caller, env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # The stopped sitting left no checkpoint: a new run starts afresh, its folder (and log) gone.
    assert len(sittings(work, "a-seed1")) == 1
    result = json.loads((caller / "study" / "runs" / "a-seed1" / "result.json").read_text())
    assert result["updates"] == 40
    # The flags leave --precision at auto; the result says what that became on this CPU.
    assert result["precision"] == ("bf16-mixed" if native_bf16() else "32-true")
    assert (caller / "study" / "report.md").exists()
    status = subprocess.run([sys.executable, *STUDY, "status", "study", "--work-dir", "work"],
                            cwd=caller, env=ENV, capture_output=True, text=True)  # fmt: skip
    assert status.stdout.split()[:3] == ["a-seed1", "done", "BLEU"]


def test_a_variant_s_own_stop_signal_is_refused_in_one_line(tmp_path):
    # The study passes SIGTERM and SIGUSR1 on; a USR2 sent for one variant would end the study.
    done = subprocess.run([sys.executable, *STUDY, "run", str(tmp_path / "study"), "--variant",
                           "a", "--stop-signal USR2", "--seeds", "1"], env=ENV,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: variant a: --stop-signal USR2: a study passes SIGTERM and SIGUSR1 on to its runs, "
        "no other; leave --stop-signal out and have the scheduler send SIGUSR1 (SLURM: "
        "--signal=USR1@120)"
    ]
    assert not (tmp_path / "study").exists()


STOPPED_WHILE_STARTING = """
import os, signal, subprocess, sys
from seq2seq.signals import forwarding
from seq2seq.study import process

children = []
child_code = ("import signal, time; print(signal.pthread_sigmask(signal.SIG_BLOCK, []), "
              "signal.getsignal(signal.SIGTERM), flush=True); time.sleep(60)")
with forwarding(children):
    real = subprocess.Popen.__init__

    def popen(self, *args, **kwargs):  # a SIGTERM to this process while the child starts
        real(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)

    subprocess.Popen.__init__ = popen
    child = process.start([sys.executable, "-c", child_code], children, stdout=subprocess.PIPE,
                          text=True)
    subprocess.Popen.__init__ = real
    try:
        print(child.wait(timeout=60), children == [child], child.stdout.read().strip())
    except subprocess.TimeoutExpired:
        child.kill()
        print("the child never got the stop")
"""


def test_a_stop_while_a_child_is_being_started_reaches_it():
    # In a process of one thread, as study.py's are: the stop signals are held while the child is
    # started and added to the list they are passed on to; the child itself starts with them
    # unblocked and at their default action, so the stop ends it.
    done = subprocess.run([sys.executable, "-c", STOPPED_WHILE_STARTING], capture_output=True,
                          text=True, env={**ENV, "PYTHONPATH": str(ROOT)}, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    status, listed, *said = done.stdout.split(maxsplit=2)
    assert (status, listed) == (str(-signal.SIGTERM), "True"), done.stdout
    assert said in ([], ["set() Handlers.SIG_DFL"]), done.stdout  # if it printed before it ended


def test_a_second_process_for_a_run_waits_for_the_first_and_stops_on_sigterm(tiny_corpus, tmp_path):
    folder, work = tmp_path / "study", tmp_path / "work"
    spec = ["--variant", "a", "--score additive", "--seeds", "1", "--flags",
            tiny_flags(str(tiny_corpus))]  # fmt: skip
    listed = subprocess.run([sys.executable, *STUDY, "commands", str(folder), "--work-dir",
                             str(work), *spec], env=ENV, capture_output=True, text=True)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    study, run = Study(folder, work), Run("a", 1)
    log = tmp_path / "second.log"
    with process.run_lock(study, run):  # this process is the first: it holds the run
        with open(log, "w") as err:
            second = subprocess.Popen([sys.executable, *STUDY, "one", str(folder), "a", "1",
                                       "--work-dir", str(work), "--threads", "1"],
                                      env=ENV, stderr=err)  # fmt: skip
        wait_until(lambda: "waiting for" in log.read_text(), "the second process never waited")
        assert f"a-seed1: waiting for pid {os.getpid()} on " in log.read_text()
        time.sleep(1)
        assert second.poll() is None and sittings(work, "a-seed1") == []  # it trains nothing
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 4
    assert "a-seed1: stopped by SIGTERM; start it again to continue" in log.read_text()


NO_POSIX_LOCKS = """
import errno, fcntl, sys
from pathlib import Path

def no_locks(fd, cmd, *args):
    raise OSError(errno.ENOLCK, "No locks available")  # NFS without its lock daemon

fcntl.lockf = no_locks
from seq2seq.study import process
from seq2seq.study.layout import Study
from seq2seq.study.spec import Run

with process.run_lock(Study(sys.argv[1], sys.argv[2]), Run("a", 1)):
    print("got it", flush=True)
"""


def test_without_posix_locks_a_run_s_lock_is_a_lock_file_and_a_dead_holder_s_is_stale(
    tmp_path, monkeypatch, capsys
):
    import errno
    import fcntl

    from seq2seq.data.cachelock import Owner, held_file, held_path
    from seq2seq.errors import Stopped

    def no_locks(fd, cmd, *args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    study, run = Study(tmp_path / "study", tmp_path / "work"), Run("a", 1)
    lock, me = study.lock_path(run), Owner.me()
    held = held_path(lock)
    held.parent.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    held.write_text(f"{Owner(me.host, dead.pid, 1).tag}\n")  # left by a process killed -9
    with process.run_lock(study, run):
        assert held.read_text().strip() == me.tag  # taken over: its holder is gone
        # A second process for the run waits, naming this one, and gets nothing while it waits.
        log = tmp_path / "second.log"
        with open(log, "w") as err:
            second = subprocess.Popen([sys.executable, "-c", NO_POSIX_LOCKS, str(study.folder),
                                       str(study.work_dir)], env=ENV, stdout=subprocess.PIPE,
                                      stderr=err, text=True)  # fmt: skip
        try:
            wait_until(lambda: "waiting for" in log.read_text(), "the second never waited", 60)
            assert f"a-seed1: waiting for {me}, which is training or scoring it" in log.read_text()
        finally:
            second.kill()
        assert second.communicate()[0] == ""  # it never held the run
    assert f"removed {held.name}, left by pid {dead.pid} on {me.host}, which is gone" in (
        capsys.readouterr().err
    )
    assert not held.exists()  # released with the block
    # A holder on another machine cannot be judged from here: it is waited for, not taken over.
    held.write_text(f"{Owner('node-b', dead.pid, 1).tag}\n")
    said: list[str] = []
    with pytest.raises(Stopped), held_file(lock, said.append, stop=lambda: "stopped"):
        pass
    assert said == [
        f"waiting for pid {dead.pid} on node-b (lock file {held.name})",
        f"{held}: this host cannot see whether pid {dead.pid} on node-b still runs (another "
        f"machine, another PID namespace, or a hidden /proc); if it does not, delete {held}",
    ]
    assert held.read_text().strip() == Owner("node-b", dead.pid, 1).tag


CHILD_OF_A_KILLED_PARENT = """
import sys
from seq2seq.study import process
# The parent runs a child as scoring runs evaluate.py; the child writes its pid and sleeps.
process.run_child([sys.executable, "-c",
                   "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
                   "time.sleep(120)", sys.argv[1]])
"""


def test_a_scoring_child_dies_with_its_killed_parent(tmp_path):
    pid_file = tmp_path / "child.pid"

    def gone() -> bool:
        try:
            state = Path(f"/proc/{pid_file.read_text()}/stat").read_text()
        except OSError:
            return True
        return state.rsplit(")", 1)[1].split()[0] == "Z"  # dead, not yet reaped by its new parent

    parent = subprocess.Popen([sys.executable, "-c", CHILD_OF_A_KILLED_PARENT, str(pid_file)],
                              env={**ENV, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), "no child started", 60)
        parent.kill()  # kill -9 of `study.py score`: no handler runs
        parent.wait(10)
        wait_until(gone, "the child outlived its killed parent", 10)
    finally:
        if parent.poll() is None:
            parent.kill()
        if pid_file.exists() and pid_file.read_text() and not gone():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # a failed check leaves no sleeper
