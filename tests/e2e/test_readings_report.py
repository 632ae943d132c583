"""docs/tools/readings_report.py: every reading's AER of a checkpoint with a foresight head, each
equal to what `evaluate` gives for the same reading, direction and text read; a checkpoint without
a head or a gold file of the wrong length is one line before any translation; the own
translations' links are made as the silver standard is, with the training pairs beside them; with a
checkpoint of the other direction, its links and both joined are `evaluate --reverse`'s.

The head is fitted for 3 updates on the tiny checkpoint and the "gold" links are made up (each
word to the word at its position): the figures are not good ones, only the same ones."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from seq2seq.alignment.silver import SilverLinks
from seq2seq.alignment.words import JOINS, format_pharaoh
from seq2seq.checkpoint import corpus_of, read_checkpoint
from seq2seq.commands import foresight as foresight_command
from seq2seq.decoding.evaluate import AlignmentScoring, EvalOptions, evaluate
from seq2seq.decoding.search_config import SearchConfig
from seq2seq.decoding.translator import Translator
from seq2seq.errors import UserError
from tests.unit.decoding.test_evaluate import reversed_copy

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "readings_report", ROOT / "docs/tools/readings_report.py"
)
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)
BEAM = 2


def diagonal(sources: list[str], targets: list[str]) -> str:
    """Links i-i for each word both sides have, and the rest of the target's words as possible
    links to the source's last word: a made-up but non-trivial gold file."""
    lines = []
    for src, tgt in zip(sources, targets, strict=True):
        s, t = len(src.split()), len(tgt.split())
        sure = format_pharaoh((i, i) for i in range(min(s, t)))
        maybe = [f"{s - 1}p{j}" for j in range(min(s, t), t)]
        lines.append(" ".join([sure, *maybe]).strip())
    return "".join(line + "\n" for line in lines)


