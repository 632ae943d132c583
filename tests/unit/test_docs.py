"""What README.md and the pages under docs/ point at exists: every relative link (and its #anchor,
when it points into one of our Markdown files), every repository path they name in code, and a row
in docs/guides/layout.md for every module and script. A study command they give for a committed
study is the one its study.json holds, so it continues that study instead of being refused. Figures
the pages derive from committed files are recomputed from them, and claims about the code checked
against it."""

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from seq2seq.cli import as_flag, per_model_fields
from seq2seq.commands import study as study_command
from seq2seq.models.attention import SCORERS
from seq2seq.recipes import RECIPE
from seq2seq.training.config import TrainConfig, parse_args
from tests.conftest import ROOT

# The README, the guides and the write-ups of results (a study folder's report.md is the report's
# own output, not a page written by hand).
PAGES = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md")), *sorted(ROOT.glob("docs/[gr]*/*.md"))]

# A code token is taken for a path of this repository when it starts with one of its top-level
# folders. Paths outside them (lightning_logs/..., runs/..., ../shared/..., /data/wmt14) are
# made by a run or belong to the user, and are not looked for.
REPO_FOLDERS = ("scripts", "seq2seq", "docs", "tests", "data", ".ci")
# Under those, on purpose: data/ is git-ignored but for data/README.md; the corpora, caches and
# silver links the docs name there (data/silver/train.de-en.align, data/multi30k/, data/cache)
# are what a user makes by following them.
USER_MADE = ("data/",)

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(map(re.escape, REPO_FOLDERS))})/[\w./*-]*)")
FENCE = re.compile(r"^(```|~~~)")


def prose_and_code(page: Path) -> tuple[list[str], list[str]]:
    """The page's lines outside fenced code blocks, and its code (fenced blocks and inline spans)."""
    prose, code, fenced = [], [], False
    for line in page.read_text("utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif fenced:
            code.append(line)
        else:
            prose.append(line)
            code += re.findall(r"`([^`]+)`", line)
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for line in prose_and_code(page)[0]:
        if match := re.match(r"#{1,6}\s+(.*?)\s*#*$", line):
            base = slug(match[1])
            n = counts[base] = counts.get(base, -1) + 1
            found.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers a repeated heading
    return found


def links(page: Path) -> list[str]:
    return [target for line in prose_and_code(page)[0] for target in LINK.findall(line)]


def named_pages(page: Path) -> list[str]:
    """Markdown files named in plain prose, outside links and code ("see DESIGN.md §1")."""
    found = []
    for line in prose_and_code(page)[0]:
        plain = LINK.sub("", re.sub(r"`[^`]+`", "", line))
        found += re.findall(r"(?<![\w/.-])((?:\.\./)*[\w./-]*\w\.md)\b", plain)
    return found


def paths(page: Path) -> list[str]:
    found = [p.rstrip(".") for text in prose_and_code(page)[1] for p in PATH.findall(text)]
    return [p for p in found if not p.startswith(USER_MADE)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_their_anchors_exist(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not ours to check
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, f"{page.name}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_files_named_in_prose_exist(page: Path) -> None:
    missing = [
        name
        for name in named_pages(page)
        if not (page.parent / name).exists() and not (ROOT / name).exists()
    ]
    assert not missing, f"{page.name} names pages that are not in the repository: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_paths_named_in_code_exist(page: Path) -> None:
    missing = [p for p in paths(page) if not any(ROOT.glob(p.rstrip("/")))]
    assert not missing, f"{page.name} names paths that are not in the repository: {missing}"


def tracked(*patterns: str) -> set[str]:
    """Files of the repository matching the patterns: git's list where there is one (files another
    change has not committed yet are not the page's to list), else the folder's."""
    try:
        out = subprocess.run(
            ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        return set(out.split())
    except (OSError, subprocess.CalledProcessError):
        return {str(p.relative_to(ROOT)) for pattern in patterns for p in ROOT.glob(pattern)}


def test_layout_names_every_module_and_script() -> None:
    """docs/guides/layout.md's first column names each file; a bare name is in the folder of the
    path before it in the same cell (`seq2seq/decoding/search.py`, `beam.py`)."""
    named = set()
    for line in (ROOT / "docs" / "guides" / "layout.md").read_text("utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if "/" in name:
                folder = name.rsplit("/", 1)[0] + "/"
                named.add(name)
            else:
                named.add(folder + name)
    files = tracked("seq2seq/*.py", "scripts/*.py", "docs/tools/*.py")
    assert sorted(files - named) == [], "modules and scripts docs/guides/layout.md does not name"
    assert sorted(n for n in named - files if n.endswith(".py")) == [], "named, but not here"


def fenced_commands(page: Path) -> list[str]:
    """The shell lines of the page's fenced blocks, a backslash-continued command joined into one."""
    commands, fenced, pending = [], False, ""
    for line in page.read_text("utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif fenced:
            pending += line.strip()
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
            else:
                commands.append(pending)
                pending = ""
    return commands


STUDY_RUN = re.compile(r"^python scripts/study\.py run (\S+) .*--variant")
STUDY_CASES = [
    pytest.param(page, command, id=f"{page.relative_to(ROOT)}: {STUDY_RUN.match(command)[1]}")
    for page in PAGES
    for command in fenced_commands(page)
    if STUDY_RUN.match(command) and (ROOT / STUDY_RUN.match(command)[1] / "study.json").is_file()
]


@pytest.mark.parametrize(("page", "command"), STUDY_CASES)
def test_a_study_command_for_a_committed_study_gives_its_spec(
    page: Path,
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`study.py commands` with the page's spec flags: refused (exit 2) when they are not the saved
    spec; with every run of the committed study done, it prints no command to run."""
    args = shlex.split(command, comments=True)[3:]  # after `python scripts/study.py run`
    for option in ("--parallel", "--work-dir"):  # `run`'s alone, or ours to choose
        while option in args:
            del args[args.index(option) : args.index(option) + 2]
    monkeypatch.chdir(ROOT)
    code = study_command.main(["commands", *args, "--work-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, f"{page.name}: {command!r} is refused: {err.strip()}"
    assert out == "", f"{page.name}: runs of the committed study are not all done"


TOOLS = sorted(ROOT.glob("docs/tools/*.py"))


def test_pages_the_code_names_exist() -> None:
    """A page, program or figure under docs/ that a module, script, test, tool or pyproject.toml
    names is there (a page moved into docs/guides/ or docs/results/ leaves no comment pointing at
    nothing).
    Other files are left alone: a test may name one it makes (docs/study/x.align)."""
    named = {
        (str(source.relative_to(ROOT)), path)
        for source in [ROOT / "pyproject.toml", *sorted(ROOT.glob("[st]*/**/*.py")), *TOOLS]
        for path in re.findall(
            r"(?<![\w/.-])docs/[\w./-]*\.(?:md|py|png)\b", source.read_text("utf-8")
        )
    }
    missing = sorted(f"{source}: {path}" for source, path in named if not any(ROOT.glob(path)))
    assert not missing, f"paths under docs/ that are not in the repository: {missing}"


# Studies with a report (a spec is committed before its runs train, and has none until they end).
STUDIES = sorted(path.parent for path in ROOT.glob("docs/study*/report.json"))


