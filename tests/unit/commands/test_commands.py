"""The command lines: `seq2seq` refuses no command or an unknown one, each script in scripts/ is a
shim over one of them, and a study's children run this package (`python -m seq2seq` in a process,
and the package with no checkout around it: tests/e2e/test_commands.py)."""

import ast
import os
import sys
from pathlib import Path

import pytest

from seq2seq import commands
from tests.conftest import ROOT

# scripts/<file> -> the command it is a shim for
SHIMS = {
    "train.py": "train",
    "evaluate.py": "evaluate",
    "translate.py": "translate",
    "prepare.py": "prepare",
    "average_checkpoints.py": "average",
    "serve.py": "serve",
    "study.py": "study",
    "plot_attention.py": "plot-attention",
    "silver_alignments.py": "silver-alignments",
}


# scripts/<file> and docs/tools/<file> -> the benchmark module each runs
BENCHMARK_SHIMS = {
    "scripts/benchmark.py": "speed",
    "scripts/benchmark_memory.py": "memory",
    "scripts/benchmark_scale.py": "scale",
    "scripts/plot_benchmarks.py": "plots",
    "docs/tools/profile_update.py": "profile",
}


def test_no_command_or_an_unknown_one_is_refused_with_status_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert commands.main([]) == 2
    assert "commands:" in capsys.readouterr().err
    assert commands.main(["trian", "--score", "dot"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("seq2seq: error: unknown command 'trian'")


def test_every_command_script_is_a_shim_over_its_command() -> None:
    found = {path.name for path in (ROOT / "scripts").glob("*.py")}
    assert set(SHIMS) <= found
    for name, command in SHIMS.items():
        tree = ast.parse((ROOT / "scripts" / name).read_text("utf-8"))
        imports = [node for node in tree.body if isinstance(node, ast.ImportFrom)]
        module = f"seq2seq.commands.{commands.COMMANDS[command][0]}"
        assert [(i.module, [a.name for a in i.names]) for i in imports] == [(module, ["main"])], (
            name
        )
        functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
        assert functions == [], f"scripts/{name} holds code of its own"


def test_every_benchmark_script_is_a_shim_over_the_package() -> None:
    for path, module in BENCHMARK_SHIMS.items():
        tree = ast.parse((ROOT / path).read_text("utf-8"))
        imports = [node for node in tree.body if isinstance(node, ast.ImportFrom)]
        assert [(i.module, [a.name for a in i.names]) for i in imports] == [
            (f"seq2seq.benchmarks.{module}", ["main"])
        ], path
        functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)]
        assert functions == [], f"{path} holds code of its own"


def test_a_study_s_children_run_this_package_in_the_caller_s_folder(tmp_path: Path) -> None:
    from seq2seq.study import process
    from seq2seq.study.layout import Study
    from seq2seq.study.spec import Run, StudySpec

    assert process.COMMAND == (sys.executable, "-m", "seq2seq")
    env = process.package_env()
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)  # this checkout's seq2seq first
    spec = StudySpec({"a": ["--score", "dot"]}, [1])
    command = process.train_command(Study(tmp_path / "study", tmp_path / "work"), spec, Run("a", 1))
    assert command[:4] == [sys.executable, "-m", "seq2seq", "train"]
    assert "scripts" not in " ".join(command)
