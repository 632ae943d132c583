"""The study command in-process: bad specs refused before any training, a saved study's commands and
status, and the report's table of commits (a tiny study trained, killed with SIGKILL, resumed and
reported: tests/e2e/test_study.py)."""

import os

from seq2seq.commands import study as study_script
from seq2seq.study.layout import Study


def test_bad_specs_are_refused_in_one_line_before_any_training(tmp_path, capsys):
    folder = tmp_path / "study"
    twice = tmp_path / "twice.yaml"  # YAML keeps the last of two keys and drops the first unsaid
    twice.write_text("variants:\n  a: --score dot\n  a: --score additive\nseeds: [1]\n")
    cases = [
        (["--variant", "a", "--score additive", "--seeds", "1", "1"], "--seeds lists a seed twice"),
        (["--variant", "a", "--score dot", "--seeds", "1", "-1"], "--seeds -1: must be 0 to "),
        (["--variant", "a", "--score addtive", "--seeds", "1"], "variant a: train.py refuses"),
        (["--variant", "a", "--seed 3", "--seeds", "1"], "--seed is set by the study itself"),
        (["--variant", "a/b", "--score dot", "--seeds", "1"], "variant name 'a/b'"),
        (
            ["--variant", "a", "--score dot", "--variant", "a", "--score additive", "--seeds", "1"],
            "--variant a is given twice",
        ),
        (["--config", str(twice)], f"--config {twice} line 3: 'a' is given twice (line 2 too)"),
        (["--seeds", "1"], "at least one variant"),
        (["--variant", "a", "--score dot", "--seeds", "1", "--threads", "0"], "--threads must be"),
        (
            ["--variant", "a", "--score dot", "--seeds", "1", "--parallel", "0"],
            "--parallel must be",
        ),
    ]
    for flags, message in cases:
        assert study_script.main(["run", str(folder), "--work-dir", str(tmp_path), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and message in err[-1], err
    assert not folder.exists()  # nothing written, nothing trained
    assert study_script.main(["status", str(folder)]) == 2
    assert "no study.json" in capsys.readouterr().err


def test_a_saved_study_refuses_another_spec_and_lists_its_commands(tmp_path, capsys):
    folder, work = tmp_path / "study", tmp_path / "work"
    spec = [
        "--variant",
        "a",
        "--score additive",
        "--variant",
        "d",
        "--score dot",
        "--seeds",
        "1",
        "2",
    ]
    assert study_script.main(["commands", str(folder), "--work-dir", str(work), *spec]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # `python LINE` runs the run: `python -m seq2seq study one DIR VARIANT SEED ...`
    assert all(line.split()[:4] == ["-m", "seq2seq", "study", "one"] for line in lines)
    assert [line.split()[5:7] for line in lines] == [["a", "1"], ["d", "1"], ["a", "2"], ["d", "2"]]
    assert all(f"--work-dir {work}" in line for line in lines)
    other = ["--variant", "a", "--score scaled", "--seeds", "1"]
    assert study_script.main(["commands", str(folder), "--work-dir", str(work), *other]) == 2
    assert "holds another study" in capsys.readouterr().err
    assert study_script.main(["status", str(folder), "--work-dir", str(work)]) == 0
    assert capsys.readouterr().out.split() == ["a-seed1", "new", "d-seed1", "new", "a-seed2",
                                               "new", "d-seed2", "new"]  # fmt: skip
    # A run's lock says who works on it: a live process here, one on another host, or a dead one.
    from seq2seq.data.owners import Owner

    locks = work / "locks"
    locks.mkdir(parents=True)
    (locks / "a-seed1.lock").write_text(Owner.me().tag)
    (locks / "d-seed1.lock").write_text("elsewhere~4242~7~")
    dead = Owner(Owner.me().host, 2**22 + 1, 1, Owner.me().space)  # past Linux's highest pid
    (locks / "a-seed2.lock").write_text(dead.tag)
    assert study_script.main(["status", str(folder), "--work-dir", str(work)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(f"new      ; running now (pid {os.getpid()})")
    assert lines[1].endswith("new      ; held by pid 4242 on elsewhere")
    assert lines[2].split() == ["a-seed2", "new"] and lines[3].split() == ["d-seed2", "new"]


def test_report_lists_a_runs_commits_in_sitting_order_and_explains_all_only_when_shown():
    from seq2seq.study.report import FIGURES, markdown, summarize
    from seq2seq.study.spec import StudySpec

    def run(seed: int, commits: list[str]) -> dict:
        trained = [{"commit": c, "cpu": "test CPU"} for c in commits]
        return {"variant": "a", "seed": seed, "bleu": 30.0, "chrf": 50.0, "aer": None,
                "checkpoint_rule": "best single", "updates": 10, "train_hours": 0.1,
                "trained": trained, "bleu_signature": "b", "chrf_signature": "c"}  # fmt: skip

    # the later commit sorts first by name: the table must follow the sittings, not the alphabet
    runs = [run(1, ["f" * 40, "0" * 39 + "1", "f" * 40]), run(2, ["1" * 40 + "+dirty"])]
    figures = {key: summarize([]) for key, _, _ in FIGURES}
    figures["bleu"] = summarize([30.0])
    report = {"variants": {"a": {**figures, "seeds": [1]}}, "runs": runs}
    row = {"baseline": "a", "system": "b", "seeds": "1", "bleu_baseline": 30.0,
           "bleu_system": 31.0, "delta": 1.0, "bleu_accuracy": 0.64, "chrf_baseline": 50.0,
           "chrf_system": 51.0, "chrf_delta": 1.0, "chrf_accuracy": 0.71, "p_bs": 0.2,
           "p_ar": 0.01, "p_bs_holm": 0.4, "p_ar_holm": 0.02}  # fmt: skip
    spec = StudySpec(variants={"a": [], "b": []}, seeds=[1])

    text = markdown(Study("s"), spec, {**report, "significance": [row]})
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if "-seed" in line}
    assert "| fffffff, 0000000 |" in rows["| a-seed1"]
    assert "| 1111111+ |" in rows["| a-seed2"]
    assert "`all`" not in text and "Bold: adjusted p < 0.05" in text
    # the raw p-values plain, the adjusted ones beside them, bold only where they stay below 0.05
    assert "| 0.2000 | 0.4000 | 0.0100 | **0.0200** |" in text

    text = markdown(Study("s"), spec, {**report, "significance": [row, {**row, "seeds": "all"}]})
    assert "`all`: each variant's hypotheses of every seed concatenated" in text
