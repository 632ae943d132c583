"""Guided alignment: word links to piece links, the cache's links, the loss by hand and refusals
(tiny runs whose attention follows their training links: tests/e2e/test_guided.py)."""

import contextlib
import dataclasses
import math
from pathlib import Path

import pytest
import torch

from seq2seq.alignment.words import format_pharaoh
from seq2seq.commands import silver_alignments as silver_alignments_command
from seq2seq.commands import train as train_command
from seq2seq.data import prepare as prep
from seq2seq.data.batching import collate
from seq2seq.data.datamodule import TranslationDataModule
from seq2seq.data.links import LinkedPairs, dense_reference, encode_with_links, piece_links
from seq2seq.data.shards import SplitRows
from seq2seq.data.tokenizer import EOS, Tokenizer
from seq2seq.data.words import Link, word_spans_in_text
from seq2seq.decoding.translator import Translator, word_alignment
from seq2seq.errors import UserError
from seq2seq.models.build import build_model, model_args_from
from seq2seq.models.kernels import accelerate
from seq2seq.models.kernels.compiled import CompiledRNN
from seq2seq.training.config import OptimConfig, TrainConfig, parse_args
from seq2seq.training.losses import alignment_loss, batch_loss
from tests.conftest import LEXICON, tiny_train_args, write_corpus


def lexicon_links(de: str) -> list[Link]:
    """The true word links of a pair of the tiny corpus: German word i gives the English words of
    LEXICON[word] in order ("im" -> "in the" makes two links)."""
    links, j = [], 0
    for i, word in enumerate(de.lower().split()):
        for _ in LEXICON[word].split():
            links.append((i, j))
            j += 1
    return links


def write_links(corpus: Path, name: str = "train.align", lines: list[str] | None = None) -> Path:
    """The training split's true links as a Pharaoh file beside the corpus (or `lines`)."""
    if lines is None:
        de = (corpus / "train.de").read_text("utf-8").splitlines()
        lines = [format_pharaoh(lexicon_links(s)) for s in de]
    path = corpus.parent / name
    path.write_text("".join(line + "\n" for line in lines), "utf-8")
    return path


def _cfg(corpus: Path, cache: Path, **settings: object) -> TrainConfig:
    settings = {"vocab_size": 100, "prepare_workers": 1, **settings}
    return TrainConfig(data_dir=str(corpus), cache_dir=str(cache), **settings)


def test_word_links_become_piece_links_by_hand() -> None:
    # Source "Ein kleiner Hund" as ▁Ein ▁klein er ▁Hund: words [0, 1, 1, 2].
    # Target "A small dog" as ▁A ▁small ▁do g: words [0, 1, 2, 2].
    # Word links: Ein-A (0-0), kleiner-small (1-1), Hund-dog (2-2), and Ein-dog (0-2).
    # Each target piece of a word links to every piece of each source word linked to that word:
    #   ▁A (t0): Ein -> s0;  ▁small (t1): kleiner -> s1, s2;
    #   ▁do (t2) and g (t3): Hund and Ein -> s3 and s0.
    found = piece_links([(0, 0), (1, 1), (2, 2), (0, 2)], [0, 1, 1, 2], [0, 1, 2, 2])
    assert found == [(0, 0), (0, 2), (0, 3), (1, 1), (2, 1), (3, 2), (3, 3)]
    # A piece outside every word (-1) takes no link; a word without links gives its pieces none.
    assert piece_links([(0, 0), (1, 1)], [0, -1, 1], [-1, 0]) == [(0, 1)]
    assert piece_links([], [0, 1], [0, 1]) == []


