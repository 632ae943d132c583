"""AttentionHeatmaps: the matrices it logs and what it leaves alone (the images a training run
writes: tests/e2e/test_callbacks.py)."""

from pathlib import Path

import datasets
import pytest
import torch

from seq2seq.data.tokenizer import EOS, Tokenizer
from seq2seq.models.interface import Seq2Seq
from seq2seq.models.rnn import RNNSeq2Seq
from seq2seq.training.callbacks import (
    AttentionHeatmaps,
    cpu_copy,
    probe_alignments,
    probe_foresight,
    teacher_forced_alignments,
)


def make_model(kind: str, vocab_size: int) -> Seq2Seq:
    torch.manual_seed(0)
    if kind == "rnn":
        return RNNSeq2Seq(vocab_size, emb_size=16, hidden_size=32, dropout=0.5)
    transformer = pytest.importorskip("seq2seq.models.transformer")
    return transformer.TransformerSeq2Seq(vocab_size, d_model=16, heads=2, layers=2, ff_size=32)


def val_split(corpus: Path, tokenizer: Tokenizer, n: int = 6) -> datasets.Dataset:
    """The first `n` validation pairs, tokenized like TranslationDataModule's splits."""
    src = (corpus / "val.de").read_text("utf-8").splitlines()[:n]
    tgt = (corpus / "val.en").read_text("utf-8").splitlines()[:n]
    src_ids, tgt_ids = tokenizer.encode_batch(src), tokenizer.encode_batch(tgt)
    return datasets.Dataset.from_dict(
        {
            "src_ids": src_ids,
            "tgt_ids": tgt_ids,
            "index": list(range(n)),
            "src_len": [len(s) for s in src_ids],
            "tgt_len": [len(t) for t in tgt_ids],
        }
    )


@pytest.fixture
def heatmaps(tiny_corpus: Path, tiny_tokenizer: Tokenizer) -> AttentionHeatmaps:
    callback = AttentionHeatmaps(every_n_steps=10, sentences=4)
    callback.set_probes(val_split(tiny_corpus, tiny_tokenizer), tiny_tokenizer)
    return callback


@pytest.mark.parametrize("kind", ["rnn", "transformer"])
def test_matrices_are_zero_on_padding_and_rows_sum_to_one(
    kind: str, heatmaps: AttentionHeatmaps, tiny_tokenizer: Tokenizer
) -> None:
    model, batch = make_model(kind, tiny_tokenizer.vocab_size).eval(), heatmaps.probes
    assert len(set(batch["src_lens"].tolist())) > 1  # the batch has padding to check
    weights = teacher_forced_alignments(model, batch)  # (B, T, [N,] S)
    src_mask, tgt_mask = batch["src_mask"], batch["tgt_mask"]  # (B, S), (B, T)
    if weights.dim() == 4:
        weights = weights.transpose(1, 2)  # (B, N, T, S): heads first, so masks broadcast alike
        src_mask, tgt_mask = src_mask[:, None], tgt_mask[:, None]
    assert (weights.masked_select(~src_mask[..., None, :]) == 0).all()
    real_rows = weights.sum(-1).masked_select(tgt_mask)  # rows at real target positions
    torch.testing.assert_close(real_rows, torch.ones_like(real_rows))
    # What gets plotted: each sentence cut to its real lengths, rows still summing to one.
    for greedy in (False, True):
        for b, (matrix, tgt_ids) in enumerate(probe_alignments(model, batch, greedy)):
            assert matrix.shape[0] == len(tgt_ids) and matrix.shape[-1] == batch["src_lens"][b]
            torch.testing.assert_close(matrix.sum(-1), torch.ones(matrix.shape[:-1]))


def test_images_leave_the_model_its_mode_and_the_rng_untouched(
    heatmaps: AttentionHeatmaps, tiny_tokenizer: Tokenizer
) -> None:
    model = make_model("rnn", tiny_tokenizer.vocab_size).train()  # dropout 0.5
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    first = heatmaps.images(model, greedy=False)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(m.training for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # Same pictures twice although the model is in train mode: the copy ran without dropout.
    second = heatmaps.images(model, greedy=False)
    assert all((a == b).all() for (_, a), (_, b) in zip(first, second, strict=True))
    assert [tag for tag, _ in first] == [f"align/{i}" for i in range(4)]
    greedy = heatmaps.images(model, greedy=True)
    assert [tag for tag, _ in greedy] == [f"align/{i}/greedy" for i in range(4)]
    again = heatmaps.images(model, greedy=True)  # same hypotheses: the figures are only redrawn
    assert all((a == b).all() for (_, a), (_, b) in zip(greedy, again, strict=True))
    assert all(image.shape[1] >= 200 and image.shape[2] == 3 for _, image in first + greedy)


def test_a_foresight_head_reads_each_probe_as_alone_and_its_images_follow(
    heatmaps: AttentionHeatmaps, tiny_tokenizer: Tokenizer
) -> None:
    from seq2seq.data.batching import collate
    from seq2seq.models.foresight import foresight_weights, head_for, translator_states

    model = make_model("rnn", tiny_tokenizer.vocab_size).eval()
    torch.manual_seed(1)
    head = head_for(model).eval()
    probes = heatmaps.probes
    for greedy in (False, True):
        found = probe_alignments(model, probes, greedy)
        read = [ids for _, ids in found]
        with torch.no_grad():
            foreseen = probe_foresight(model, head, probes, read)
        for b, ((attention, ids), (weights, same)) in enumerate(zip(found, foreseen, strict=True)):
            assert same == ids and weights.shape == attention.shape  # (T_b, S_b) alike
            torch.testing.assert_close(weights.sum(-1), torch.ones(len(ids)))
            source = probes["src"][b, : int(probes["src_lens"][b]) - 1].tolist()
            alone = collate([{"src_ids": source, "tgt_ids": ids[:-1], "index": 0}])
            with torch.no_grad():
                expected, _ = foresight_weights(head, translator_states(model, alone))
            torch.testing.assert_close(weights, expected[0], atol=1e-6, rtol=1e-5)
    tags = [tag for tag, _ in heatmaps.images(model, greedy=True, foresight=head)]
    assert tags == [f"align/{i}/greedy" for i in range(4)] + [
        f"align/{i}/greedy/foresight" for i in range(4)
    ]


def test_cpu_copy_keeps_tied_weights_tied_and_is_in_eval_mode(tiny_tokenizer: Tokenizer) -> None:
    model = make_model("rnn", tiny_tokenizer.vocab_size).train()
    copy = cpu_copy(model)
    assert copy.generator.weight is copy.decoder.embedding.weight is copy.encoder.embedding.weight
    assert not any(m.training for m in copy.modules()) and model.training
    assert all(not p.requires_grad for p in copy.parameters())


def test_probes_are_the_first_short_validation_pairs(
    tiny_corpus: Path, tiny_tokenizer: Tokenizer
) -> None:
    callback = AttentionHeatmaps(every_n_steps=5, sentences=3)
    val = val_split(tiny_corpus, tiny_tokenizer)
    callback.set_probes(val, tiny_tokenizer)
    assert callback.probes["index"].tolist() == [0, 1, 2]  # val's order, not collate's by length
    for i in range(3):  # each row is that pair's: the image tagged align/<i> shows val pair i
        src, tgt = val[i]["src_ids"] + [EOS], val[i]["tgt_ids"] + [EOS]
        assert callback.probes["src"][i, : len(src)].tolist() == src
        assert callback.probes["tgt_out"][i, : len(tgt)].tolist() == tgt
