"""The package's layout: the layering of pyproject.toml's import-linter contracts holds, a forbidden
import breaks it, each concept has its folder, and a checkpoint written before the move loads and
translates (a run saved before it resumes: tests/e2e/test_layout.py)."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from seq2seq import Translator, load_model
from tests.conftest import ROOT

BASICS = {"__init__", "errors", "atomic", "checkpoint", "cli", "machine", "signals", "recipes"}
ENTRY = "__main__"  # `python -m seq2seq`: hands over to seq2seq.commands, above every layer
FOLDERS = {
    "models",
    "data",
    "alignment",
    "decoding",
    "training",
    "study",
    "serving",
    "commands",
    "benchmarks",
}


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess:
    """`lint-imports` with the project's contracts, on the package found first in `package_parent`."""
    return subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
         "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=package_parent, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(package_parent), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_the_layering_contracts_hold() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "4 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("models/attention.py", "import seq2seq.data.tokenizer", "Layers"),
        ("data/batching.py", "from seq2seq.training import config", "Layers"),
        ("models/rnn.py", "import lightning", "Models need torch and the basics alone"),
        ("models/rnn.py", "import seq2seq.models.kernels", "The textbook models import no kernel"),
        ("checkpoint.py", "import seq2seq.models.build", "The basics import no sub-package"),
        ("machine.py", "import seq2seq.training.config", "The basics import no sub-package"),
    ],
)
def test_a_forbidden_import_breaks_the_contracts(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    copy = shutil.copytree(ROOT / "seq2seq", tmp_path / "seq2seq")
    target = copy / module
    target.write_text(target.read_text("utf-8") + f"\n{line}  # a test's forbidden import\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1
    assert f"{contract}" in done.stdout and "BROKEN" in done.stdout
    assert module.removesuffix(".py").replace("/", ".") in done.stdout


def test_each_concept_has_its_folder_and_only_the_basics_stay_on_top() -> None:
    package = ROOT / "seq2seq"
    top = {path.stem for path in package.glob("*.py")}
    assert top == BASICS | {ENTRY}
    # Every basic module but the package's own __init__ is held to importing no sub-package.
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["importlinter"]
    (basics,) = [
        c for c in contracts["contracts"] if c["name"] == "The basics import no sub-package"
    ]
    assert {name.removeprefix("seq2seq.") for name in basics["source_modules"]} == BASICS - {
        "__init__"
    }
    folders = {path.name for path in package.iterdir() if (path / "__init__.py").is_file()}
    assert folders == FOLDERS
    for folder in FOLDERS:
        modules = [path for path in (package / folder).glob("*.py") if path.stem != "__init__"]
        assert 1 <= len(modules) <= 12, (folder, len(modules))
        assert "May import" in (package / folder / "__init__.py").read_text("utf-8")


def test_a_checkpoint_written_before_the_move_loads_and_translates(
    premove_checkpoint: Path,
) -> None:
    model, tokenizer = load_model(premove_checkpoint)
    assert model.model_args["hidden_size"] == 8 and tokenizer.vocab_size == 100
    translations = Translator.load(premove_checkpoint).translate(["Ein Hund läuft im Park"])
    assert len(translations) == 1 and isinstance(translations[0].text, str)
    # The weights are the saved ones, not a fresh initialisation.
    saved = torch.load(premove_checkpoint, weights_only=True)["state_dict"]
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved[f"model.{name}"]), name