def test_encoding_links_pieces_through_their_words(tiny_tokenizer: Tokenizer) -> None:
    src, tgt = ["Ein kleiner  hund", "Zwei frau"], ["A small dog", "Two woman"]
    chunk = LinkedPairs(src, tgt, links=["0-0 1-1 2-2", "1-1"], numbers=[1, 2], path="f")
    src_lens, src_ids, tgt_lens, tgt_ids, counts, flat = encode_with_links(
        tiny_tokenizer, chunk, "uint16"
    )
    assert src_ids.tolist() == [i for s in src for i in tiny_tokenizer.encode(s)]
    assert tgt_ids.tolist() == [i for t in tgt for i in tiny_tokenizer.encode(t)]
    pairs = flat.reshape(-1, 2).tolist()  # (links, 2) source piece, target piece
    first, second = pairs[: counts[0]], pairs[counts[0] :]
    for text_src, text_tgt, links, words in zip(src, tgt, (first, second), ([(0, 0), (1, 1),
                                                (2, 2)], [(1, 1)]), strict=True):  # fmt: skip
        src_of = word_spans_in_text(text_src, tiny_tokenizer.encode_with_spans(text_src)[1])
        tgt_of = word_spans_in_text(text_tgt, tiny_tokenizer.encode_with_spans(text_tgt)[1])
        expected = [
            (s, t) for t in range(len(tgt_of)) for s in range(len(src_of))
            if (src_of[s], tgt_of[t]) in words
        ]  # fmt: skip
        assert sorted(map(tuple, links)) == sorted(expected) and expected


def test_loss_by_hand_for_both_costs() -> None:
    # One pair, T = 3 target rows (the last is EOS), S = 3 source columns (the last is EOS).
    weights = torch.tensor([[[0.5, 0.3, 0.2],  # row 0: linked to s0 and s1
                             [0.1, 0.6, 0.3],  # row 1: no link, adds nothing
                             [0.2, 0.2, 0.6]]])  # fmt: skip  # EOS row: never linked
    reference = dense_reference([[0, 0, 1, 0]], T=3, S=3)  # links (s0, t0), (s1, t0)
    assert reference.tolist() == [[[1, 1, 0], [0, 0, 0], [0, 0, 0]]]
    # ce: row 0's target is (1/2, 1/2, 0): -(0.5 log 0.5 + 0.5 log 0.3)
    ce = -(0.5 * math.log(0.5) + 0.5 * math.log(0.3))
    assert alignment_loss(weights, reference, "ce").item() == pytest.approx(ce)
    # mse: (0.5 - 0.5)^2 + (0.3 - 0.5)^2 + (0.2 - 0)^2 = 0 + 0.04 + 0.04
    assert alignment_loss(weights, reference, "mse").item() == pytest.approx(0.08)
    two = torch.cat([weights, weights.flip(1)])  # (B=2, T, S): the second pair has no links
    assert alignment_loss(two, dense_reference([[0, 0, 1, 0], []], 3, 3), "ce").item() == (
        pytest.approx(ce)
    )


def test_collate_builds_the_reference_without_eos_row_or_column() -> None:
    items = [
        {"src_ids": [5, 6], "tgt_ids": [7, 8, 9], "index": 0, "links": [1, 0, 0, 2]},
        {"src_ids": [5, 6, 7], "tgt_ids": [8], "index": 1, "links": []},
    ]
    batch = collate(items)
    ref = batch["align_ref"]  # (B, T, S): T = 3 pieces + EOS, S = 3 pieces + EOS
    assert ref.shape == (2, *batch["tgt_out"].shape[1:], batch["src"].size(1)) == (2, 4, 4)
    assert ref.nonzero().tolist() == [[0, 0, 1], [0, 2, 0]]  # (pair, target piece, source piece)
    assert batch["tgt_out"][0, 3] == EOS and batch["src"][0, 2] == EOS


