"""The command lines as processes: `python -m seq2seq` lists every command, a command's help is its
shim's, and the package runs with no checkout around it (a corpus found by name in the current
folder or through SEQ2SEQ_DATA)."""

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from seq2seq import commands
from tests.conftest import ROOT


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1", **env}
    environ.setdefault("PYTHONPATH", str(ROOT))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


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


def test_a_command_s_help_is_its_shim_s_but_for_the_program_s_name(tmp_path: Path) -> None:
    via_m = _run(["-m", "seq2seq", "train", "--help"], tmp_path, PYTHONPATH=str(ROOT))
    via_shim = _run([str(ROOT / "scripts" / "train.py"), "--help"], tmp_path, PYTHONPATH=str(ROOT))
    assert via_m.returncode == via_shim.returncode == 0
    assert via_m.stdout.startswith("usage: seq2seq train [-h]")
    assert via_shim.stdout.startswith("usage: train.py [-h]")
    # The usage lines wrap by the program's name; everything after them is the same text.
    assert via_m.stdout.split("\n\n", 1)[1] == via_shim.stdout.split("\n\n", 1)[1]
    assert "--batch-tokens" in via_m.stdout and "--resume" in via_m.stdout


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


def test_with_no_network_a_corpus_not_found_is_looked_for_in_the_hubs_cache_alone(
    tmp_path: Path,
) -> None:
    # A host that resolves nowhere (RFC 6761): without the check, datasets retries it for ~30 s.
    environ = {
        k: v for k, v in os.environ.items() if k not in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    }
    environ |= {
        "HF_ENDPOINT": "https://hub.invalid",
        "PYTHONPATH": str(ROOT),
        "HF_HOME": str(tmp_path),
    }
    done = subprocess.run([sys.executable, "-m", "seq2seq", "prepare", "--dataset", "nowhere"],
                          cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: corpus 'nowhere' not found: searched {tmp_path / 'data' / 'nowhere'}, "
        )
    )
    assert (
        "and the Hugging Face hub's cache as 'nowhere' (hub.invalid does not resolve: "
        in done.stderr
    )
    assert "thrown while requesting" not in done.stderr  # no retry of the hub was made
    # An offline setting of the user's stands as it is: no lookup, datasets' own offline answer.
    offline = subprocess.run([sys.executable, "-m", "seq2seq", "prepare", "--dataset", "nowhere"],
                             cwd=tmp_path, env={**environ, "HF_HUB_OFFLINE": "1"},
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert offline.returncode == 2
    assert "and the Hugging Face hub as 'nowhere' (" in offline.stderr
