"""A study: variants (each a set of `train.py` flags) times seeds, run as ordinary training runs.

Two folders hold a study:

- the study folder (`DIR`, small enough to commit): `study.json` (the spec), one `runs/<variant>-seed<k>/`
  per finished run with `result.json` and the hypotheses it was scored on, and the report
  (`report.md`, `report.json`, `report.png`) that `seq2seq.study_report` builds from them alone;
- the work folder (`--work-dir`, never committed): `runs/<variant>-seed<k>/version_0/` (TensorBoard
  events and checkpoints, as `train.py` writes them), the run's `train.log`, and the shared data `cache/`.

A run's state is read from the files, never kept in memory, so any number of stops, kills or
preemptions in any order cost at most the updates since the run's last checkpoint:

| state     | what is on disk                              | what starting the study does          |
|-----------|----------------------------------------------|---------------------------------------|
| `new`     | no `last.ckpt`                               | trains from scratch                   |
| `partial` | `last.ckpt`, no `trained.json`               | resumes from `last.ckpt`              |
| `trained` | `trained.json` (train.py exited 0)           | scores the run                        |
| `done`    | `result.json` in the study folder            | nothing                               |
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seq2seq.atomic import atomic_write_text
from seq2seq.errors import UserError

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "scripts" / "train.py"
# Flags the study sets itself for every run; a variant may not set them.
OWN_FLAGS = ("--seed", "--log-dir", "--run-name", "--resume", "--max-minutes")


@dataclass(frozen=True)
class StudySpec:
    """What a study trains and how it scores it; saved as `study.json` in the study folder."""

    variants: dict[str, list[str]]  # name -> train.py flags of that variant
    seeds: list[int]
    flags: list[str] = field(default_factory=list)  # train.py flags common to every variant
    split: str = "test"  # the split every run is scored on
    beam: int = 5
    align_ref: str | None = None  # a silver/gold Pharaoh file for that split: AER too

    def runs(self) -> list["Run"]:
        """Every (variant, seed), seed-major: a partial study has every variant at its first seeds."""
        return [Run(variant, seed) for seed in self.seeds for variant in self.variants]

    def train_flags(self, run: "Run") -> list[str]:
        return [*self.flags, *self.variants[run.variant], "--seed", str(run.seed)]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> "StudySpec":
        """A spec from a dict (study.json or a YAML file); values are checked, `where` names the file."""
        known = {"variants", "seeds", "flags", "split", "beam", "align_ref"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(
                f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        variants = data.get("variants") or {}
        if not isinstance(variants, dict):
            raise UserError(f"{where}: `variants` must map names to train.py flags")
        seeds = data.get("seeds") or []
        if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds):
            raise UserError(f"{where}: `seeds` must be a list of integers, got {seeds!r}")
        return cls(
            variants={str(name): as_flags(value) for name, value in variants.items()},
            seeds=seeds,
            flags=as_flags(data.get("flags") or []),
            split=str(data.get("split", "test")),
            beam=int(data.get("beam", 5)),
            align_ref=data.get("align_ref"),
        )


def as_flags(value: str | list[str]) -> list[str]:
    """Flags given as one shell-quoted string (`--score dot --lr 1e-3`) or as a list of words."""
    return shlex.split(value) if isinstance(value, str) else [str(word) for word in value]


@dataclass(frozen=True)
class Run:
    variant: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.variant}-seed{self.seed}"


def check_spec(spec: StudySpec) -> None:
    """Refuse a spec that cannot run, in one line naming what is wrong, before anything is trained."""
    from seq2seq.config import parse_args

    if not spec.variants:
        raise UserError("a study needs at least one variant (--variant NAME FLAGS)")
    if not spec.seeds:
        raise UserError("a study needs at least one seed (--seeds 1 2 3)")
    if len(set(spec.seeds)) != len(spec.seeds):
        raise UserError(f"--seeds lists a seed twice: {spec.seeds}")
    if spec.beam <= 0:
        raise UserError(f"--beam must be positive, got {spec.beam}")
    if spec.align_ref is not None and not Path(spec.align_ref).is_file():
        raise UserError(f"--align-ref {spec.align_ref}: no such file")
    for name, flags in spec.variants.items():
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise UserError(f"variant name {name!r}: use letters, digits, '-', '_' and '.' only")
        for flag in (*spec.flags, *flags):
            if flag.split("=")[0] in OWN_FLAGS:
                raise UserError(f"variant {name}: {flag.split('=')[0]} is set by the study itself")
        try:  # train.py's own checks: a typo is refused now, not after an hour of other runs
            parse_args([*spec.flags, *flags])
        except SystemExit:  # argparse printed its one-line usage error already
            raise UserError(
                f"variant {name}: train.py refuses its flags ({shlex.join(flags)})"
            ) from None


class Study:
    """A study folder and its work folder; see the module docstring for what each holds."""

    def __init__(self, folder: str | Path, work_dir: str | Path | None = None) -> None:
        self.folder = Path(folder)
        default = REPO / "runs" / "studies" / self.folder.resolve().name
        self.work_dir = Path(work_dir) if work_dir is not None else default

    # -- the spec ---------------------------------------------------------------------------------
    @property
    def spec_path(self) -> Path:
        return self.folder / "study.json"

    def load_spec(self) -> StudySpec:
        if not self.spec_path.is_file():
            raise UserError(
                f"{self.folder}: no study.json; start the study with --variant and --seeds "
                "(or --config FILE)"
            )
        try:
            data = json.loads(self.spec_path.read_text("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise UserError(f"{self.spec_path}: not a study spec ({err})") from None
        return StudySpec.from_dict(data, str(self.spec_path))

    def open(self, spec: StudySpec | None) -> StudySpec:
        """The study's spec: `spec` is saved on first use; later it must equal the saved one."""
        if spec is None:
            return self.load_spec()
        check_spec(spec)
        if self.spec_path.is_file():
            saved = self.load_spec()
            if saved != spec:
                raise UserError(
                    f"{self.spec_path} holds another study; give no spec to continue it, "
                    "or choose another folder"
                )
            return saved
        atomic_write_text(self.spec_path, spec.to_json())
        return spec

    # -- where a run's files are ------------------------------------------------------------------
    def run_dir(self, run: Run) -> Path:
        """The run's folder in the work folder (train.py's `--log-dir/--run-name`)."""
        return self.work_dir / "runs" / run.name

    def version_dir(self, run: Run) -> Path:
        return self.run_dir(run) / "version_0"

    def last_checkpoint(self, run: Run) -> Path:
        return self.version_dir(run) / "checkpoints" / "last.ckpt"

    def trained_marker(self, run: Run) -> Path:
        return self.run_dir(run) / "trained.json"

    def result_dir(self, run: Run) -> Path:
        """The run's committed results in the study folder."""
        return self.folder / "runs" / run.name

    def result_path(self, run: Run) -> Path:
        return self.result_dir(run) / "result.json"

    def state(self, run: Run) -> str:
        if self.result_path(run).is_file():
            return "done"
        if self.trained_marker(run).is_file():
            return "trained"
        if self.last_checkpoint(run).is_file():
            return "partial"
        return "new"

    def progress(self, run: Run) -> str:
        """One line on how far `run` is: its test BLEU when done, its saved update when partial."""
        state = self.state(run)
        if state == "done":
            result = json.loads(self.result_path(run).read_text("utf-8"))
            return f"BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f} on {result['split']}"
        if state == "partial":
            import datetime

            import torch

            path = self.last_checkpoint(run)
            # mmap: the counters are read without reading the weights.
            saved = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
            step, horizon = saved["global_step"], saved.get("lr_horizon")
            of = f" of {horizon} ({100 * step / horizon:.0f}%)" if horizon else ""
            when = datetime.datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
            return f"update {step}{of} in last.ckpt, saved {when}"
        return ""

    # -- training ---------------------------------------------------------------------------------
    def train_command(self, spec: StudySpec, run: Run) -> list[str]:
        """The train.py command of `run`: from scratch, or resuming its last.ckpt."""
        flags = spec.train_flags(run)
        command = [sys.executable, str(TRAIN), *flags]
        command += ["--log-dir", str(self.work_dir / "runs"), "--run-name", run.name]
        if not any(flag.split("=")[0] == "--cache-dir" for flag in flags):
            command += ["--cache-dir", str(self.work_dir / "cache")]  # one cache for all runs
        if self.last_checkpoint(run).is_file():
            command += ["--resume", str(self.last_checkpoint(run))]
        return command

    def train(self, spec: StudySpec, run: Run, threads: int) -> int:
        """Train `run` to its end (or resume it); returns train.py's exit status."""
        if self.state(run) == "new" and self.run_dir(run).exists():
            # Killed before its first checkpoint: nothing to resume, and a fresh start must land in
            # version_0 again, so the leftover folder goes.
            shutil.rmtree(self.run_dir(run))
        self.run_dir(run).mkdir(parents=True, exist_ok=True)
        command = self.train_command(spec, run)
        sitting = {"command": shlex.join(command[1:]), **provenance(), "threads": threads}
        with open(self.run_dir(run) / "sittings.jsonl", "a", encoding="utf-8") as log:
            log.write(json.dumps(sitting) + "\n")
        with open(self.run_dir(run) / "train.log", "ab") as log:
            log.write(f"\n$ {shlex.join(command)}\n".encode())
            log.flush()
            process = subprocess.Popen(
                command, cwd=REPO, env=thread_env(threads), stdout=log, stderr=subprocess.STDOUT
            )
            status = wait_passing_stops(process)
        if status == 0:
            atomic_write_text(self.trained_marker(run), json.dumps(provenance()) + "\n")
        return status

    def sittings(self, run: Run) -> list[dict[str, Any]]:
        path = self.run_dir(run) / "sittings.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def wait_passing_stops(process: subprocess.Popen) -> int:
    """Wait for `process`, passing SIGTERM and SIGUSR1 on to it (a scheduler's polite stop), so it
    saves its checkpoint and exits in its own way; returns its exit status."""

    def forward(signum: int, frame: object) -> None:
        process.send_signal(signum)

    stops = (signal.SIGTERM, signal.SIGUSR1)
    previous = {sig: signal.signal(sig, forward) for sig in stops}
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a run limited to `threads` threads (torch, OpenMP and MKL all read these)."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    return env


def cpu_line() -> str:
    """The CPU's model name and torch's capability (e.g. AVX512, AVX2): what a speed depends on."""
    import torch

    from seq2seq.launch import cpu_model

    model = cpu_model()
    return f"{model}, {os.cpu_count()} cores, {torch.backends.cpu.get_cpu_capability()}"


def git_commit() -> str:
    """The checkout's commit, with `+dirty` when tracked files differ from it; '' outside git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return ""
    return commit + ("+dirty" if dirty else "")


def provenance() -> dict[str, str]:
    """What a reader needs to rerun a figure: the commit, the CPU, torch's version, the time."""
    import datetime

    import torch

    return {
        "commit": git_commit(),
        "cpu": cpu_line(),
        "torch": torch.__version__,
        "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
