"""A study's spec as the command line and YAML give it: paths resolved against the caller's folder
once, refusals in one line (the scored split, YAML values), and `default:` as a variant of no flags."""

import json
from pathlib import Path

import pytest

from seq2seq.commands import study as study_script
from seq2seq.study.layout import Study
from seq2seq.study.spec import Run, StudySpec, check_spec


def refused(tmp_path: Path, capsys: pytest.CaptureFixture, *argv: str) -> str:
    """The one error line of a `study.py run` that must refuse before writing anything."""
    folder = tmp_path / "study"
    assert study_script.main(["run", str(folder), "--work-dir", str(tmp_path / "w"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not folder.exists()
    return err[0]


def write_yaml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return str(path)


def test_yaml_specs_are_checked_like_flags(tmp_path, capsys):
    beam = write_yaml(tmp_path, "variants: {a: --score dot}\nseeds: [1]\nbeam: five\n")
    assert "beam must be an integer, got 'five'" in refused(tmp_path, capsys, "--config", beam)
    seeds = write_yaml(tmp_path, "variants: {a: --score dot}\nseeds: [1, two]\n")
    assert "seeds must be a list of integers" in refused(tmp_path, capsys, "--config", seeds)
    flags = write_yaml(tmp_path, "variants: {a: {score: dot}}\nseeds: [1]\n")
    line = refused(tmp_path, capsys, "--config", flags)
    assert "variant a: flags must be one string or a list of words" in line
    split = write_yaml(tmp_path, "variants: {a: --score dot}\nseeds: [1]\nsplit: val\n")
    assert "--split val: each run's checkpoint is chosen on val" in refused(
        tmp_path, capsys, "--config", split
    )
    # the same refusal from the command line
    line = refused(tmp_path, capsys, "--variant", "a", "--score dot", "--seeds", "1", "--split",
                   "val")  # fmt: skip
    assert "--split val" in line
    line = refused(tmp_path, capsys, "--variant", "a", "--max-minutes 5", "--seeds", "1")
    assert "--max-minutes limits a sitting, not a variant" in line


def test_a_yaml_variant_with_no_flags_is_train_pys_defaults(tmp_path, capsys):
    config = write_yaml(tmp_path, "variants:\n  default:\n  dot: --score dot\nseeds: [1, 2]\n")
    folder, work = tmp_path / "study", tmp_path / "w"
    assert study_script.main(["commands", str(folder), "--work-dir", str(work), "--config",
                              config]) == 0  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[5:7] for line in lines[:2]] == [["default", "1"], ["dot", "1"]]
    spec = Study(folder, work).load_spec()
    assert spec.variants == {"default": [], "dot": ["--score", "dot"]}
    assert spec.train_flags(Run("default", 2)) == ["--seed", "2"]


def test_relative_paths_are_the_callers_and_saved_relative_to_the_current_folder(
    tmp_path, monkeypatch
):
    """Resolved once where the spec is read, against the current folder (where the study's children
    run); study.json keeps those inside it relative, others absolute. No path is the checkout's."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "links.align").write_text("0-0\n")
    monkeypatch.chdir(tmp_path)
    given = {"variants": {"a": "--data-dir corpus --score dot"}, "seeds": [1],
             "flags": ["--spm-model=spm/x.model"], "align_ref": "links.align"}  # fmt: skip
    spec = StudySpec.from_dict(given, "the command line", Path.cwd())
    assert spec.variants["a"] == ["--data-dir", str(tmp_path / "corpus"), "--score", "dot"]
    assert spec.flags == [f"--spm-model={tmp_path / 'spm/x.model'}"]
    assert spec.align_ref == str(tmp_path / "links.align")
    study = Study("study", "work")
    assert study.folder == tmp_path / "study" and study.work_dir == tmp_path / "work"

    elsewhere = StudySpec.from_dict(
        {"variants": {"a": []}, "seeds": [1], "align_ref": str(tmp_path.parent / "x.align")},
        "the command line", Path.cwd(),
    )  # fmt: skip
    saved = json.loads(spec.to_json())
    assert saved["align_ref"] == "links.align"  # portable: relative to the current folder
    assert saved["variants"]["a"] == ["--data-dir", "corpus", "--score", "dot"]
    assert json.loads(elsewhere.to_json())["align_ref"] == str(tmp_path.parent / "x.align")
    # read back from study.json against the folder the study runs in, it is the same spec
    (tmp_path / "docs").mkdir()
    monkeypatch.chdir(tmp_path / "docs")
    assert StudySpec.from_dict(saved, "study.json", tmp_path) == spec
    check_spec(spec)  # the resolved files are found from here too


def test_status_reads_a_checkpoint_with_weights_only(tmp_path, premove_checkpoint):
    """`status` reads global_step and lr_horizon of last.ckpt under weights_only=True (mmap)."""
    import shutil

    study = Study(tmp_path / "study", tmp_path / "work")
    run = Run("a", 1)
    study.last_checkpoint(run).parent.mkdir(parents=True)
    shutil.copyfile(premove_checkpoint, study.last_checkpoint(run))
    assert study.state(run) == "partial"
    assert study.progress(run).startswith("update 20 of 20 (100%) in last.ckpt, saved ")


def test_a_childs_end_by_a_stop_signal_exits_as_a_stop():
    from seq2seq.errors import STOPPED
    from seq2seq.study.process import exit_status

    assert exit_status(-15) == STOPPED and exit_status(-10) == STOPPED  # SIGTERM, SIGUSR1
    assert exit_status(-9) == 137 and exit_status(0) == 0 and exit_status(3) == 3
