"""scripts/evaluate.py, translate.py and average_checkpoints.py on a tiny trained checkpoint, in-process."""

import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from seq2seq.alignment.words import format_pharaoh
from seq2seq.commands import average, evaluate, translate


@pytest.fixture
def no_corpus(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Run from an empty folder with the checkpoint's training corpus out of reach; yields the
    folder holding copies of its test split (`src.txt`, `ref.txt`)."""
    corpus = tiny_checkpoint.parents[4] / "corpus"
    shutil.copy(corpus / "test.de", tmp_path / "src.txt")
    shutil.copy(corpus / "test.en", tmp_path / "ref.txt")
    monkeypatch.chdir(tmp_path)
    hidden = corpus.rename(corpus.with_name("hidden"))
    try:
        yield tmp_path
    finally:
        hidden.rename(corpus)


def sacrebleu_cli(*args: str) -> float:
    """BLEU as the sacrebleu command prints it (`-b -w 2`) with these files and flags."""
    command = [sys.executable, "-m", "sacrebleu", *args, "-b", "-w", "2"]
    return float(subprocess.run(command, capture_output=True, text=True, check=True).stdout)


def one_line_error(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err


def test_bleu_from_the_checkpoint_alone_equals_sacrebleu_on_the_same_files(
    tiny_checkpoint: Path, no_corpus: Path, capsys: pytest.CaptureFixture
) -> None:
    args = [str(tiny_checkpoint), "--src-file", "src.txt", "--ref-file", "ref.txt", "--beam", "5"]
    assert evaluate.main([*args, "--out", "hyps.txt", "--json", "result.json"]) == 0
    out = capsys.readouterr().out
    printed = float(re.search(r"^BLEU = (\S+)", out, re.M).group(1))
    assert printed > 0  # the tiny model has learned something, so the comparison means something
    assert abs(printed - sacrebleu_cli("ref.txt", "-i", "hyps.txt")) <= 0.01
    # The lengths and brevity penalty are sacreBLEU's own, as its command prints them.
    command = [sys.executable, "-m", "sacrebleu", "ref.txt", "-i", "hyps.txt"]
    verbose = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    bp, hyp_len, ref_len = re.search(
        r"BP = (\S+) ratio = \S+ hyp_len = (\d+) ref_len = (\d+)", verbose["verbose_score"]
    ).groups()
    length = re.search(r"^length: hypotheses (\S+) of the references \((\S+) / (\S+) tokens\), "
                       r"brevity penalty (\S+)$", out, re.M).groups()  # fmt: skip
    assert length[1:] == (f"{int(hyp_len):,}", f"{int(ref_len):,}", bp)
    assert float(length[0]) == round(int(hyp_len) / int(ref_len), 3)
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in out and "chrF" in out
    assert re.search(r"^sentences: 20 .* sentences/s", out, re.M)
    result = json.loads(Path("result.json").read_text())
    assert result["sentences"] == 20 and result["beam"] == 5
    assert abs(result["bleu"] - printed) <= 0.005 and result["sentences_per_second"] > 0
    assert (result["hyp_len"], result["ref_len"]) == (int(hyp_len), int(ref_len))
    assert f"{result['brevity_penalty']:.3f}" == bp
    assert result["bleu_signature"].startswith("nrefs:1") and result["chrf_signature"]
    assert result["hypotheses"] == "hyps.txt"
    assert len(Path("hyps.txt").read_text().splitlines()) == 20
    # Two references (the second lowercased) and sacreBLEU's international tokenizer.
    Path("ref2.txt").write_text(Path("ref.txt").read_text().lower())
    more = ["--ref-file", "ref2.txt", "--sacrebleu-tokenize", "intl", "--out", "hyps2.txt"]
    assert evaluate.main([*args, *more]) == 0
    out = capsys.readouterr().out
    expected = sacrebleu_cli("ref.txt", "ref2.txt", "-i", "hyps2.txt", "-tok", "intl")
    assert float(re.search(r"^BLEU = (\S+)", out, re.M).group(1)) == expected
    assert "nrefs:2|case:mixed|eff:no|tok:intl" in out


def test_split_is_read_from_the_corpus_named_in_the_checkpoint(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    assert (
        evaluate.main([str(tiny_checkpoint), "--split", "val", "--beam", "1", "--json", "-"]) == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["sentences"] == 20 and " val " in result["data"]
    assert Path(result["hypotheses"]).parent == tiny_checkpoint.parent  # default: beside the ckpt


@pytest.mark.parametrize("damage", ["truncated", "missing", "foreign"])
def test_a_bad_checkpoint_is_refused_in_one_line(
    tiny_checkpoint: Path, no_corpus: Path, damage: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    bad = no_corpus / "bad.ckpt"
    if damage == "truncated":
        data = tiny_checkpoint.read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "foreign":
        torch.save({"state_dict": {"w": torch.zeros(2)}}, bad)
    args = ["--src-file", "src.txt", "--ref-file", "ref.txt"]
    assert evaluate.main([str(bad), *args]) == 2
    assert "bad.ckpt" in one_line_error(capsys)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Ein hund\n")))
    assert translate.main([str(bad)]) == 2
    assert "bad.ckpt" in one_line_error(capsys)


def test_bad_input_files_are_refused_in_one_line(
    tiny_checkpoint: Path, no_corpus: Path, capsys
) -> None:
    Path("short.txt").write_text("one\ntwo\n")
    Path("latin1.txt").write_bytes("ok\nGrüße\n".encode("latin-1"))
    Path("short.align").write_text("0-0\n")
    Path("wide.align").write_text("0-0\n0-99\n" + "\n" * 18)  # made for other references
    ok = "--src-file src.txt --ref-file ref.txt"
    cases = {  # flags after CKPT: what the one-line error names
        "--src-file src.txt --ref-file short.txt": "src.txt has 20 lines but short.txt has 2",
        "--src-file latin1.txt --ref-file short.txt": "latin1.txt line 2",
        "--src-file nope.txt --ref-file short.txt": "nope.txt",
        f"{ok} --ref-file nope.txt": "nope.txt",
        f"{ok} --align-ref short.align": "--align-ref short.align has 1 lines for 20 pairs",
        f"{ok} --align-ref nope.align": "nope.align",
        f"{ok} --align-ref wide.align": "--align-ref wide.align line 2: link 0-99 is outside the ",
        "--split test": "--src-file",  # the corpus is hidden
        f"{ok} --split val": "--split names a corpus split: --src-file's are read",
        # n-best lists were made and thrown away: the hypotheses file holds the best alone
        f"{ok} --beam 3 --nbest 2": "--nbest is translate's: evaluate scores the best hypothesis",
    }
    for flags, message in cases.items():
        assert evaluate.main([str(tiny_checkpoint), *flags.split()]) == 2
        assert message in one_line_error(capsys)


def test_alignment_error_rate_against_a_gold_file(
    tiny_checkpoint: Path, no_corpus: Path, capsys
) -> None:
    from seq2seq.decoding.translator import Translator

    sources, refs = (Path(name).read_text().splitlines() for name in ("src.txt", "ref.txt"))
    found = Translator.load(tiny_checkpoint).align(sources, refs)
    own = [result.word_alignment for result in found]
    # Gold: the model's own links, except: pair 0's are only possible, pair 1 has a sure link the
    # model lacks, and pair 2 is an empty line (the model's links there are all wrong).
    words = range(len(sources[1].split())), range(len(refs[1].split()))
    lacked = next((i, j) for i in words[0] for j in words[1] if (i, j) not in own[1])
    lines = [" ".join(f"{i}p{j}" for i, j in own[0]), format_pharaoh([*own[1], lacked]), ""]
    Path("gold.align").write_text("\n".join([*lines, *map(format_pharaoh, own[3:])]) + "\n")
    a = sum(map(len, own))  # |A|
    sure = a - len(own[0]) - len(own[2]) + 1  # |S|, of which the model finds all but one
    args = [str(tiny_checkpoint), "--src-file", "src.txt", "--ref-file", "ref.txt", "--json", "-"]
    assert evaluate.main([*args, "--align-ref", "gold.align"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["align_precision"] == pytest.approx((a - len(own[2])) / a)
    assert result["align_recall"] == pytest.approx((sure - 1) / sure)
    assert result["aer"] == pytest.approx(1 - (sure - 1 + a - len(own[2])) / (a + sure))
    assert re.search(r"^AER = 0\.\d{4}  precision = .* recall = ", err, re.M)
    # On its own translations, against their own links (as a silver file would be): no error.
    hyps = Translator.load(tiny_checkpoint).translate(sources, beam=5, return_alignments=True)
    Path("hyp.align").write_text("".join(format_pharaoh(h.word_alignment) + "\n" for h in hyps))
    assert evaluate.main([*args, "--align-ref", "hyp.align", "--align-on", "hyp"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["aer"], result["align_precision"], result["align_recall"]) == (0.0, 1.0, 1.0)
    # Links made for other translations point past their words: refused once the translations
    # exist (a source word past its sentence before: tested below), leaving no hypotheses file.
    Path("past.align").write_text("".join(f"0-{len(h.text.split())}\n" for h in hyps))
    flags = ["--align-ref", "past.align", "--align-on", "hyp", "--out", "hyps.txt"]
    assert evaluate.main([*args, *flags]) == 2
    n = len(hyps[0].text.split())
    said = f"--align-ref past.align line 1: link 0-{n} is outside the sentence pair ("
    assert said in one_line_error(capsys) and not Path("hyps.txt").exists()


def test_a_source_word_past_its_sentence_is_refused_before_translating(
    tiny_checkpoint: Path, no_corpus: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from seq2seq.decoding.translator import Translator

    monkeypatch.setattr(Translator, "translate", lambda *a, **k: pytest.fail("translated"))
    Path("wide.align").write_text("0-0\n" * 2 + "99-0\n" + "\n" * 17)
    args = ["--src-file", "src.txt", "--ref-file", "ref.txt", "--align-ref", "wide.align"]
    assert evaluate.main([str(tiny_checkpoint), *args, "--align-on", "hyp"]) == 2
    n = len(Path("src.txt").read_text().splitlines()[2].split())
    said = (
        f"--align-ref wide.align line 3: link 99-0 is outside the sentence pair ({n} source words)"
    )
    assert one_line_error(capsys) == f"error: {said}"


def test_averaging_two_checkpoints_gives_the_mean_of_their_weights(
    tiny_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    a = torch.load(tiny_checkpoint, weights_only=True)
    # Another point of the same run: every weight moved, tied weights (one tensor) moved together.
    moved: dict[int, torch.Tensor] = {}
    for value in a["state_dict"].values():
        if value.is_floating_point():
            moved.setdefault(value.data_ptr(), value + torch.randn_like(value))
    b = dict(a, state_dict={k: moved.get(v.data_ptr(), v) for k, v in a["state_dict"].items()})
    torch.save(b, tmp_path / "b.ckpt")
    out = tmp_path / "avg.ckpt"
    assert average.main([str(tiny_checkpoint), str(tmp_path / "b.ckpt"), "--out", str(out)]) == 0
    mean = torch.load(out, weights_only=True)
    assert mean["tokenizer"] == a["tokenizer"] and "optimizer_states" not in mean
    for name, value in a["state_dict"].items():
        torch.testing.assert_close(mean["state_dict"][name], (value + b["state_dict"][name]) / 2)
    # The tied embedding and output layer are still one tensor, written once.
    tied = mean["state_dict"]["model.generator.weight"]
    assert tied.data_ptr() == mean["state_dict"]["model.encoder.embedding.weight"].data_ptr()
    assert evaluate.main([str(out), "--src-file", str(tiny_checkpoint.parents[4] / "corpus" / "val.de"),
                          "--ref-file", str(tiny_checkpoint.parents[4] / "corpus" / "val.en"),
                          "--out", str(tmp_path / "h.txt")]) == 0  # fmt: skip
    capsys.readouterr()
    torch.save(dict(a, model_args={**a["model_args"], "emb_size": 8}), tmp_path / "c.ckpt")
    assert average.main([str(tiny_checkpoint), str(tmp_path / "c.ckpt"), "--out", str(out)]) == 2
    assert "emb_size" in one_line_error(capsys)
    # The same names and shapes, but the output layer no longer shares the embedding's tensor.
    untied = dict(a["state_dict"], **{"model.generator.weight": tied.clone()})
    torch.save(dict(a, state_dict=untied), tmp_path / "d.ckpt")
    assert average.main([str(tiny_checkpoint), str(tmp_path / "d.ckpt"), "--out", str(out)]) == 2
    assert "different parameters" in one_line_error(capsys)
    # Refused before any checkpoint is read, nothing written and the inputs as they were: a file
    # given twice (it would count twice in the mean), an --out that is an input, a folder.
    kept, b_path = tiny_checkpoint.read_bytes(), tmp_path / "b.ckpt"
    for argv, said in (
        ([tiny_checkpoint, b_path, tiny_checkpoint], f"{tiny_checkpoint} is given twice: each"),
        ([b_path, f"{tmp_path}/./b.ckpt"], f"{tmp_path}/./b.ckpt is given twice (also as {b_path})"),
        ([tiny_checkpoint, b_path, "--out", tiny_checkpoint],
         f"--out {tiny_checkpoint}: is the input {tiny_checkpoint}, which stays as it is"),
        ([tiny_checkpoint, b_path, "--out", tmp_path], f"--out {tmp_path}: a folder, not a file"),
    ):  # fmt: skip
        out.unlink(missing_ok=True)
        command = [*map(str, argv), *([] if "--out" in argv else ["--out", str(out)])]
        assert average.main(command) == 2
        assert one_line_error(capsys).startswith(f"error: {said}")
        assert tiny_checkpoint.read_bytes() == kept and not out.exists()


def test_evaluate_and_averaging_are_library_functions_with_the_commands_results(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`seq2seq.decoding.evaluate.evaluate` gives the figures `seq2seq evaluate --json` writes, and
    `average_checkpoints` the file `seq2seq average` writes: the commands parse, call and write."""
    from seq2seq.decoding.averaging import average_checkpoints
    from seq2seq.decoding.evaluate import EvalOptions
    from seq2seq.decoding.evaluate import evaluate as evaluate_checkpoint
    from seq2seq.decoding.search_config import SearchConfig

    before = sorted(tiny_checkpoint.parent.iterdir())
    called = evaluate_checkpoint(
        tiny_checkpoint, "test", options=EvalOptions(search=SearchConfig(beam=2))
    )
    assert sorted(tiny_checkpoint.parent.iterdir()) == before  # the procedure writes nothing
    argv = [str(tiny_checkpoint), "--split", "test", "--beam", "2", "--out",
            str(tmp_path / "run.hyp"), "--json", str(tmp_path / "run.json")]  # fmt: skip
    assert evaluate.main(argv) == 0
    ran = json.loads((tmp_path / "run.json").read_text())
    assert ran["bleu"] > 0  # the tiny model has learned something: the comparison means something
    figures = (called.bleu.value, called.bleu.signature, called.bleu.hyp_len, called.bleu.ref_len,
               called.chrf.value, called.chrf.signature, called.data, called.sentences)  # fmt: skip
    keys = ("bleu", "bleu_signature", "hyp_len", "ref_len", "chrf", "chrf_signature", "data",
            "sentences")  # fmt: skip
    assert figures == tuple(ran[key] for key in keys) and ran["beam"] == called.search.beam == 2
    assert list(called.hypotheses) == (tmp_path / "run.hyp").read_text().splitlines()
    copy = shutil.copy(tiny_checkpoint, tmp_path / "copy.ckpt")  # the same file twice is refused
    out = average_checkpoints([tiny_checkpoint, copy], tmp_path / "same.ckpt")
    weights = torch.load(out, weights_only=True)["state_dict"]
    saved = torch.load(tiny_checkpoint, weights_only=True)["state_dict"]
    assert all(torch.equal(weights[name], saved[name]) for name in saved)  # the mean of one run
