"""The Translator API (alignments as data, n-best, long inputs), translate.py's output, val/aer."""

import json
from itertools import accumulate
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor

from seq2seq.alignment.words import alignment_error_rate, format_pharaoh, read_pharaoh
from seq2seq.commands import translate
from seq2seq.data.batching import collate
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.words import word_spans_in_text
from seq2seq.decoding.search import SearchConfig
from seq2seq.decoding.translator import Translator, word_alignment
from seq2seq.models.build import build_model, model_args_from
from seq2seq.training.callbacks import AlignmentErrorRate
from seq2seq.training.config import TrainConfig
from seq2seq.training.system import TranslationSystem
from tests.conftest import LEXICON, write_corpus

MAX_LEN = 40  # the tiny Transformer's position table: long lines must be cut to it
NBEST = {"beam": 3, "nbest": 3, "length_penalty": 0.0}  # ranked by score alone
TRICKY = ["Ein kleiner  hund", "\u200b der (mann) ☃ spielt ﬁsh", "x \x01 y", "ＡＢ\u00a0c▁d"]


@pytest.fixture(scope="module")
def checkpoint(tiny_tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained two-head Transformer with MAX_LEN positions, saved as a checkpoint."""
    torch.manual_seed(0)
    args = {"model": "transformer", "vocab_size": tiny_tokenizer.vocab_size, "d_model": 16,
            "heads": 2, "layers": 1, "ff_size": 32, "dropout": 0.0, "max_len": MAX_LEN}  # fmt: skip
    weights = {f"model.{k}": v for k, v in build_model(args).state_dict().items()}
    path = tmp_path_factory.mktemp("transformer") / "tiny.ckpt"
    saved = {"model_args": args, "state_dict": weights, "tokenizer": tiny_tokenizer.to_bytes()}
    torch.save(saved, path)
    return path


def forced(translator: Translator, src: list[int], tgt: list[int]) -> tuple[Tensor, float]:
    """The model's own teacher-forced attention (T, N, S) and log p(tgt | src), EOS included."""
    batch = collate([{"src_ids": src, "tgt_ids": tgt, "index": 0}])
    inputs = [batch[key] for key in ("src", "src_lens", "src_mask", "tgt_in")]
    with torch.no_grad():
        logits, weights = translator.model(*inputs)
    log_probs = logits.log_softmax(-1).gather(2, batch["tgt_out"].unsqueeze(2))
    return weights[0], float(log_probs.sum())


def test_word_alignment_by_hand() -> None:
    source, target = "Ein kleiner  Hund", "A small dog"
    src_spans = [(0, 3), (3, 9), (9, 11), (11, 13), (13, 17)]  # ▁Ein ▁klein er ▁ Hund
    tgt_spans = [(0, 1), (1, 7), (7, 10), (10, 11)]  # ▁A ▁small ▁do g
    weights = torch.tensor([[0.6, 0.1, 0.1, 0.0, 0.0, 0.2],  # ▁A; the last column is EOS
                            [0.0, 0.3, 0.4, 0.0, 0.1, 0.2],  # ▁small
                            [0.1, 0.0, 0.0, 0.2, 0.3, 0.4],  # ▁do
                            [0.0, 0.1, 0.1, 0.0, 0.7, 0.1],  # g
                            [0.0, 0.0, 0.0, 0.0, 0.1, 0.9]])  # </s>  # fmt: skip
    assert word_spans_in_text(source, src_spans) == [0, 1, 1, 2, 2]  # the lone ▁ joins "Hund"
    # Source columns add up, target rows average, EOS is dropped: 'dog' = mean(▁do, g).
    expected = torch.tensor([[0.6, 0.2, 0.0], [0.0, 0.7, 0.1], [0.05, 0.1, 0.6]])
    heads = torch.stack([weights + 0.05, weights - 0.05], 1)  # (T, N, S) whose mean is `weights`
    for attention in (weights, heads):
        words, links = word_alignment(attention, source, src_spans, target, tgt_spans)
        torch.testing.assert_close(words, expected)
        assert links == [(0, 0), (1, 1), (2, 2)]
    # Source words' best target words: Ein -> A, kleiner -> small, Hund -> dog; a cut-off target
    # word (no spans) is a zero row, so it links nowhere.
    cut = (weights[[0, 1, 4]], source, src_spans, target, tgt_spans[:2], "src2tgt")
    words, links = word_alignment(*cut)
    assert words.shape == (3, 3) and (words[2] == 0).all() and links == [(0, 0), (1, 1), (2, 1)]


def test_words_are_the_raw_whitespace_tokens(checkpoint: Path) -> None:
    translator = Translator.load(checkpoint)
    for sentence in TRICKY:  # normalisation adds (U+200B), drops (\x01) and changes characters
        ids, spans = translator.tokenizer.encode_with_spans(sentence)
        words = sentence.split()
        for word, (start, end) in zip(word_spans_in_text(sentence, spans), spans, strict=True):
            assert sentence[start:end].strip() in words[word]  # each subword inside its word
    sources, targets = [*TRICKY[:2], "Zwei alte frauen"], [*TRICKY[2:], "Two old women sit"]
    found = translator.align(sources, targets)
    for result, source, target in zip(found, sources, targets, strict=True):
        assert result.word_attention.shape == (len(target.split()), len(source.split()))
        assert result.src_words == source.split() and result.tgt_words == target.split()
        weights, score = forced(translator, *translator.tokenizer.encode_batch([source, target]))
        torch.testing.assert_close(result.attention, weights)  # the model's reading of target
        assert result.text == target and result.score == pytest.approx(score, abs=1e-4)


def test_translations_carry_the_attention_of_the_chosen_hypotheses(checkpoint: Path) -> None:
    translator = Translator.load(checkpoint)
    sentences = ["Ein hund läuft im park", "", TRICKY[1]]
    results = translator.translate(sentences, return_alignments=True, **NBEST)
    assert results[1].text == "" and results[1].word_alignment == [] and not results[1].nbest
    for sentence, best in zip(sentences[::2], results[::2], strict=True):
        src_ids = translator.tokenizer.encode(sentence)
        scores = [hyp.score for hyp in best.nbest]
        assert (best.text, best.score) == (best.nbest[0].text, scores[0])
        assert len({tuple(hyp.tgt_tokens) for hyp in best.nbest}) == 3  # 3 distinct hypotheses
        assert scores == sorted(scores, reverse=True)  # length penalty 0: ranked by score ...
        found = translator.search([src_ids], SearchConfig(**NBEST))
        for hyp, hyp_ids in zip(best.nbest, found[0].tokens, strict=True):
            # ... each with the attention and the score that the model gives it
            assert hyp.tgt_tokens == [*translator.tokenizer.pieces(hyp_ids), "</s>"]
            weights, score = forced(translator, src_ids, hyp_ids)
            torch.testing.assert_close(hyp.attention, weights, atol=1e-5, rtol=1e-4)
            assert hyp.score == pytest.approx(score, abs=1e-3)
            assert hyp.word_attention.shape == (len(hyp.text.split()), len(sentence.split()))
            assert len({t for _, t in hyp.word_alignment}) == len(hyp.word_alignment)  # tgt2src
        as_json = json.loads(json.dumps(best.to_dict()))["nbest"][2]["word_alignment"]
        assert as_json == [list(link) for link in best.nbest[2].word_alignment]


def test_one_str_is_refused_where_a_list_of_sentences_is_asked_for(checkpoint: Path) -> None:
    translator = Translator.load(checkpoint)
    # A str is iterable: it was translated as one sentence per character.
    with pytest.raises(
        TypeError, match=r"^`sentences` is a list of sentences: give \['ein Hund'\]"
    ):
        translator.translate("ein Hund")
    with pytest.raises(TypeError, match=r"^`targets` is a list of sentences"):
        translator.align(["ein Hund"], "a dog")
    assert [r.text for r in translator.translate(("ein Hund",))] == [
        r.text for r in translator.translate(["ein Hund"])
    ]  # any sequence of str is a list of sentences


def test_translate_writes_nbest_and_alignments(checkpoint: Path, tmp_path: Path, capsys) -> None:
    lines = ["Ein hund läuft", "", "Der mann sieht ein kind"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    args = f"{checkpoint} --input {tmp_path / 'in.txt'} --beam 3 --length-penalty 0".split()
    api = Translator.load(checkpoint).translate(lines, return_alignments=True, **NBEST)
    assert translate.main([*args, "--nbest", "3", "--alignments", "hard"]) == 0
    out = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    assert [int(fields[0]) for fields in out] == [0, 0, 0, 1, 2, 2, 2]  # a blank line: one line
    hyps = [*api[0].nbest, api[1], *api[2].nbest]
    for (_, text, score, links), hyp in zip(out, hyps, strict=True):
        assert (text, links) == (hyp.text, format_pharaoh(hyp.word_alignment))
        assert float(score) == pytest.approx(hyp.score, abs=1e-4)
    assert translate.main([*args, "--alignments", "soft"]) == 0
    objects = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [o["line"] for o in objects] == [0, 1, 2] and objects[1]["text"] == ""
    for found, expected in zip(objects, api, strict=True):
        assert found["word_alignment"] == [list(link) for link in expected.word_alignment]
        assert len(found["attention"]) == len(found["tgt_tokens"])  # (T, S), heads averaged
        assert len(found["word_attention"]) == len(found["tgt_words"])


def test_val_aer_is_logged_when_the_corpus_has_gold_alignments(tmp_path: Path, recwarn) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    sources, targets = ((corpus / f"val.{x}").read_text().splitlines() for x in ("de", "en"))
    gold = []  # word for word, where "im" gives two English words
    for line in sources:
        ends = [0, *accumulate(len(LEXICON[word].split()) for word in line.lower().split())]
        links = [f"{i}-{j}" for i in range(len(ends) - 1) for j in range(ends[i], ends[i + 1])]
        gold.append(" ".join(links))
    (corpus / "val.align").write_text("\n".join(gold) + "\n")
    cfg = TrainConfig(data_dir=str(corpus), vocab_size=100, emb_size=16, hidden_size=32,
                      batch_tokens=400, cache_dir=str(tmp_path / "cache"))  # fmt: skip
    for given in ("gold", "wide", "none"):
        dm = TranslationDataModule(cfg)
        dm.prepare_data()
        dm.setup("fit")
        system = TranslationSystem(build_model(model_args_from(cfg, dm.vocab_size)), dm.tokenizer)
        trainer = L.Trainer(accelerator="cpu", max_steps=2, val_check_interval=2, logger=False,
                            check_val_every_n_epoch=None, limit_val_batches=1,
                            enable_checkpointing=False, enable_progress_bar=False,
                            callbacks=[AlignmentErrorRate()])  # fmt: skip
        trainer.fit(system, datamodule=dm)
        said = [str(w.message) for w in recwarn if "val/aer" in str(w.message)]
        if given != "gold":  # no file, or one made for other pairs: nothing logged
            assert not {"val/aer", "val/align_recall"} & set(trainer.callback_metrics)
        if given == "none":  # and nothing said
            assert not said
        elif given == "wide":
            assert said == [f"{corpus / 'val.align'} line 1: link 0-99 is outside the sentence "
                            f"pair ({len(sources[0].split())} source words, "
                            f"{len(targets[0].split())} target words); val/aer is off"]  # fmt: skip
            (corpus / "val.align").unlink()
            recwarn.clear()
        else:
            found = Translator(system.model, dm.tokenizer).align(sources, targets)
            score = alignment_error_rate(
                [r.word_alignment for r in found], read_pharaoh(corpus / "val.align")
            )
            assert float(trainer.callback_metrics["val/aer"]) == pytest.approx(score.aer)
            assert float(trainer.callback_metrics["val/align_recall"]) == pytest.approx(
                score.recall
            )
            (corpus / "val.align").write_text("\n".join([gold[0] + " 0-99", *gold[1:]]) + "\n")
