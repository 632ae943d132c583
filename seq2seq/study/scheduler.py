"""The study scheduler: every unfinished run of a study trained and scored, `parallel` at a time
(`run_all`), one run trained and scored under its lock (`run_one`), a trained run scored again
(`score_one`), and what `seq2seq study` prints besides (`print_commands`, `print_status`,
`write_report`). Each run is a `seq2seq study one` child process, whose training is a `seq2seq train`
child (seq2seq.study.process) and whose scoring a `seq2seq study score` child, and `run_all`'s report
is a `seq2seq study report` child: a study that runs for days reports with the code of its end. Every
function returns the exit status the command ends with (0 done, 1 a run failed, 2 bad input, 4 stopped).
"""

import shlex
import signal
import subprocess
import sys
import time

from seq2seq.errors import STOPPED, Stopped, UserError
from seq2seq.machine import cores
from seq2seq.signals import STOPS, forwarding, handling
from seq2seq.study import process
from seq2seq.study.layout import Study
from seq2seq.study.spec import Run, StudySpec


def check_run(spec: StudySpec, run: Run) -> None:
    if run.variant not in spec.variants or run.seed not in spec.seeds:
        raise UserError(
            f"{run.name} is not in this study (variants {', '.join(spec.variants)}; "
            f"seeds {' '.join(map(str, spec.seeds))})"
        )


def one_command(
    study: Study, run: Run, threads: int | None, max_minutes: float | None = None
) -> list[str]:
    command = [*process.COMMAND, "study", "one", str(study.folder), run.variant, str(run.seed)]
    command += ["--work-dir", str(study.work_dir)]
    command += ["--threads", str(threads)] if threads else []
    return command + (["--max-minutes", str(max_minutes)] if max_minutes is not None else [])