@pytest.fixture(scope="module")
def setup(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("readings")
    fs = folder / "fs.ckpt"
    argv = [str(tiny_checkpoint), "--out", str(fs), "--steps", "3", "--batch-tokens", "200"]
    assert foresight_command.main(argv) == 0
    corpus = Path(corpus_of(read_checkpoint(tiny_checkpoint))["data_dir"])  # the fixture's copy
    sources = (corpus / "test.de").read_text("utf-8").splitlines()
    references = (corpus / "test.en").read_text("utf-8").splitlines()
    own = Translator.load(fs).translate(sources, SearchConfig(beam=BEAM))
    (folder / "gold.align").write_text(diagonal(sources, references), "utf-8")
    (folder / "own.align").write_text(diagonal(sources, [t.text for t in own]), "utf-8")
    return {"folder": folder, "fs": fs, "sources": sources}


def test_each_reading_is_the_figure_evaluate_gives(setup: dict, capsys) -> None:
    folder, out = setup["folder"], setup["folder"] / "report"
    argv = [str(setup["fs"]), "--out", str(out), "--gold", str(folder / "gold.align"),
            "--hyp-align", str(folder / "own.align"), "--beam", str(BEAM)]  # fmt: skip
    assert tool.main(argv) == 0
    result = json.loads((out / "readings.json").read_text("utf-8"))
    assert len(result["readings"]) == 8 and result["head"]["steps"] == 3
    assert result["command"].endswith(" ".join(argv))
    for row in result["readings"]:
        on, gold = row["on"], folder / ("gold.align" if row["on"] == "ref" else "own.align")
        scoring = AlignmentScoring(str(gold), on, row["direction"], row["reading"])
        options = EvalOptions(search=SearchConfig(beam=BEAM), alignment=scoring)
        found = evaluate(setup["fs"], "test", options=options)
        score = found.alignment.score
        assert (row["aer"], row["precision"], row["recall"]) == (
            score.aer, score.precision, score.recall), row  # fmt: skip
        assert (out / "test.hyp").read_text("utf-8") == "".join(h + "\n" for h in found.hypotheses)
        assert result["bleu"] == found.bleu.value
    # The readings differ (the head is not the attention), so the table compares something.
    by = {(r["on"], r["reading"], r["direction"]): r["aer"] for r in result["readings"]}
    assert by["ref", "attention", "tgt2src"] != by["ref", "foresight", "tgt2src"]
    printed = capsys.readouterr().out
    table = (out / "readings.md").read_text("utf-8")
    assert printed.endswith(table) and len(table.splitlines()) == 4  # head, rule, two readings
    cell = f"{by['hyp', 'foresight', 'intersect']:.4f} (P "
    assert table.splitlines()[3].startswith("| foresight | ") and cell in table.splitlines()[3]


def test_bad_inputs_are_one_line_before_any_translation(
    setup: dict, tiny_checkpoint: Path, capsys, monkeypatch
) -> None:
    folder = setup["folder"]
    monkeypatch.setattr(Translator, "translate", lambda *a, **k: pytest.fail("translated"))
    short, a_file, out = folder / "short.align", folder / "a-file", folder / "refused"
    short.write_text("0-0\n", "utf-8")
    a_file.write_text("", "utf-8")
    wide = folder / "wide-gold.align"  # made for other references
    wide.write_text("0-99\n" * len(setup["sources"]), "utf-8")
    gold = ("--gold", str(folder / "gold.align"))
    cases = {
        (str(tiny_checkpoint), *gold, "--out", str(out)): "holds no foresight head",
        (str(setup["fs"]), "--gold", str(short), "--out", str(out)):
            f"--gold {short} has 1 lines for 20 pairs",
        (str(setup["fs"]), *gold, "--hyp-align", str(short), "--out", str(out)):
            f"--hyp-align {short} has 1 lines for 20 pairs",
        (str(setup["fs"]), "--gold", str(wide), "--out", str(out)):
            f"--gold {wide} line 1: link 0-99 is outside the sentence pair (",
        (str(setup["fs"]), *gold, "--beam", "0", "--out", str(out)): "--beam must be at least 1",
        (str(setup["fs"]), *gold, "--hyp-align", str(folder / "nope"), "--out", str(out)):
            f"--hyp-align {folder / 'nope'}: cannot read",
        (str(setup["fs"]), *gold, "--threads", "0", "--out", str(out)): "--threads 0: must be at",
        (str(setup["fs"]), *gold, "--split", "nope", "--out", str(out)): "--split nope: ",
        (str(setup["fs"]), *gold, "--reverse", str(setup["fs"]), "--out", str(out)):
            f"--reverse {setup['fs']} translates de->en, not en->de",
        (str(setup["fs"]), *gold, "--out", str(a_file / "sub")):
            f"--out {a_file / 'sub'}: cannot make the folder",
    }  # fmt: skip
    for argv, said in cases.items():
        assert tool.main(list(argv)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0] and "--src-file" not in err[0], err
        assert not out.exists()
    # Without --hyp-align, eflomal makes the own translations' links: missing, it is said first.
    monkeypatch.setitem(sys.modules, "eflomal", None)  # find_spec: None, as if not installed
    assert tool.main([str(setup["fs"]), *gold, "--out", str(out)]) == 2
    assert capsys.readouterr().err == "error: eflomal is not installed: pip install -e .[align]\n"
    assert not out.exists()
    # --gold's default is a path under the checkout's root: run from elsewhere, the line says so.
    monkeypatch.chdir(folder)
    assert tool.main([str(setup["fs"]), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --gold {tool.GOLD}: cannot read (") and err.endswith(
        "(the default, under the checkout's root: run from there)"
    )


def test_links_made_for_other_translations_are_refused(setup: dict, capsys) -> None:
    folder = setup["folder"]
    wide = folder / "wide.align"
    wide.write_text("0-99\n" * len(setup["sources"]), "utf-8")
    argv = [str(setup["fs"]), "--out", str(folder / "wide"), "--gold", str(folder / "gold.align"),
            "--hyp-align", str(wide), "--beam", str(BEAM)]  # fmt: skip
    assert tool.main(argv) == 2
    assert (
        f"--hyp-align {wide} line 1: link 0-99 is outside the sentence" in capsys.readouterr().err
    )
    assert not (folder / "wide").exists()  # nor its translations: the folder it made is gone


def test_a_report_that_fails_after_translating_writes_nothing(
    setup: dict, capsys, monkeypatch
) -> None:
    """eflomal failing on the own translations (after minutes of translating) leaves a folder
    from before as it was: the report's files are written together, last."""
    folder = setup["folder"]

    def failing(*args):
        raise UserError("eflomal could not run its binary: pip install -e .[align]")

    monkeypatch.setattr(tool, "silver_alignments", failing)
    monkeypatch.setattr(tool, "require_eflomal", lambda: None)  # installed, but its binary fails
    kept = folder / "kept"
    kept.mkdir()
    (kept / "test.hyp").write_text("before\n", "utf-8")
    argv = [str(setup["fs"]), "--out", str(kept), "--gold", str(folder / "gold.align")]
    assert tool.main([*argv, "--beam", str(BEAM)]) == 2
    assert "eflomal could not run its binary" in capsys.readouterr().err
    assert [p.name for p in kept.iterdir()] == ["test.hyp"]
    assert (kept / "test.hyp").read_text("utf-8") == "before\n"
    assert tool.main([*argv, "--out", str(folder / "new"), "--beam", str(BEAM)]) == 2
    assert not (folder / "new").exists()


def test_own_translations_are_aligned_with_the_training_pairs_beside_them(
    setup: dict, monkeypatch
) -> None:
    """Without --hyp-align, eflomal (here a stand-in that records what it was given) aligns the
    (source, own translation) pairs with the corpus's training pairs as extra, as the silver
    standard was made; its links are written and scored."""
    folder, seen = setup["folder"], {}

    def silver(src, tgt, extra, *rest):
        seen["src"], seen["tgt"] = Path(src).read_text("utf-8"), Path(tgt).read_text("utf-8")
        seen["extra"] = [Path(path).read_text("utf-8") for path in extra]
        lines = (folder / "own.align").read_text("utf-8").splitlines()
        return SilverLinks(tuple(lines), len(seen["extra"][0].splitlines()), 0.0)

    monkeypatch.setattr(tool, "silver_alignments", silver)
    monkeypatch.setattr(tool, "require_eflomal", lambda: None)  # the stand-in needs no eflomal
    out = folder / "made"
    argv = [str(setup["fs"]), "--out", str(out), "--gold", str(folder / "gold.align"),
            "--beam", str(BEAM)]  # fmt: skip
    assert tool.main(argv) == 0
    corpus = Path(json.loads((out / "readings.json").read_text())["data"].split()[0])
    assert seen["src"] == "".join(s + "\n" for s in setup["sources"])
    assert seen["tgt"] == (out / "test.hyp").read_text("utf-8")
    assert seen["extra"] == [(corpus / f"train.{lang}").read_text("utf-8") for lang in ("de", "en")]
    assert (out / "test.hyp.align").read_text("utf-8") == (folder / "own.align").read_text("utf-8")
    made = json.loads((out / "readings.json").read_text())["readings"]
    given = json.loads((folder / "report" / "readings.json").read_text())["readings"]
    assert made == given  # the same links scored the same


def test_with_the_other_direction_its_links_and_both_joined_are_evaluates(setup: dict) -> None:
    """The same GRU labelled en->de (the vocabulary is joint), head included, as the reverse model:
    each reading, its reverse and its four joins, each direction, each text, as `evaluate
    --reverse` scores them."""
    folder = setup["folder"]
    (folder / "rev").mkdir(exist_ok=True)
    reverse = reversed_copy(setup["fs"], folder / "rev")
    out = folder / "joined"
    argv = [str(setup["fs"]), "--out", str(out), "--gold", str(folder / "gold.align"),
            "--hyp-align", str(folder / "own.align"), "--beam", str(BEAM),
            "--reverse", str(reverse)]  # fmt: skip
    assert tool.main(argv) == 0
    result = json.loads((out / "readings.json").read_text("utf-8"))
    labels = ["attention", "reverse:attention", *(f"joined:{m}" for m in JOINS)]
    labels += ["foresight", "reverse:foresight", *(f"joined:{m}:foresight" for m in JOINS)]
    assert list(dict.fromkeys(r["reading"] for r in result["readings"])) == labels
    assert len(result["readings"]) == len(labels) * 4 and result["reverse"] == str(reverse)
    for on in ("ref", "hyp"):
        for reading in ("attention", "foresight"):
            for direction in ("tgt2src", "intersect"):
                gold = folder / ("gold.align" if on == "ref" else "own.align")
                scoring = AlignmentScoring(str(gold), on, direction, reading, str(reverse))
                options = EvalOptions(search=SearchConfig(beam=BEAM), alignment=scoring)
                for found in evaluate(setup["fs"], "test", options=options).readings:
                    (row,) = [r for r in result["readings"]
                              if (r["on"], r["reading"], r["direction"]) == (on, found.reading, direction)]  # fmt: skip
                    score = found.score
                    assert (row["aer"], row["precision"], row["recall"]) == (
                        score.aer, score.precision, score.recall), row  # fmt: skip
    table = (out / "readings.md").read_text("utf-8").splitlines()
    assert [line.split(" | ")[0] for line in table[2:]] == [f"| {label}" for label in labels]