def test_the_cache_keeps_links_and_its_key_names_the_file(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    corpus = write_corpus(tmp_path / "corpus", {"train": 200, "val": 20})
    # Blank pairs keep their alignment lines: line 3 belongs to a blank pair and is skipped.
    de, en = ((corpus / f"train.{x}").read_text("utf-8").splitlines() for x in ("de", "en"))
    de[2] = ""
    (corpus / "train.de").write_text("".join(s + "\n" for s in de), "utf-8")
    lines = [format_pharaoh(lexicon_links(s)) if s else "garbage" for s in de]
    path = write_links(corpus, lines=lines)
    plain = prep.prepare(_cfg(corpus, tmp_path / "cache"))
    guided = prep.prepare(_cfg(corpus, tmp_path / "cache", guided_alignment=str(path)))
    assert guided.built and guided.paths["train"] != plain.paths["train"]
    assert guided.paths["val"] == plain.paths["val"]  # only the training split has links
    rows = SplitRows(guided.paths["train"])
    assert len(rows) == 199 and "links" not in SplitRows(plain.paths["train"])[0]
    tok = guided.tokenizer
    for item in rows.__getitems__([0, 1, 2, 198]):
        raw = item["index"] + (item["index"] >= 2)  # the corpus line of the pair, from 0
        src, tgt = de[raw], en[raw]
        assert item["src_ids"] == tok.encode(src)
        src_of = word_spans_in_text(src, tok.encode_with_spans(src)[1])
        tgt_of = word_spans_in_text(tgt, tok.encode_with_spans(tgt)[1])
        links = list(zip(item["links"][::2], item["links"][1::2], strict=True))
        assert {(src_of[s], tgt_of[t]) for s, t in links} == set(lexicon_links(src))
    again = prep.prepare(_cfg(corpus, tmp_path / "cache", guided_alignment=str(path)))
    assert not again.built  # the same file: the same cache
    other = write_links(corpus, "other.align", lines)
    assert prep.prepare(_cfg(corpus, tmp_path / "cache", guided_alignment=str(other))).built


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda lines: lines[:-1],
            r"train\.align line 200: missing; the file ends after 199 lines",
        ),
        (
            lambda lines: [*lines, ""],
            r"train\.align line 201: one line too many; the training split ends at row 200",
        ),
        (lambda lines: lines[:4] + ["0-0 1:2"] + lines[5:], r"line 5: bad alignment link '1:2'"),
        (
            lambda lines: lines[:6] + ["0-0 1-9"] + lines[7:],
            r"train\.align line 7: link 1-9 is outside the sentence pair \(\d source words, \d targ",
        ),
    ],  # fmt: skip
)
def test_bad_alignment_files_are_refused_in_one_line(
    tiny_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture, change: object, message: str
) -> None:
    corpus = write_corpus(tmp_path / "corpus", {"train": 200, "val": 20})
    de = (corpus / "train.de").read_text("utf-8").splitlines()
    path = write_links(corpus, lines=change([format_pharaoh(lexicon_links(s)) for s in de]))
    args = tiny_train_args(corpus, tmp_path / "runs", "--guided-alignment", str(path))
    with contextlib.chdir(tmp_path):
        assert train_command.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: {path} line ") and len(err.splitlines()) == 1
    assert __import__("re").search(message, err), err
    assert not list(
        (tmp_path / "data" / "cache" / "encoded").glob("*train*-links-*")
    )  # nothing kept


def test_a_limited_split_reads_only_the_lines_it_needs(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus", {"train": 200, "val": 20})
    de = (corpus / "train.de").read_text("utf-8").splitlines()
    lines = [format_pharaoh(lexicon_links(s)) for s in de]
    path = write_links(corpus, lines=lines[:50] + ["not read"])  # the file goes on after pair 50
    cfg = _cfg(corpus, tmp_path / "cache", guided_alignment=str(path), limit_train_pairs=50)
    rows = SplitRows(prep.prepare(cfg).paths["train"])
    assert len(rows) == 50 and all(item["links"] for item in rows.__getitems__(list(range(50))))
    short = write_links(corpus, "short.align", lines[:49])
    with pytest.raises(UserError, match=r"short\.align line 50: missing"):
        prep.prepare(dataclasses.replace(cfg, guided_alignment=str(short)))


def test_a_refusal_from_an_encoding_worker_names_its_line(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus", {"train": 200, "val": 20})
    de = (corpus / "train.de").read_text("utf-8").splitlines()
    lines = [format_pharaoh(lexicon_links(s)) for s in de]
    path = write_links(corpus, lines=lines[:149] + ["0-0 0-"] + lines[150:])
    cfg = _cfg(corpus, tmp_path / "cache", guided_alignment=str(path), prepare_workers=2)
    with pytest.raises(UserError, match=r"train\.align line 150: bad alignment link '0-'"):
        prep.prepare(cfg, chunk_size=30)  # chunk 5 of 7, encoded by a worker process


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--guided-alignment", "missing.align"], "--guided-alignment missing.align: no such file"),
        (["--guided-alignment-weight", "-1"], "--guided-alignment-weight must be zero or more"),
        (["--alignment-layer", "3"], "--alignment-layer must be in -3..2 (--layers 3), got 3"),
        (["--alignment-heads", "4"], "--alignment-heads must be -1 (mean) or a head in 0..3"),
    ],
)
def test_bad_guided_flags_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], message: str
) -> None:
    with contextlib.chdir(tmp_path):
        assert train_command.main(flags) == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")