@pytest.mark.parametrize("folder", STUDIES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_committed_report_has_every_figure_the_report_gives(folder: Path) -> None:
    """A report built before a figure joined the report (`BLEU lowercased`) is stale: its
    report.json summarises every figure of `FIGURES` for every variant, and its report.md's
    per-variant table has a column for each (`python scripts/study.py report DIR` rebuilds both)."""
    from seq2seq.study.report import FIGURES

    report = json.loads((folder / "report.json").read_text("utf-8"))
    missing = {
        variant: [key for key, _, _ in FIGURES if key not in figures]
        for variant, figures in report["variants"].items()
    }
    assert all(not keys for keys in missing.values()), f"report.json lacks {missing}"
    header = next(
        line
        for line in (folder / "report.md").read_text("utf-8").splitlines()
        if line.startswith("| variant | seeds |")
    )
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    assert columns[2:] == [title for _, title, _ in FIGURES], f"{folder.name}/report.md is stale"


def test_layout_names_the_basics_the_contract_holds() -> None:
    """docs/guides/layout.md names every top-level module as a basic, twice (the layers' sketch
    and the contract "The basics import no sub-package"), and pyproject.toml's contract covers them."""
    import tomllib

    # __main__ (`python -m seq2seq`) is no basic: the entry point, above every layer.
    basics = {p.stem for p in (ROOT / "seq2seq").glob("*.py")} - {"__init__", "__main__"}
    page = " ".join((ROOT / "docs" / "guides" / "layout.md").read_text("utf-8").split())
    sketch = re.search(r"basics \(top level\) ([\w, ]+)", page)[1]
    assert set(sketch.replace(",", " ").split()) == basics, "the layers' sketch"
    contract = re.search(r'"The basics import no sub-package" for (.*?), and "', page)[1]
    assert set(re.findall(r"`(\w+)`", contract)) == basics, "the contract's sentence"
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["importlinter"]
    [held] = [c for c in config["contracts"] if c["name"] == "The basics import no sub-package"]
    assert {m.removeprefix("seq2seq.") for m in held["source_modules"]} == basics, "pyproject.toml"


def report_of(folder: str) -> dict:
    return json.loads((ROOT / folder / "report.json").read_text("utf-8"))["variants"]


def test_study_page_figures_are_the_reports() -> None:
    """Figures docs/results/study.md derives from the committed reports, recomputed from them
    unrounded: 95% intervals (mean ± ci95) and a difference of two means."""
    page = " ".join((ROOT / "docs" / "results" / "study.md").read_text("utf-8").split())
    scorers = report_of("docs/study")
    low = scorers["additive"]["bleu"]["mean"] - scorers["additive"]["bleu"]["ci95"]
    high = scorers["additive"]["bleu"]["mean"] + scorers["additive"]["bleu"]["ci95"]
    assert f"interval, {low:.2f}-{high:.2f}." in page, "additive's 95% interval"
    assert f"`additive`'s (down to {low:.2f})" in page
    scaled = scorers["scaled"]["bleu"]["mean"] + scorers["scaled"]["bleu"]["ci95"]
    assert f"interval over seeds still reaches {scaled:.2f}" in page, "scaled's 95% interval"
    en_de = report_of("docs/study-baseline-en-de")
    chrf = en_de["transformer"]["chrf"]["mean"] - en_de["gru-additive"]["chrf"]["mean"]
    assert f"chrF is {chrf:.2f} ahead" in page, "en->de: the Transformer's chrF lead"


def test_alignments_trade_off_is_against_one_run() -> None:
    """alignments.md's weights trade-off: what five and ten times the weight buy in AER and cost in
    BLEU, both against the same run (the default weight's), from its own table of guided runs."""
    page = (ROOT / "docs" / "guides" / "alignments.md").read_text("utf-8")
    rows = {}
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| additive | guided, weight ") and "rerun" not in cells[1]:
            rows[cells[1].split("weight ")[1].split()[0]] = (float(cells[3]), float(cells[6]))
    base_aer, base_bleu = rows["0.1"]
    aer = [100 * (base_aer - rows[w][0]) for w in ("0.5", "1.0")]
    bleu = [base_bleu - rows[w][1] for w in ("0.5", "1.0")]
    expected = (
        f"buy the additive model {aer[0]:.2f} and {aer[1]:.2f} points of AER for "
        f"{bleu[0]:.2f} and {bleu[1]:.2f} BLEU"
    )
    assert expected in " ".join(page.split()), expected


def test_readme_first_lines_install_and_ci() -> None:
    """The README guides: at most 200 lines; its first two commands install and train, and install
    and test, the second being what CI (.ci/run) runs; the Python it names is pyproject.toml's; in
    Install, the torch build is chosen before the package, which would pull torch, is installed."""
    import tomllib

    page = ROOT / "README.md"
    lines = page.read_text("utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"
    train, test = fenced_commands(page)[:2]
    assert train.startswith("pip install torch==") and "python scripts/train.py" in train
    assert test.startswith("pip install torch==") and test.split("#")[0].strip().endswith(
        "python -m pytest"
    )
    ci = (ROOT / ".ci" / "run").read_text("utf-8")
    torch_pin = re.search(r"torch==[\d.]+", test)[0]
    extras = re.search(r"-e \"\.\[([\w,]+)\]\"", test)[1]
    assert torch_pin in ci and f'-e ".[{extras}]"' in ci, "CI installs what the README says"
    assert ci.strip().splitlines()[-1] == "python -m pytest", "CI runs the README's test command"
    python = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"][
        "requires-python"
    ]
    assert f"Python {python[:2]} {python[2:]}" in page.read_text("utf-8")
    install = fenced_commands(page)[2:]
    cpu = next(i for i, c in enumerate(install) if "--index-url" in c and "torch" in c)
    package = next(i for i, c in enumerate(install) if c.startswith("pip install -e ."))
    assert cpu < package, "the CPU torch note comes after the package that installs torch"


@pytest.mark.parametrize("score", SCORERS)
def test_only_the_output_layer_runs_in_bf16_in_the_gru_on_a_cpu(score: str) -> None:
    """What study.md and benchmarks.md say of bf16-mixed on a CPU: the GRU's output layer's matmuls
    (forward and backward) run in bf16; the encoder, the attention and the recurrence in fp32. Each
    matmul of a training step under CPU autocast is recorded with its dtype; the vocabulary (V = 53,
    no other size of this model or batch) marks the output layer's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from seq2seq.data.batching import collate
    from seq2seq.models.build import build_model
    from seq2seq.training.losses import batch_loss
    from seq2seq.training.system import TranslationSystem

    matmuls = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}
    seen: list[tuple[torch.dtype, set[int]]] = []

    class Matmuls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            if func in matmuls:
                shapes = {d for a in args if isinstance(a, torch.Tensor) for d in a.shape}
                seen.append((args[-1].dtype, shapes))
            return func(*args, **(kwargs or {}))

    vocab = 53
    torch.manual_seed(0)
    model = build_model({"model": "rnn", "vocab_size": vocab, "emb_size": 16, "hidden_size": 32,
                         "score": score, "dropout": 0.0})  # fmt: skip
    # The model as training runs it, with whatever speed paths the training system plugs in.
    model = TranslationSystem(model, None).model
    gen = torch.Generator().manual_seed(0)
    batch = collate([
        {"src_ids": torch.randint(4, vocab, (s,), generator=gen).tolist(),
         "tgt_ids": torch.randint(4, vocab, (t,), generator=gen).tolist(), "index": i}
        for i, (s, t) in enumerate([(6, 3), (2, 9), (11, 5), (4, 4)])
    ])  # fmt: skip
    with Matmuls():
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the forward, as Lightning runs it
            loss_sum, _, tokens, _ = batch_loss(model, batch, 0.1)
        (loss_sum / tokens).backward()
    bf16 = [dims for dtype, dims in seen if dtype == torch.bfloat16]
    fp32 = [dims for dtype, dims in seen if dtype == torch.float32]
    assert bf16 and all(vocab in dims for dims in bf16), "a bf16 matmul outside the output layer"
    assert fp32 and not any(vocab in dims for dims in fp32), "the output layer ran in fp32"


def cpus_of(folder: Path) -> str:
    """The CPUs a study's runs trained on, from each result.json's `trained` ("AVX2 EPYCs")."""
    kinds = {
        (entry["cpu"].rsplit(", ", 1)[-1], "Xeons" if "Xeon" in entry["cpu"] else "EPYCs")
        for result in folder.glob("runs/*/result.json")
        for entry in json.loads(result.read_text("utf-8"))["trained"]
    }
    families = sorted({family for _, family in kinds})
    return " and ".join(sorted({cap for cap, _ in kinds})) + " " + " and ".join(families)


def test_readme_results_name_the_cpus_each_study_trained_on() -> None:
    """The README's results table says, per row, which study it comes from and on which CPUs that
    study's runs trained (the Transformer's de->en runs were not on the scorer study's CPUs)."""
    rows = [
        line
        for line in (ROOT / "README.md").read_text("utf-8").splitlines()
        if line.startswith("| ") and "/report.md)" in line
    ]
    assert rows, "no results rows with their study's report"
    for row in rows:
        cell = row.strip("|").split("|")[-1].strip()
        folder = ROOT / re.search(r"\]\(([^)]+)/report\.md\)", cell)[1]
        assert cell.endswith(f", {cpus_of(folder)}"), f"{row.split('|')[1].strip()}: {cell}"


def test_study_page_pooled_holm_is_the_reports() -> None:
    """study.md's Transformer-against-`dot` seed 2 with the baseline report's and the scorer study's
    tests adjusted as one family, recomputed from the two committed report.json files."""
    from seq2seq.study.significance import holm

    tests = [
        test
        for folder in ("docs/study", "docs/study-baseline-de-en")
        for test in json.loads((ROOT / folder / "report.json").read_text("utf-8"))["significance"]
    ]
    [index] = [
        i
        for i, test in enumerate(tests)
        if {test["baseline"], test["system"]} == {"transformer", "study/dot"}
        and test["seeds"] == "2"
    ]
    bs, ar = (holm([test[key] for test in tests])[index] for key in ("p_bs", "p_ar"))
    page = " ".join((ROOT / "docs" / "results" / "study.md").read_text("utf-8").split())
    assert f"over the {len(tests)} together" in page
    assert f"no longer separates it from `dot` ({bs:.3f} / {ar:.3f})" in page


def test_a_study_the_readme_says_pins_the_precision_does() -> None:
    """A study spec the README names as pinning `--precision 32-true` holds it in its flags (not
    every spec does: the scorer and hidden-size studies leave the precision to the default)."""
    text = " ".join((ROOT / "README.md").read_text("utf-8").split())
    named = re.findall(r"`--precision 32-true`[^.]*?`(docs/[\w./-]+/study\.json)` pins it", text)
    assert named, "the README names no study that pins the precision"
    for spec in named:
        flags = json.loads((ROOT / spec).read_text("utf-8"))["flags"]
        assert "--precision" in flags and flags[flags.index("--precision") + 1] == "32-true", spec


README_VARIANTS = {  # results row -> its variant in the study the row links
    "GRU, additive (default)": "gru-emb512",
    "GRU, additive, 0.3": "gru-reg",
    "GRU, additive, 0.2": "additive",
    "GRU, dot, 0.2": "dot",
    "GRU, scaled, 0.2": "scaled",
    "Transformer": "transformer",
    "GRU, additive (default), en->de": "gru-emb512",
    "GRU, additive, en->de, 0.3": "gru-reg",
    "GRU, additive, en->de, 0.2": "gru-additive",
    "Transformer, en->de": "transformer",
}


def test_readme_hours_a_run_are_the_results_train_hours() -> None:
    """Each results row's "hours a run": mean (min-max) of its variant's runs' `train_hours`."""
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    header = next(line for line in lines if line.startswith("| model |")).split("|")
    column = [cell.strip() for cell in header].index("hours a run")
    for row, folder, variant in readme_results():
        hours = [
            json.loads(path.read_text("utf-8"))["train_hours"]
            for path in sorted((folder / "runs").glob(f"{variant}-seed*/result.json"))
        ]
        # Three seeds, or as many as the row says while the rest train ("seeds 1-2").
        seeds = re.search(r"seeds 1-(\d)", row[2])
        assert len(hours) == (int(seeds[1]) if seeds else 3), (folder, variant)
        expected = f"{sum(hours) / len(hours):.2f} ({min(hours):.2f}-{max(hours):.2f})"
        assert row[column].strip() == expected, row[1]


def test_readme_results_are_their_reports_figures() -> None:
    """Each results row's BLEU (lowercased beside it), chrF and AER: mean ± sd of its variant in the
    report of the study the row links, as `report.json` holds them."""
    for row, folder, variant in readme_results():
        report = json.loads((folder / "report.json").read_text("utf-8"))
        figures = report["variants"][variant]
        bleu, chrf, aer = (
            spread(figures[key], d) for key, d in (("bleu", 2), ("chrf", 2), ("aer", 4))
        )
        lowercased = f"{figures['bleu_lowercase']['mean']:.2f}"
        # A row may add a note after the lowercased figure ("; seeds 1-2" while the rest train).
        assert row[2].strip().startswith(f"**{bleu}** (lc {lowercased}"), row[1]
        assert (row[3].strip(), row[4].strip()) == (chrf, aer), row[1]


def readme_results() -> list[tuple[list[str], Path, str]]:
    """README's results rows that link a study report: each row's cells, the study folder, and the
    row's variant there (`README_VARIANTS`, which must name every such row)."""
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    rows = [line.split("|") for line in lines if line.startswith("| ") and "/report.md)" in line]
    assert sorted(row[1].strip() for row in rows) == sorted(README_VARIANTS)
    return [
        (
            row,
            ROOT / re.search(r"\]\(([^)]+)/report\.md\)", row[-2])[1],
            README_VARIANTS[row[1].strip()],
        )
        for row in rows
    ]


def spread(figure: dict, digits: int) -> str:
    """A report.json figure as the README prints it: mean ± sd."""
    return f"{figure['mean']:.{digits}f} ± {figure['sd']:.{digits}f}"


def test_each_committed_study_states_its_recipe() -> None:
    """The recipe's defaults follow the model and change with the code (seq2seq.recipes: the GRU's
    changed in 0.3.0 and 0.4.0); a committed study's runs must train again as they did, so every
    variant of every committed spec gives each recipe setting of its model kind as a flag, in its
    own flags or the common ones."""
    for path in sorted(ROOT.glob("docs/study*/study.json")):
        spec = json.loads(path.read_text("utf-8"))
        for name, flags in spec["variants"].items():
            words = [*spec.get("flags", []), *flags]
            kind = parse_args(words).model
            given = {word for word in words if word.startswith("--")}
            needed = [as_flag(f) for f in per_model_fields(TrainConfig) if kind in RECIPE[f]]
            missing = [flag for flag in needed if flag not in given]
            assert not missing, f"{path.parent.name}, variant {name}: no {', '.join(missing)}"


def layout_page_lines() -> list[str]:
    return (ROOT / "docs" / "guides" / "layout.md").read_text("utf-8").splitlines()


def layout_page() -> str:
    return " ".join(" ".join(layout_page_lines()).split())


def test_layout_names_every_study_folder() -> None:
    """docs/guides/layout.md's `docs/` row names each study folder (`study-hidden/`): each folder
    of docs/ with a study.json."""
    folders = {path.parent.name for path in ROOT.glob("docs/study*/study.json")}
    assert folders, "no study folders"
    page = layout_page()
    assert sorted(f for f in folders if f"`{f}/`" not in page) == [], (
        "study folders layout.md omits"
    )


def test_layout_names_every_import_contract() -> None:
    """The contracts docs/guides/layout.md lists are pyproject.toml's, each by its name, and as
    many as it says."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["importlinter"]
    names = [contract["name"] for contract in config["contracts"]]
    page = layout_page()
    assert [name for name in names if f'"{name}"' not in page] == [], "contracts layout.md omits"
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
    assert f"holds {words[len(names)]} import-linter contracts" in page


def test_layout_lists_the_settings_that_follow_the_model() -> None:
    """The flags docs/guides/layout.md (seq2seq/recipes.py's row) and recipes.py's docstring say
    follow `--model` are the settings `option(per_model=RECIPE[...])` declares, and RECIPE's."""
    import seq2seq.recipes

    settings = {as_flag(name) for name in per_model_fields(TrainConfig)}
    assert settings == {as_flag(name) for name in RECIPE}
    row = re.search(r"the defaults that follow `--model` \((.*?)\)", layout_page())[1]
    assert set(re.findall(r"`(--[\w-]+)`", row)) == settings, "layout.md"
    doc = " ".join(seq2seq.recipes.__doc__.split())
    listed = re.search(r"A flag of a recipe setting \((.*?)\)", doc)[1]
    assert set(re.findall(r"`(--[\w-]+)`", listed)) == settings, "seq2seq/recipes.py"


def test_layout_says_what_the_data_layer_needs_of_the_models() -> None:
    """docs/guides/layout.md's `seq2seq/data/` row says the data layer needs nothing of
    seq2seq.models (below it, so allowed) exactly when no data module imports one."""
    found = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "seq2seq" / "data").glob("*.py")
        if any(module.startswith("seq2seq.models") for module in imported(path))
    ]
    row = next(line for line in layout_page_lines() if line.startswith("| `seq2seq/data/` |"))
    may_import = row.strip("|").split("|")[-1]
    assert ("needs nothing there" in may_import) == (not found), (may_import, found)


