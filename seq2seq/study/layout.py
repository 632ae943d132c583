"""A study's folders, and each run's state read from the files in them.

Two folders hold a study:

- the study folder (`DIR`, small enough to commit): `study.json` (the spec), one `runs/<variant>-seed<k>/`
  per finished run with `result.json` and the hypotheses it was scored on, and the report
  (`report.md`, `report.json`, `report.png`) that `seq2seq.study.report` builds from them alone;
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
from pathlib import Path
from typing import Any

from seq2seq.atomic import atomic_write_text
from seq2seq.errors import UserError
from seq2seq.study.spec import Run, StudySpec, check_spec, relative

RESULT_KEYS = ("variant", "seed", "split", "bleu", "chrf", "hypotheses")  # read by status, report


class Study:
    """A study folder and its work folder; see the module docstring for what each holds."""

    def __init__(self, folder: str | Path, work_dir: str | Path | None = None) -> None:
        # Absolute from the start: every child process of the study must mean the same folders.
        self.folder = Path(folder).absolute()
        default = Path("runs", "studies", self.folder.resolve().name).absolute()
        self.work_dir = Path(work_dir).absolute() if work_dir is not None else default

    @property
    def shown(self) -> str:
        """The study folder as reports name it: relative to the current folder when inside it."""
        return relative(str(self.folder))

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
        return StudySpec.from_dict(data, str(self.spec_path), Path.cwd())

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

    def lock_path(self, run: Run) -> Path:
        """The lock of the process training or scoring `run` (outside the run's folder, which a
        fresh start removes)."""
        return self.work_dir / "locks" / f"{run.name}.lock"

    def trained_marker(self, run: Run) -> Path:
        return self.run_dir(run) / "trained.json"

    def result_dir(self, run: Run) -> Path:
        """The run's committed results in the study folder."""
        return self.folder / "runs" / run.name

    def result_path(self, run: Run) -> Path:
        return self.result_dir(run) / "result.json"

    def load_result(self, run: Run) -> dict[str, Any]:
        """The finished run's result.json with its hypotheses (`hyps`, a list of lines); a file
        damaged or edited by hand is one line naming it (and how to get it back)."""
        path = self.result_path(run)
        again = (
            f"restore it (git checkout -- {path}) or, its checkpoints at hand, score it again "
            f"(study.py score {relative(str(self.folder))} {run.variant} {run.seed})"
        )
        try:
            result = json.loads(path.read_text("utf-8"))
            if not isinstance(result, dict):
                raise ValueError("not a JSON object")
            missing = [key for key in RESULT_KEYS if key not in result]
            if missing:
                raise ValueError(f"no {', '.join(missing)}")
            result["hyps"] = (self.result_dir(run) / result["hypotheses"]).read_text("utf-8")
        except (OSError, ValueError, TypeError) as err:  # JSONDecodeError is a ValueError
            why = f"{err.strerror}: {err.filename}" if isinstance(err, OSError) else str(err)
            raise UserError(f"{path}: not a run's result ({why}); {again}") from None
        result["hyps"] = result["hyps"].splitlines()
        return result

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
            result = self.load_result(run)
            return f"BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f} on {result['split']}"
        if state == "partial":
            import datetime

            import torch

            path = self.last_checkpoint(run)
            # mmap: the counters are read without reading the weights.
            saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            step, horizon = saved["global_step"], saved.get("lr_horizon")
            of = f" of {horizon} ({100 * step / horizon:.0f}%)" if horizon else ""
            when = datetime.datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
            return f"update {step}{of} in last.ckpt, saved {when}"
        return ""

    def sittings(self, run: Run) -> list[dict[str, Any]]:
        path = self.run_dir(run) / "sittings.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]
