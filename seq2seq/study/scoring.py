"""Scoring one finished run of a study, as the README scores a single run.

1. The checkpoint: the best single one (highest validation BLEU during training) or the average of the
   kept best ones, whichever has the higher beam-`beam` BLEU on validation (README, Results).
2. On the study's split: BLEU and chrF with their signatures (`seq2seq evaluate`, so a study's
   figure is what a user's `evaluate.py` prints), AER against the study's silver standard when it has
   one, and the attention statistics of seq2seq.alignment.stats, teacher-forced on the references.
3. From the run's own TensorBoard events: its wall time, updates and mean training tokens/s.

The result goes to `<study>/runs/<run>/result.json` (written last, whole: its presence means done),
beside the hypotheses it was scored on. The commands it runs are children that die with it
(seq2seq.study.process.run_child), and `seq2seq evaluate` writes its `--out` and `--json` files whole.
"""

import json
import tempfile
from pathlib import Path
from typing import Any

from seq2seq.atomic import atomic_write_bytes, atomic_write_text
from seq2seq.errors import UserError
from seq2seq.machine import provenance
from seq2seq.study.events import trained_precision, training_figures
from seq2seq.study.layout import Study
from seq2seq.study.process import COMMAND, package_env, run_child
from seq2seq.study.spec import Run, StudySpec


def best_checkpoints(
    checkpoint_dir: Path, last: dict[str, Any], monitor: str = "val/bleu"
) -> list[tuple[Path, float]]:
    """The checkpoints a callback kept with their monitored value, highest first (from last.ckpt's
    state of the callback that monitors `monitor`, whose paths may point at another machine's
    folder): "val/bleu" for the best ones, "step" for the latest (`--keep-last`)."""
    for key, state in last.get("callbacks", {}).items():
        if key.startswith("ModelCheckpoint") and f"'monitor': '{monitor}'" in key:
            found = []
            for path, score in state.get("best_k_models", {}).items():
                local = checkpoint_dir / Path(path).name
                if local.is_file():
                    found.append((local, float(score)))
            return sorted(found, key=lambda item: -item[1])
    return []


def evaluate(checkpoint: Path, split: str, beam: int, out: Path, *extra: str) -> dict[str, Any]:
    """`seq2seq evaluate` on `checkpoint`, in a child process; its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "result.json"
        command = [*COMMAND, "evaluate", str(checkpoint), "--split", split,
                   "--beam", str(beam), "--out", str(out), "--json", str(report), *extra]  # fmt: skip
        done = run_child(command, env=package_env())  # dies with this process, as training does
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise UserError(f"evaluate.py {checkpoint} --split {split}: {last}")
        return json.loads(report.read_text("utf-8"))


def _average(paths: list[Path], out: Path) -> None:
    """`seq2seq average` of `paths` into `out` (written whole, by that command)."""
    command = [*COMMAND, "average", *map(str, paths), "--out", str(out)]
    done = run_child(command, env=package_env())  # dies with this process, as training does
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"average_checkpoints.py into {out}: {said}")


def choose_checkpoint(study: Study, spec: StudySpec, run: Run) -> dict[str, Any]:
    """The README's rule: best single, average of the kept best or (with `--keep-last`) average of
    the latest, whichever has the highest beam BLEU on validation."""
    import torch

    folder = study.version_dir(run) / "checkpoints"
    # mmap: only the counters and the callbacks' state are read, not the weights.
    last = torch.load(folder / "last.ckpt", map_location="cpu", weights_only=True, mmap=True)
    best = best_checkpoints(folder, last)
    if not best:
        raise UserError(f"{folder}: no best-*.ckpt recorded in last.ckpt; nothing to score")
    scratch = study.run_dir(run) / "scoring"
    scratch.mkdir(exist_ok=True)
    candidates = {"best single": best[0][0]}
    if len(best) >= 2:
        average = scratch / "average.ckpt"
        if not average.is_file():
            _average([path for path, _ in best], average)
        candidates[f"average of {len(best)} best"] = average
    recent = best_checkpoints(folder, last, monitor="step")
    if len(recent) >= 2:
        latest = scratch / "average-last.ckpt"
        if not latest.is_file():
            _average([path for path, _ in recent], latest)
        candidates[f"average of {len(recent)} last"] = latest
    val = {
        name: evaluate(path, "val", spec.beam, scratch / f"{path.stem}.val.hyp")["bleu"]
        for name, path in candidates.items()
    }
    rule = max(val, key=val.get)  # the single one wins a tie: it is listed first
    return {
        "checkpoint_rule": rule,
        "checkpoint": str(candidates[rule]),
        "best_single": best[0][0].name,
        "best_single_val_bleu_greedy": best[0][1],
        "updates": int(last["global_step"]),
        "val_bleu": val,
    }


def score_run(study: Study, spec: StudySpec, run: Run) -> dict[str, Any]:
    """Score a trained run; writes and returns its result.json."""
    from seq2seq.checkpoint import corpus_of, read_checkpoint
    from seq2seq.data.corpus import read_pairs, resolve_corpus
    from seq2seq.decoding.translator import Translator

    chosen = choose_checkpoint(study, spec, run)
    out = study.result_dir(run)
    out.mkdir(parents=True, exist_ok=True)
    hyp = study.run_dir(run) / "scoring" / f"{spec.split}.hyp"
    extra = ["--align-ref", spec.align_ref] if spec.align_ref else []
    scored = evaluate(Path(chosen["checkpoint"]), spec.split, spec.beam, hyp, *extra)
    corpus = corpus_of(read_checkpoint(chosen["checkpoint"]))
    source = resolve_corpus(corpus["dataset"], corpus["data_dir"])
    pairs = read_pairs(source, source.find_split(spec.split), corpus["src"], corpus["tgt"])
    translator = Translator.load(chosen["checkpoint"], "cpu")
    attention = translator.attention_statistics(pairs.src, pairs.tgt)
    sittings = study.sittings(run)
    result = {
        "variant": run.variant,
        "seed": run.seed,
        "flags": spec.portable().train_flags(run),  # paths in the current folder relative to it
        "precision": trained_precision(study.version_dir(run)),  # what `--precision auto` became
        "split": spec.split,
        "beam": spec.beam,
        **chosen,
        "checkpoint": Path(chosen["checkpoint"]).name,
        "bleu": scored["bleu"],
        "bleu_signature": scored["bleu_signature"],
        "chrf": scored["chrf"],
        "chrf_signature": scored["chrf_signature"],
        "sentences": scored["sentences"],
        **{key: scored[key] for key in ("aer", "align_precision", "align_recall") if key in scored},
        **attention,
        **training_figures(study.version_dir(run)),
        "hypotheses": f"{spec.split}.hyp",
        "trained": [
            {key: s.get(key) for key in ("commit", "cpu", "torch", "time", "threads")}
            for s in sittings
        ],
        "scored": provenance(),
    }
    atomic_write_bytes(out / f"{spec.split}.hyp", hyp.read_bytes())
    atomic_write_text(study.result_path(run), json.dumps(result, indent=2) + "\n")
    return result