def imported(path: Path) -> set[str]:
    """The modules a Python file imports (`from a.b import c` gives a.b and a.b.c)."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_the_models_docstring_names_the_basics_they_import() -> None:
    """seq2seq/models/__init__.py's "May import" names exactly the top-level basics the modules of
    seq2seq/models/ (kernels included) import."""
    import seq2seq.models

    basics = {p.stem for p in (ROOT / "seq2seq").glob("*.py")} - {"__init__", "__main__"}
    used = {
        module.split(".")[1]
        for path in (ROOT / "seq2seq" / "models").rglob("*.py")
        for module in imported(path)
        if module.startswith("seq2seq.") and module.split(".")[1] in basics
    }
    may = " ".join(seq2seq.models.__doc__.split()).split("May import:")[1]
    named = set(re.findall(r"seq2seq\.(\w+)", may))
    assert named == used, f"the docstring names {sorted(named)}, the models import {sorted(used)}"


def shared_checkpoint_seeds(page: Path) -> set[str]:
    """The seeds a page gives the shared checkpoint: "seed N" later in the clause that names it."""
    text = " ".join(page.read_text("utf-8").split())
    return set(re.findall(r"shared checkpoint(?:(?!\. |;).){0,200}?\bseed,? (\d+)", text))


def test_pages_give_the_shared_checkpoint_one_seed() -> None:
    """The README, study.md and benchmarks.md each say which seed trained the shared checkpoint
    (`../shared/models/README.md`: seed 0), and say the same."""
    pages = [
        ROOT / "README.md",
        *(ROOT / "docs" / "results" / n for n in ("study.md", "benchmarks.md")),
    ]
    seeds = {str(page.relative_to(ROOT)): shared_checkpoint_seeds(page) for page in pages}
    assert all(seeds.values()), f"a page gives no seed: {seeds}"
    assert len(set.union(*seeds.values())) == 1, seeds


def test_readme_corpus_order_is_the_code() -> None:
    """The README's Quick start lists the folders a corpus is looked for in, in
    seq2seq.data.corpus's order, and says the hub, tried last, needs the network."""
    from seq2seq.data import corpus

    text = " ".join((ROOT / "README.md").read_text("utf-8").split())
    sentence = re.search(r"The corpus is read offline from (.*?); the first run", text)[1]
    folders, _, hub = sentence.partition(" else ")
    expected = [
        f"${corpus.DATA_ENV}/multi30k/",
        f"{corpus.LOCAL_DATA.as_posix()}/multi30k/",
        f"{corpus.SHARED_DATA.as_posix()}/multi30k/",
    ]
    assert re.findall(r"`([^`]+)`", folders) == expected
    assert "Hugging Face hub" in hub and "network" in hub and "hub" not in folders


