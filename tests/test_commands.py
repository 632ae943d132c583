"""The command lines: `python -m seq2seq` lists and runs every command, each script in scripts/ is a
shim over one of them, and the package runs with no checkout around it (a corpus found by name in
the current folder or through SEQ2SEQ_DATA)."""

import ast
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from seq2seq import commands

ROOT = Path(__file__).resolve().parents[1]
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


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1", **env}
    environ.setdefault("PYTHONPATH", str(ROOT))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


# scripts/<file> and docs/tools/<file> -> the benchmark module each runs
BENCHMARK_SHIMS = {
    "scripts/benchmark.py": "speed",
    "scripts/benchmark_memory.py": "memory",
    "scripts/benchmark_scale.py": "scale",
    "scripts/plot_benchmarks.py": "plots",
    "docs/tools/profile_update.py": "profile",
}


def test_python_m_seq2seq_lists_every_command_and_the_console_script_is_its_main(
    tmp_path: Path,
) -> None:
    done = _run(["-m", "seq2seq", "--help"], tmp_path, PYTHONPATH=str(ROOT))
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.split("commands:\n")[1].splitlines()]
    assert listed == list(commands.COMMANDS)
    assert {"train", "evaluate", "translate", "prepare", "average", "serve", "study"} <= set(listed)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["scripts"]
    module, function = scripts["seq2seq"].split(":")
    assert (module, function) == ("seq2seq.commands", "main")


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


@pytest.mark.slow
def test_a_command_s_help_is_its_shim_s_but_for_the_program_s_name(tmp_path: Path) -> None:
    via_m = _run(["-m", "seq2seq", "train", "--help"], tmp_path, PYTHONPATH=str(ROOT))
    via_shim = _run([str(ROOT / "scripts" / "train.py"), "--help"], tmp_path, PYTHONPATH=str(ROOT))
    assert via_m.returncode == via_shim.returncode == 0
    assert via_m.stdout.startswith("usage: seq2seq train [-h]")
    assert via_shim.stdout.startswith("usage: train.py [-h]")
    # The usage lines wrap by the program's name; everything after them is the same text.
    assert via_m.stdout.split("\n\n", 1)[1] == via_shim.stdout.split("\n\n", 1)[1]
    assert "--batch-tokens" in via_m.stdout and "--resume" in via_m.stdout


@pytest.mark.slow
def test_the_package_needs_no_checkout_a_corpus_is_found_by_name_or_by_the_variable(
    tmp_path: Path, tiny_corpus: Path
) -> None:
    site = tmp_path / "site"
    shutil.copytree(
        ROOT / "seq2seq", site / "seq2seq", ignore=shutil.ignore_patterns("__pycache__")
    )
    work, elsewhere = tmp_path / "work", tmp_path / "corpora"
    shutil.copytree(tiny_corpus, work / "data" / "toy")
    shutil.copytree(tiny_corpus, elsewhere / "toy2")
    flags = ["--vocab-size", "100", "--cache-dir", "cache"]
    env = {"PYTHONPATH": str(site)}
    found = _run(["-m", "seq2seq", "prepare", "--dataset", "toy", *flags], work, **env)
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.startswith("data/toy (de-en), built")
    by_variable = _run(["-m", "seq2seq", "prepare", "--dataset", "toy2", *flags], work,
                       SEQ2SEQ_DATA=str(elsewhere), **env)  # fmt: skip
    assert by_variable.returncode == 0, by_variable.stderr[-2000:]
    assert by_variable.stdout.startswith(f"{elsewhere / 'toy2'} (de-en), built")
    # Outside any checkout: no commit to report, and nothing of the checkout is asked for.
    probe = "import seq2seq, seq2seq.machine as m; print(seq2seq.__file__, repr(m.git_commit()))"
    where = _run(["-c", probe], work, **env)
    assert where.stdout.split() == [str(site / "seq2seq" / "__init__.py"), "''"]


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
