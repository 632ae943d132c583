"""The benchmarks refuse a count below one, train.py flags that are wrong or that they set themselves,
and a checkpoint or sentence file they cannot use in one line, before any of their minutes of work
(a count of 0 used to start the run it then broke)."""

import importlib.util
from pathlib import Path

import pytest

from seq2seq.benchmarks import memory, scale, speed
from tests.conftest import ROOT


def serve_benchmark():
    """scripts/benchmark_serve.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "benchmark_serve", ROOT / "scripts" / "benchmark_serve.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "main, argv, message",
    [
        (speed.main, ["--steps", "0"], "argument --steps: 0: must be at least 1"),
        (speed.main, ["--windows", "-1"], "argument --windows: -1: must be at least 1"),
        (
            speed.main,
            ["--train-updates", "x"],
            "argument --train-updates: 'x' is not a whole number",
        ),
        (memory.main, ["--updates", "0"], "argument --updates: 0: must be at least 1"),
        (scale.main, ["--pairs", "0"], "argument --pairs: 0: must be at least 1"),
    ],
)
def test_a_count_below_one_is_refused_as_the_flags_are_read(main, argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--scroe", "additive"], "unrecognized arguments: --scroe additive"),
        (["--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
        (["--min-lr-ratio", "-1"], "--min-lr-ratio must be in [0, 1], got -1.0"),
        (["--data-dir", "mine"], "--data-dir is set by this benchmark itself"),
        (["--max-steps=5"], "--max-steps is set by this benchmark itself"),
    ],
)
def test_the_scale_benchmark_checks_train_flags_before_writing_its_corpus(
    extra: list[str], message: str, tmp_path: Path, capsys
) -> None:
    """train.py's flags it passes on were read only by its children, after a corpus of --pairs
    pairs was written and prepared."""
    work = tmp_path / "work"
    with pytest.raises(SystemExit) as stop:
        scale.main(["--pairs", "1000", "--work", str(work), "--no-train", *extra])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not work.exists()  # no corpus written


def test_the_serving_benchmark_names_what_it_cannot_use(tmp_path: Path, capsys) -> None:
    bench = serve_benchmark()
    checkpoint = tmp_path / "nope.ckpt"  # the sentences are read first, the flags before them
    sentences = tmp_path / "src.txt"
    sentences.write_text("ein Hund .\n")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n")
    for argv, message in (
        ([str(checkpoint), "--src-file", str(sentences)], f"error: {checkpoint}: no such checkpoint"),
        ([str(checkpoint), "--src-file", str(tmp_path / "nope.txt")], f"error: {tmp_path / 'nope.txt'}: cannot read"),
        ([str(checkpoint), "--src-file", str(blank)], f"error: --src-file {blank}: no sentences"),
    ):  # fmt: skip
        assert bench.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(message), err
    with pytest.raises(SystemExit):
        bench.main([str(checkpoint), "--src-file", str(sentences), "--memory-marks", "20", "10"])
    assert "--memory-marks 20 10: EARLY before LATE" in capsys.readouterr().err