RECIPE_LABEL = re.compile(r"(?<![\d.])0\.[234](?:\.0)?(?!\d)")


def test_readme_says_what_the_recipe_labels_are_before_using_them() -> None:
    """The README's first paragraph that names a release's recipe ("0.2", "0.3", 0.4.0) says what
    each of them is."""
    paragraphs = re.split(r"\n\s*\n", (ROOT / "README.md").read_text("utf-8"))
    first = next(p for p in paragraphs if RECIPE_LABEL.search(p))
    first = " ".join(first.split())
    assert '"0.3" is' in first and '"0.2" the recipe before the search' in first
    assert "the defaults since 0.4.0" in first


def test_benchmarks_name_code_where_it_is() -> None:
    """docs/results/benchmarks.md names code at today's paths (its opening paragraph maps the old
    names, and commands are quoted as they were run): in its sections' prose, a `path.py`
    followed by a `name` defines that name; a `Class.attr` is a class of the package with that
    attribute in its file; a `module.Name` is defined in a module of that name; and a snake_case
    `name` is the package's (defined, or a key it writes) or torch's."""
    page = ROOT / "docs" / "results" / "benchmarks.md"
    prose, fenced = [], False
    for line in page.read_text("utf-8").split("\n## ", 1)[1].splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced:
            prose.append(line)
    text = " ".join(" ".join(prose).split())
    sources = {p: p.read_text("utf-8") for p in sorted((ROOT / "seq2seq").rglob("*.py"))}

    def defines(source: str, name: str) -> bool:
        return bool(
            re.search(rf"^\s*(?:(?:async )?def|class) {name}\b|^\s*{name}\s*[:=]", source, re.M)
        )

    wrong = []
    for path, name in re.findall(r"`([\w/]+\.py)`:? \(?`(\w+)`", text):
        if not defines((ROOT / path).read_text("utf-8"), name):
            wrong.append(f"{path} {name}")
    for cls, attr in re.findall(r"`([A-Z]\w*)\.(\w+)`", text):
        files = [source for source in sources.values() if defines(source, cls)]
        if not any(defines(source, attr) for source in files):
            wrong.append(f"{cls}.{attr}")
    for module, name in re.findall(r"`([a-z]\w*)\.([A-Z]\w*)`", text):
        files = [source for path, source in sources.items() if path.stem == module]
        if module not in ("nn", "torch") and not any(defines(s, name) for s in files):
            wrong.append(f"{module}.{name}")
    for name in re.findall(r"`(_?[a-z][a-z0-9]*(?:_[a-z0-9]+)+)`", text):
        if all(len(part) == 1 for part in name.strip("_").split("_")):  # a symbol: w_v, s_t
            continue
        ours = any(defines(s, name) or f'"{name}"' in s for s in sources.values())
        if not ours and not hasattr(torch, name) and not hasattr(torch.Tensor, name):
            wrong.append(name)
    assert wrong == [], f"benchmarks.md names code that is not where it says: {sorted(set(wrong))}"