def test_the_transformer_aligns_with_its_chosen_layer_and_head(tiny_tokenizer: Tokenizer) -> None:
    cfg = parse_args(["--model", "transformer", "--d-model", "16", "--heads", "2", "--layers", "2",
                      "--ff-size", "32", "--alignment-layer", "0", "--alignment-heads", "1"])  # fmt: skip
    args = model_args_from(cfg, tiny_tokenizer.vocab_size)
    assert (args["alignment_layer"], args["alignment_heads"]) == (0, 1)  # kept in checkpoints
    torch.manual_seed(0)
    chosen = build_model(args).eval()
    every_head = build_model({**args, "alignment_heads": -1}).eval()
    every_head.load_state_dict(chosen.state_dict())
    last_layer = build_model({**args, "alignment_layer": -1, "alignment_heads": -1}).eval()
    last_layer.load_state_dict(chosen.state_dict())
    sources, targets = ["Ein kleiner hund läuft", "Zwei frau"], ["A small dog runs", "Two woman"]
    [mine, _] = Translator(chosen, tiny_tokenizer).align(sources, targets)
    [layer0, _] = Translator(every_head, tiny_tokenizer).align(sources, targets)
    [last, _] = Translator(last_layer, tiny_tokenizer).align(sources, targets)
    torch.testing.assert_close(mine.attention, layer0.attention)  # (T, N, S): all heads of layer 0
    assert not torch.allclose(mine.attention, last.attention)
    spans = [tiny_tokenizer.encode_with_spans(x)[1] for x in (sources[0], targets[0])]
    head1, _ = word_alignment(layer0.attention[:, 1], sources[0], spans[0], targets[0], spans[1])
    torch.testing.assert_close(mine.word_attention, head1)  # head 1 alone, not the mean
    assert not torch.allclose(mine.word_attention, layer0.word_attention)
    assert mine.to_dict()["attention"] == layer0.attention[:, 1].tolist()


def _guided_gradients_of(model: torch.nn.Module, runners: list) -> list[list[torch.Tensor]]:
    """The gradient of the alignment loss alone, run by each runner, on a two-pair batch."""
    items = [{"src_ids": [5, 6, 7, 8], "tgt_ids": [9, 10, 11], "index": 0, "links": [0, 0, 3, 2]},
             {"src_ids": [5, 6], "tgt_ids": [9, 10, 11, 12, 13], "index": 1, "links": [1, 4]}]  # fmt: skip
    batch = collate(items)
    grads = []
    for runner in runners:
        model.zero_grad()
        _, _, _, weights = batch_loss(runner, batch, 0.0)
        alignment_loss(weights, batch["align_ref"]).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    return grads


def _tiny_rnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return accelerate(build_model({"model": "rnn", "vocab_size": 20, "emb_size": 8,
                                   "hidden_size": 12, "dropout": 0.0}))  # fmt: skip


def test_compiled_decoding_trains_guidance_as_eager() -> None:
    # Chunks and buckets without inductor (as tests/unit/models/kernels/test_kernels_compiled.py does): the weights the loss reads
    # come out of the padded, chunked loop and carry their gradient back through it.
    model = _tiny_rnn()
    fast = CompiledRNN(model, chunk=2, buckets=True)
    fast._compiled["cpu"] = fast.compiled(torch.device("cpu"))._replace(
        unroll=lambda decoder, state, emb: decoder.unroll(state, emb)
    )
    grads = _guided_gradients_of(model, [model, fast])
    assert len(grads[0]) == len(grads[1]) > 0
    for eager, compiled in zip(*grads, strict=True):
        torch.testing.assert_close(compiled, eager)


