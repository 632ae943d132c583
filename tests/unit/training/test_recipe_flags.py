"""The recipe search's flags: word dropout, and refusals of bad values (the latest checkpoints kept
for averaging and the validation search's length penalty in a run: tests/e2e/test_recipe_flags.py)."""

import pytest
import torch

from seq2seq.data.tokenizer import BOS, EOS, PAD, UNK
from seq2seq.training.config import parse_args
from seq2seq.training.system import word_dropout


def batch_of(rows: int = 64, length: int = 30) -> dict[str, torch.Tensor]:
    ids = torch.randint(4, 100, (rows, length))  # (B, L) real subwords
    ids[:, 0], ids[:, -1], ids[:, -3:-1] = BOS, PAD, PAD  # specials at both ends
    ids[:, -4] = EOS
    return {"src": ids.clone(), "tgt_in": ids.clone(), "tgt_out": ids.clone()}


def test_word_dropout_replaces_about_p_of_the_real_subwords_by_unk_and_nothing_else():
    batch = batch_of()
    torch.manual_seed(0)
    out = word_dropout(batch, 0.25)
    real = batch["src"] > EOS  # (B, L)
    for key in ("src", "tgt_in"):
        changed = out[key] != batch[key]
        assert (out[key][changed] == UNK).all()
        assert not changed[~real].any()  # PAD, BOS and EOS stay
        assert 0.2 < changed[real].float().mean().item() < 0.3
    assert torch.equal(out["tgt_out"], batch["tgt_out"])  # the loss reads the true targets
    assert not torch.equal(out["src"] != batch["src"], out["tgt_in"] != batch["tgt_in"])
    torch.manual_seed(0)
    assert torch.equal(word_dropout(batch, 0.25)["src"], out["src"])  # the seed fixes the draws
    assert torch.equal(word_dropout(batch, 0.0)["src"], batch["src"])


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--word-dropout", "1.0", "--word-dropout must be in [0, 1)"),
        ("--keep-last", "-1", "--keep-last must be zero or more"),
        ("--val-length-penalty", "-0.5", "--val-length-penalty must be zero or more"),
    ],
)
def test_bad_recipe_flags_are_refused_by_name(flag, value, message):
    with pytest.raises(Exception, match=message.replace("[", r"\[").replace(")", r"\)")):
        parse_args([flag, value])