def run_all(
    study: Study,
    spec: StudySpec | None,
    parallel: int,
    threads: int | None,
    max_minutes: float | None = None,
) -> int:
    """Every unfinished run through `study.py one`, `parallel` at a time; then the report, by a
    `seq2seq study report` child. Status 4 (STOPPED) when a stop signal or `max_minutes` left runs
    unfinished, 1 when a run failed."""
    if parallel <= 0:
        raise UserError(f"--parallel must be positive, got {parallel}")
    spec = study.open(spec)
    threads = threads or max(1, cores() // parallel)  # the job's cores, not the host's
    todo = [run for run in spec.runs() if study.state(run) != "done"]
    print(
        f"study {study.folder}: {len(spec.runs()) - len(todo)} of {len(spec.runs())} runs done; "
        f"{len(todo)} to go, {parallel} at a time, {threads} thread(s) each; work in {study.work_dir}",
        flush=True,
    )
    running: dict[subprocess.Popen, Run] = {}
    failed: list[str] = []
    paused: list[str] = []  # stopped by --max-minutes, last.ckpt saved
    stopping = False

    def stop(signum: int) -> None:  # each run got the signal too, and stops in its own way
        nonlocal stopping
        stopping = True

    with forwarding(running, then=stop) as joined:  # a scheduler's stop, passed on to every run
        while todo or running:
            while todo and len(running) < parallel and not stopping:
                run = todo.pop(0)
                print(f"[{time.strftime('%H:%M:%S')}] {run.name}: {study.state(run)}", flush=True)
                command = one_command(study, run, threads, max_minutes)
                child = subprocess.Popen(command, env=process.package_env())
                running[child] = run
                joined(child)  # a stop that came while it started still reaches it
            finished = [child for child in running if child.poll() is not None]
            for child in finished:
                run = running.pop(child)
                status = process.exit_status(child.returncode)
                word = {0: "done", STOPPED: "stopped"}.get(status, f"failed ({status})")
                print(f"[{time.strftime('%H:%M:%S')}] {run.name}: {word}", flush=True)
                if status == STOPPED:
                    paused.append(run.name)
                elif status != 0:
                    failed.append(run.name)
            if stopping and not running:
                break
            time.sleep(1)
    if stopping:
        print("stopped: start the same command again to continue", file=sys.stderr)
        return STOPPED
    if failed:
        print(f"unfinished: {', '.join(failed)} (see their train.log)", file=sys.stderr)
        return 1
    if paused:
        print(f"stopped by --max-minutes: {', '.join(paused)}; start the same command again to "
              "continue", file=sys.stderr)  # fmt: skip
        return STOPPED
    # The report in a new process, as each scoring is: a study that ran for days reports with the
    # code of now, not a mix of the modules it loaded at its start and those it would load now.
    report = [*process.COMMAND, "study", "report", str(study.folder)]
    return process.exit_status(subprocess.run(report, env=process.package_env()).returncode)


def run_one(study: Study, run: Run, threads: int | None, max_minutes: float | None = None) -> int:
    """Train `run` to its end, resuming what is there, then score it in a fresh process, holding the
    run's lock throughout. Every stop (SIGTERM, SIGUSR1) ends it with status 4: passed on to the
    child at work, or, with none at work (waiting for the lock, starting), ending it at once."""
    budget = process.Budget(max_minutes)  # from now: the wait for the lock counts too
    spec = study.load_spec()
    check_run(spec, run)
    threads = threads or cores()
    children: list[subprocess.Popen] = []
    stops: list[int] = []

    def stop(signum: int) -> None:  # after the stop was passed on to the children at work
        stops.append(signum)
        if not any(child.poll() is None for child in children):
            raise Stopped(f"stopped by {signal.Signals(signum).name}", None, None)

    try:
        with forwarding(children, then=stop), process.run_lock(study, run):
            status = train_and_score(study, spec, run, threads, budget, children, stops)
    except Stopped as stopped:
        print(f"{run.name}: {stopped.reason}; start it again to continue", file=sys.stderr)
        return STOPPED
    if stops:  # the child may have finished its part anyway; the rest waits for the next start
        name = signal.Signals(stops[0]).name
        print(f"{run.name}: stopped by {name}; start it again to continue", file=sys.stderr)
        return STOPPED
    return status


def train_and_score(
    study: Study,
    spec: StudySpec,
    run: Run,
    threads: int,
    budget: process.Budget,
    children: list[subprocess.Popen],
    stops: list[int],
) -> int:
    """The steps `run` still needs, read from its files under its lock: train, then score; no step
    begins after a stop (`stops` not empty), even when the child finished its own, nor once the
    sitting's `budget` is spent (status 4 then)."""
    spent = f"{run.name}: --max-minutes {budget.minutes or 0:g} spent"  # said once it is
    if study.state(run) in ("new", "partial"):
        if budget.spent():
            print(f"{spent} before training began; start it again to continue", file=sys.stderr)
            return STOPPED
        status = process.train(study, spec, run, threads, children, budget.left())
        if status == STOPPED:
            print(f"{run.name}: stopped with last.ckpt saved; start it again to continue",
                  file=sys.stderr)  # fmt: skip
            return status
        if status != 0:
            log = study.run_dir(run) / "train.log"
            print(f"{run.name}: train.py exited with status {status}; see {log}", file=sys.stderr)
            return status
    if study.state(run) == "trained" and not stops:
        if budget.spent():
            print(f"{spent}: trained, scored at the next start", file=sys.stderr)
            return STOPPED
        # A new process, so a run trained for hours is scored by the code of now.
        command = [*process.COMMAND, "study", "score", str(study.folder), run.variant,
                   str(run.seed), "--work-dir", str(study.work_dir)]  # fmt: skip
        child = process.start(command, children, env=process.thread_env(threads))  # its cores
        return process.exit_status(child.wait())
    return 0


def score_one(study: Study, run: Run) -> int:
    """Score a trained run. A stop (SIGTERM, SIGUSR1) ends the scoring and the evaluate.py it is
    waiting for, with status 4: result.json is written last, so the run stays `trained` and the
    next start scores it again."""
    from seq2seq.study.scoring import score_run

    spec = study.load_spec()
    check_run(spec, run)
    if study.state(run) not in ("trained", "done"):
        raise UserError(f"{run.name} has not finished training (state {study.state(run)})")

    def stop(signum: int, frame: object) -> None:
        # Raised inside subprocess.run, which kills its child before passing the exception on.
        raise Stopped(f"scoring stopped by {signal.Signals(signum).name}", None, None)

    try:
        with handling(STOPS, stop):
            result = score_run(study, spec, run)
    except Stopped as stopped:
        print(f"{run.name}: {stopped.reason}; the next start scores it again", file=sys.stderr)
        return STOPPED
    print(
        f"{run.name}: BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f} on {spec.split} "
        f"({result['checkpoint_rule']}); {study.result_path(run)}"
    )
    return 0


def print_commands(
    study: Study, spec: StudySpec | None, threads: int | None, max_minutes: float | None
) -> int:
    spec = study.open(spec)
    for run in spec.runs():
        if study.state(run) != "done":
            print(shlex.join(one_command(study, run, threads, max_minutes)[1:]))
    return 0


def print_status(study: Study) -> int:
    spec = study.load_spec()
    for run in spec.runs():
        print(
            f"{run.name:<24} {study.state(run):<8} {study.progress(run)}{busy(study, run)}".rstrip()
        )
    return 0


def busy(study: Study, run: Run) -> str:
    """Who works on `run` now, as its lock says: a live process here, or one on another host whose
    life cannot be seen from here; "" when none (a lock a killed process left is no one's)."""
    from seq2seq.data.cachelock import holder

    owner = holder(study.lock_path(run))
    alive = None if owner is None else owner.alive()
    if owner is None or alive is False:
        return ""
    return (
        f"; running now (pid {owner.pid})"
        if alive
        else f"; held by pid {owner.pid} on {owner.host}"
    )


def write_report(study: Study, others: list[Study] | None = None) -> int:
    from seq2seq.study.report import build_report

    paths = build_report(study, others or [])
    print("report: " + ", ".join(str(path) for path in paths))
    return 0
