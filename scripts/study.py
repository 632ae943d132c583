"""Run a study: variants x seeds as ordinary train.py runs, scored alike, with a report of significance.

    python scripts/study.py run studies/scorers --variant additive "--score additive" \\
        --variant dot "--score dot" --variant scaled "--score scaled" --seeds 1 2 3 --parallel 2
    python scripts/study.py run studies/scorers          # continue it: finished runs are skipped
    python scripts/study.py status studies/scorers       # each run's state
    python scripts/study.py commands studies/scorers     # one command per run, for a job array
    python scripts/study.py report studies/scorers       # rebuild report.md/.json/.png from results
    python scripts/study.py report studies/tf --with studies/scorers  # beside another study's runs

The spec (variants, seeds, common flags, the split, a silver standard) is saved in DIR/study.json on
first use; `--config study.yaml` gives it as YAML instead of flags. Each run trains in
`--work-dir/runs/<variant>-seed<k>/` (checkpoints, never committed) and leaves its scores and
hypotheses in DIR/runs/<variant>-seed<k>/ (small, meant to be committed). Starting the study again,
after any stop, kill or preemption, skips finished runs and resumes the others from their last.ckpt.
Relative paths (DIR, --work-dir, --align-ref, path flags of the variants) are the caller's.
"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from seq2seq.cli import Parser, cli_message
from seq2seq.errors import STOPPED, Stopped, UserError
from seq2seq.signals import STOPS, forwarding, handling
from seq2seq.study import process
from seq2seq.study.layout import Study
from seq2seq.study.spec import Run, StudySpec

SCRIPT = Path(__file__).resolve()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        description="Train and score variants x seeds; report means, intervals and paired tests.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def study_folder(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("folder", metavar="DIR", help="the study folder (study.json, results)")
        sub.add_argument(
            "--work-dir", metavar="W", help="checkpoints, logs and the data cache of the runs "
            "(default: runs/studies/<DIR's name> in the checkout)",
        )  # fmt: skip

    def spec_flags(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--variant", nargs=2, action="append", metavar=("NAME", "FLAGS"),
            help="a variant and its train.py flags as one quoted string; repeat for each variant",
        )  # fmt: skip
        sub.add_argument("--seeds", nargs="+", type=int, metavar="K", help="seeds of every variant")
        sub.add_argument("--flags", default="", help="train.py flags common to every variant")
        sub.add_argument("--config", metavar="FILE", help="the spec as YAML (variants, seeds, ...)")
        sub.add_argument("--split", default="test", help="the split every run is scored on")
        sub.add_argument("--beam", type=int, default=5, help="beam size of the scoring")
        sub.add_argument(
            "--align-ref", metavar="GOLD", help="gold or silver Pharaoh links for --split: AER too"
        )

    def threads(sub: argparse.ArgumentParser, default: str) -> None:
        sub.add_argument("--threads", type=int, help=f"torch threads per run (default: {default})")
        sub.add_argument(
            "--max-minutes", type=float, metavar="M", help="each sitting of a run (waiting for its "
            "lock, preparing, training, scoring) takes at most M minutes: train.py gets what is left "
            "(--max-minutes) and stops with last.ckpt saved; a sitting whose time is spent does not "
            "score; status 4",
        )  # fmt: skip

    run = commands.add_parser("run", help="train and score every unfinished run, then report")
    study_folder(run)
    spec_flags(run)
    run.add_argument("--parallel", type=int, default=1, help="runs trained at once (default 1)")
    threads(run, "the machine's cores divided by --parallel")
    one = commands.add_parser("one", help="train (or resume) and score one run")
    study_folder(one)
    one.add_argument("variant", metavar="VARIANT")
    one.add_argument("seed", metavar="SEED", type=int)
    threads(one, "all cores")
    cmds = commands.add_parser("commands", help="print one command per unfinished run (job arrays)")
    study_folder(cmds)
    spec_flags(cmds)
    threads(cmds, "all cores of the job")
    score = commands.add_parser("score", help="score one trained run again")
    study_folder(score)
    score.add_argument("variant", metavar="VARIANT")
    score.add_argument("seed", metavar="SEED", type=int)
    study_folder(
        commands.add_parser("status", help="each run's state, with its saved update or BLEU")
    )
    report = commands.add_parser("report", help="rebuild the report")
    study_folder(report)
    report.add_argument(
        "--with", dest="others", action="append", default=[], metavar="DIR2",
        help="another study folder whose finished runs join the report as variants DIR2's-name/"
        "VARIANT, paired with this study's (same split, beam and references); repeatable",
    )  # fmt: skip
    return parser


def spec_from(args: argparse.Namespace) -> StudySpec | None:
    """The spec the flags or --config give; None when they give none (continue the saved one)."""
    if args.config:
        from seq2seq.training.yaml_config import load_yaml

        _, data = load_yaml(args.config)
        if not isinstance(data, dict):
            raise UserError(f"--config {args.config}: expected a mapping (variants, seeds, ...)")
        return StudySpec.from_dict(data, args.config, Path.cwd())
    if not args.variant and not args.seeds:
        return None
    return StudySpec.from_dict(
        {
            "variants": dict(args.variant or []),
            "seeds": args.seeds or [],
            "flags": args.flags,
            "split": args.split,
            "beam": args.beam,
            "align_ref": args.align_ref,
        },
        "the command line",
        Path.cwd(),
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        study = Study(args.folder, args.work_dir)
        if getattr(args, "max_minutes", None) is not None and args.max_minutes <= 0:
            raise UserError(f"--max-minutes must be positive, got {args.max_minutes}")
        if args.command == "run":
            return run_all(study, spec_from(args), args.parallel, args.threads, args.max_minutes)
        if args.command == "commands":
            return print_commands(study, spec_from(args), args.threads, args.max_minutes)
        if args.command == "status":
            return print_status(study)
        if args.command == "one":
            return run_one(study, Run(args.variant, args.seed), args.threads, args.max_minutes)
        if args.command == "score":
            return score_one(study, Run(args.variant, args.seed))
        return write_report(study, [Study(other) for other in args.others])
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2


def check_run(spec: StudySpec, run: Run) -> None:
    if run.variant not in spec.variants or run.seed not in spec.seeds:
        raise UserError(
            f"{run.name} is not in this study (variants {', '.join(spec.variants)}; "
            f"seeds {' '.join(map(str, spec.seeds))})"
        )


def one_command(
    study: Study, run: Run, threads: int | None, max_minutes: float | None = None
) -> list[str]:
    command = [sys.executable, str(SCRIPT), "one", str(study.folder), run.variant, str(run.seed)]
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
    """Every unfinished run through `study.py one`, `parallel` at a time; then the report. Status 4
    (STOPPED) when a stop signal or `max_minutes` left runs unfinished, 1 when a run failed."""
    if parallel <= 0:
        raise UserError(f"--parallel must be positive, got {parallel}")
    spec = study.open(spec)
    threads = threads or max(1, (os.cpu_count() or 1) // parallel)
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
                child = subprocess.Popen(command)
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
    return write_report(study)


def run_one(study: Study, run: Run, threads: int | None, max_minutes: float | None = None) -> int:
    """Train `run` to its end, resuming what is there, then score it in a fresh process, holding the
    run's lock throughout. Every stop (SIGTERM, SIGUSR1) ends it with status 4: passed on to the
    child at work, or, with none at work (waiting for the lock, starting), ending it at once."""
    budget = process.Budget(max_minutes)  # from now: the wait for the lock counts too
    spec = study.load_spec()
    check_run(spec, run)
    threads = threads or os.cpu_count() or 1
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
        command = [sys.executable, str(SCRIPT), "score", str(study.folder), run.variant,
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
        print(f"{run.name:<24} {study.state(run):<8} {study.progress(run)}".rstrip())
    return 0


def write_report(study: Study, others: list[Study] | None = None) -> int:
    from seq2seq.study.report import build_report

    paths = build_report(study, others or [])
    print("report: " + ", ".join(str(path) for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
