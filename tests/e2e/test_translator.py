"""translate.py on empty, long and broken lines, its attention plotted (four heatmaps); the rest of
the Translator API is tests/unit/decoding/test_translator.py's."""

import io
import sys
from pathlib import Path

import pytest
import torch

import seq2seq.alignment.plotting
from seq2seq.commands import translate
from seq2seq.decoding.translator import Translator, TruncatedInput
from tests.conftest import LEXICON
from tests.unit.decoding.test_translator import (
    MAX_LEN,
    checkpoint,  # noqa: F401 (a fixture, used by name)
)


# slow: four heatmaps, one of them 40 x 40 subwords, three panels
def test_translate_keeps_lines_cuts_long_ones_and_plots_the_apis_attention(
    checkpoint: Path,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys,
) -> None:
    drawn, draw = [], seq2seq.alignment.plotting.alignment_figure
    monkeypatch.setattr(
        seq2seq.alignment.plotting,
        "alignment_figure",
        lambda w, *a, **k: drawn.append(w) or draw(w, *a, **k),
    )
    long = " ".join(list(LEXICON)[:30])
    lines = ["Ein hund läuft", "", long, "Ein \ufffd kind", "  ", "Der mann sieht ein kind"]
    raw = "\n".join(lines).encode().replace("\ufffd".encode(), b"\xff") + b"\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
    assert translate.main(f"{checkpoint} --beam 3 --plot-dir {tmp_path}".split()) == 0
    out, err = capsys.readouterr()
    assert len(out.split("\n")) == 7 and out.split("\n")[1] == out.split("\n")[4] == ""
    assert "warning: line 3: the source has" in err and f"reads {MAX_LEN - 1}: cut" in err
    assert "warning: line 4: bytes that are not UTF-8" in err and "Traceback" not in err
    with pytest.warns(TruncatedInput, match="sentence 3: the source"):
        api = Translator.load(checkpoint).translate(lines, beam=3)
    plotted = [api[i].attention for i in (0, 2, 3, 5)]  # what the search chose, line by line
    assert [torch.equal(w, a) for w, a in zip(drawn, plotted, strict=True)] == [True] * 4
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [f"{n:06d}.png" for n in (1, 3, 4, 6)]
    with pytest.warns(TruncatedInput, match="sentence 1: the target"):
        [result] = Translator.load(checkpoint).align(["Ein hund"], [long])
    assert result.word_attention.shape == (len(long.split()), 2)  # cut words align to nothing