def test_align_loss_is_normalised_by_the_update_s_real_target_tokens(
    tiny_corpus: Path, tmp_path: Path
) -> None:
    # Two accumulated batches make one update: train/align_loss is (a1 + a2) / (tokens1 + tokens2),
    # the translation loss's normalisation, computed here from the untrained model by hand.
    import lightning as L

    from seq2seq.training.system import TranslationSystem

    path = write_links(tiny_corpus, "norm.align")
    cfg = _cfg(tiny_corpus, tmp_path / "cache", guided_alignment=str(path), batch_tokens=300)
    dm = TranslationDataModule(cfg)
    dm.setup("fit")
    torch.manual_seed(0)
    model = build_model({"model": "rnn", "vocab_size": dm.vocab_size, "emb_size": 8,
                         "hidden_size": 12, "dropout": 0.0})  # fmt: skip
    loader = iter(dm.train_dataloader())
    sums = torch.zeros(2)  # alignment sum, tokens
    with torch.no_grad():
        for batch in (next(loader), next(loader)):
            assert batch["align_ref"][~batch["tgt_mask"]].sum() == 0  # padding rows: no links
            _, _, tokens, weights = batch_loss(model, batch, 0.0)
            sums += torch.stack([alignment_loss(weights, batch["align_ref"]), tokens.float()])
    system = TranslationSystem(
        model, dm.tokenizer, OptimConfig(guided_alignment_weight=0.5, word_dropout=0.0)
    )
    trainer = L.Trainer(max_steps=1, accumulate_grad_batches=2, logger=False, limit_val_batches=0,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)  # fmt: skip
    trainer.fit(system, datamodule=dm)
    logged = trainer.callback_metrics["train/align_loss"]
    assert logged.item() == pytest.approx((sums[0] / sums[1]).item(), rel=1e-5)


def test_silver_alignments_writes_the_training_split_for_guidance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # eflomal is optional: a stand-in aligner gives both directions; the script must align the
    # training set alone, keep blank pairs as empty lines, and symmetrize as asked.
    silver = silver_alignments_command
    src = ["ein hund", "", "zwei kleine hunde"]
    tgt = ["a dog", "two", "two small dogs"]
    for lang, lines in (("de", src), ("en", tgt)):
        (tmp_path / f"train.{lang}").write_text("".join(x + "\n" for x in lines), "utf-8")
    seen = []

    def align_both_ways(s: list[str], t: list[str]) -> tuple[list[set], list[set]]:
        seen.append((s, t))
        fwd = [{(0, 0), (1, 1)}, {(0, 0), (1, 1), (2, 2)}]
        rev = [{(0, 0)}, {(0, 0), (1, 1), (1, 2)}]
        return fwd, rev

    monkeypatch.setattr("seq2seq.alignment.silver.align_both_ways", align_both_ways)
    common = ["--split", "train", "--train-src", str(tmp_path / "train.de"),
              "--train-tgt", str(tmp_path / "train.en")]  # fmt: skip
    out = tmp_path / "both.align"
    assert silver.main([*common, "--out", str(out)]) == 0
    assert seen == [(["ein hund", "zwei kleine hunde"], ["a dog", "two small dogs"])]  # no test set
    assert out.read_text("utf-8").splitlines() == ["0-0", "", "0-0 1-1"]  # intersection
    assert silver.main([*common, "--out", str(out), "--symmetrize", "grow-diag-final-and"]) == 0
    # pair 1: 1-1 neighbours 0-0 and both its words are free: grown. Pair 3: 2-2 and 1-2 both
    # neighbour 1-1; 1-2 comes first (sorted) and takes target 2, so 2-2 (target 2 taken, but
    # source 2 free) is grown too: grow-diag needs only one free word.
    assert out.read_text("utf-8").splitlines() == ["0-0 1-1", "", "0-0 1-1 1-2 2-2"]
    with contextlib.chdir(tmp_path):
        assert silver.main(common) == 0
    assert (tmp_path / "data" / "silver" / "train.de-en.align").is_file()  # the default name
