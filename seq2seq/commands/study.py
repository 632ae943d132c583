"""Run a study: variants x seeds as ordinary train.py runs, scored alike, with a report of significance
(`seq2seq study`, or `python scripts/study.py`; the scheduler is seq2seq.study.scheduler).

    seq2seq study run studies/scorers --variant additive "--score additive" \\
        --variant dot "--score dot" --variant scaled "--score scaled" --seeds 1 2 3 --parallel 2
    seq2seq study run studies/scorers          # continue it: finished runs are skipped
    seq2seq study status studies/scorers       # each run's state
    seq2seq study commands studies/scorers     # one command per run, for a job array
    seq2seq study report studies/scorers       # rebuild report.md/.json/.png from results
    seq2seq study report studies/tf --with studies/scorers  # beside another study's runs

The spec (variants, seeds, common flags, the split, a silver standard) is saved in DIR/study.json on
first use; `--config study.yaml` gives it as YAML instead of flags. Each run trains in
`--work-dir/runs/<variant>-seed<k>/` (checkpoints, never committed) and leaves its scores and
hypotheses in DIR/runs/<variant>-seed<k>/ (small, meant to be committed). Starting the study again,
after any stop, kill or preemption, skips finished runs and resumes the others from their last.ckpt.
Relative paths (DIR, --work-dir, --align-ref, path flags of the variants) are the caller's: every
process of the study runs in the caller's folder, and study.json keeps the paths inside it relative
to it (so continue a committed study, such as docs/study, from the checkout's root).
"""

import argparse
import sys
from pathlib import Path

from seq2seq.cli import Parser, cli_message
from seq2seq.errors import UserError
from seq2seq.study.layout import Study
from seq2seq.study.scheduler import (
    print_commands,
    print_status,
    run_all,
    run_one,
    score_one,
    write_report,
)
from seq2seq.study.spec import Run, StudySpec


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog,
        description="Train and score variants x seeds; report means, intervals and paired tests.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def study_folder(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("folder", metavar="DIR", help="the study folder (study.json, results)")
        sub.add_argument(
            "--work-dir", metavar="W", help="checkpoints, logs and the data cache of the runs "
            "(default: runs/studies/<DIR's name> in the current folder)",
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
    threads(run, "the cores the job may use, divided by --parallel")
    one = commands.add_parser("one", help="train (or resume) and score one run")
    study_folder(one)
    one.add_argument("variant", metavar="VARIANT")
    one.add_argument("seed", metavar="SEED", type=int)
    threads(one, "all cores the job may use")
    cmds = commands.add_parser("commands", help="print one command per unfinished run (job arrays)")
    study_folder(cmds)
    spec_flags(cmds)
    threads(cmds, "all cores of the job")
    score = commands.add_parser("score", help="score one trained run again")
    study_folder(score)
    score.add_argument("variant", metavar="VARIANT")
    score.add_argument("seed", metavar="SEED", type=int)
    study_folder(
        commands.add_parser(
            "status", help="each run's state, with its saved update or BLEU, and who runs it now"
        )
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
    names = [name for name, _ in args.variant or []]
    for name in names:
        if names.count(name) > 1:
            raise UserError(f"--variant {name} is given twice: name each variant once")
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


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        study = Study(args.folder, args.work_dir)
        if getattr(args, "max_minutes", None) is not None and args.max_minutes <= 0:
            raise UserError(f"--max-minutes must be positive, got {args.max_minutes}")
        if getattr(args, "threads", None) is not None and args.threads <= 0:
            raise UserError(f"--threads must be positive, got {args.threads}")  # not "all cores"
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
