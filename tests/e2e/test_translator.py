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


def test_from_a_terminal_each_line_is_translated_when_typed(tiny_checkpoint: Path) -> None:
    """A person typing at `seq2seq translate CKPT` is told how it goes, and gets each translation
    before typing the next line (a pipe is read in chunks of 1,000 lines)."""
    import os
    import pty
    import select
    import subprocess

    from tests.conftest import ROOT

    typed, terminal = pty.openpty()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "seq2seq", "translate", str(tiny_checkpoint),
                                "--beam", "1"], stdin=terminal, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env)  # fmt: skip
    os.close(terminal)
    try:
        os.write(typed, "ein Hund läuft\n".encode())
        ready, _, _ = select.select([process.stdout], [], [], 120)
        assert ready, "no translation came before the end of the input"
        line = process.stdout.readline().decode()
        assert process.poll() is None  # still waiting for the next line: the input has not ended
        expected = Translator.load(tiny_checkpoint).translate(["ein Hund läuft"], beam=1)[0].text
        assert line == expected + "\n"
        os.write(typed, b"\x04")  # Ctrl-D: the end of the input
        assert process.wait(timeout=60) == 0
        assert "one sentence a line, each translated when typed; Ctrl-D ends" in (
            process.stderr.read().decode()
        )
    finally:
        os.close(typed)
        if process.poll() is None:
            process.kill()