def test_markdown_files_the_code_names_exist() -> None:
    """A Markdown file a module, script or tool names by its bare name ("see DESIGN.md") is one of
    this repository's (the design notes beside a checkout are not, so code cites the pages here)."""
    pages = {Path(path).name for path in tracked("*.md")}
    missing = sorted(
        f"{source.relative_to(ROOT)}: {name}"
        for source in [
            *sorted(ROOT.glob("seq2seq/**/*.py")),
            *sorted(ROOT.glob("scripts/*.py")),
            *TOOLS,
        ]
        for name in re.findall(r"(?<![\w/.-])([\w-]+\.md)\b", source.read_text("utf-8"))
        if name not in pages
    )
    assert missing == [], f"Markdown files named in code that are not in the repository: {missing}"


def test_the_cgru_seed_figures_are_its_committed_result() -> None:
    """study.md's and alignments.md's figures of `cgru`'s scored seeds are those runs' result.json
    rounded, `bahdanau`'s beside them the emb512 study's, and the README's its report's."""
    study = " ".join((ROOT / "docs" / "results" / "study.md").read_text("utf-8").split())
    guide = " ".join((ROOT / "docs" / "guides" / "alignments.md").read_text("utf-8").split())
    runs = sorted((ROOT / "docs/study-cgru-de-en/runs").glob("cgru-seed*/result.json"))
    seeds = [json.loads(path.read_text("utf-8")) for path in runs]
    assert [seed["seed"] for seed in seeds] == list(range(1, len(seeds) + 1)) and len(seeds) >= 2
    for seed in seeds:
        val = seed["val_bleu"][seed["checkpoint_rule"]]
        assert f"scored {val:.2f} validation BLEU" in study
        assert (
            f"on test BLEU {seed['bleu']:.2f}, chrF {seed['chrf']:.2f}, AER {seed['aer']:.4f}"
            in study
        )
        assert (
            f"`train_hours`, {seed['train_hours']:.2f}, count {len(seed['trained'])} sittings"
            in study
        )
    bahdanau = report_of("docs/study-recipe-emb512-de-en")["gru-emb512"]
    aers = " and ".join(f"{seed['aer']:.4f}" for seed in seeds)
    bleus = " and ".join(f"{seed['bleu']:.2f}" for seed in seeds)
    assert (
        f"reference scores AER {aers} against the silver standard, where `bahdanau`'s three seeds "
        f"score {bahdanau['aer']['mean']:.4f} ± {bahdanau['aer']['sd']:.4f}, at test BLEU {bleus} "
        f"against their {bahdanau['bleu']['mean']:.2f} ± {bahdanau['bleu']['sd']:.2f}"
    ) in guide
    # The README's line: the seeds' AER against bahdanau's same seeds, and the report's test over
    # them all (the `all` row: cgru is its baseline, so its lead is minus the delta).
    readme = " ".join((ROOT / "README.md").read_text("utf-8").split())
    others = [
        json.loads(
            (
                ROOT / f"docs/study-recipe-emb512-de-en/runs/gru-emb512-seed{s['seed']}/result.json"
            ).read_text("utf-8")
        )
        for s in seeds
    ]
    rows = json.loads((ROOT / "docs/study-cgru-de-en/report.json").read_text("utf-8"))
    [pooled] = [row for row in rows["significance"] if row["seeds"] == "all"]
    assert (
        f"on seeds 1-{len(seeds)} of the default recipe AER {aers} against "
        + " and ".join(f"{o['aer']:.4f}" for o in others)
        + f", BLEU +{-pooled['delta']:.2f} over both (bootstrap p {pooled['p_bs']:.4f}; over the "
        f"seeds, Welch p {pooled['p_welch']:.2f}"
    ) in readme


@pytest.mark.parametrize("run", ["default-seed1", "cgru-seed2"])
def test_a_readings_table_in_the_guide_is_its_committed_report(run: str) -> None:
    """alignments.md's table of a checkpoint's readings is that run's readings.md, row for row
    (the foresight row's intersect cells set in bold there)."""
    guide = (ROOT / "docs/guides/alignments.md").read_text("utf-8").replace("**", "")
    table = (ROOT / "docs/readings" / run / "readings.md").read_text("utf-8")
    assert table in guide
