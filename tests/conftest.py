"""Shared fixtures, seen by tests/unit and tests/e2e alike: a synthetic German/English corpus, a
tokenizer trained on it and checkpoints of tiny models."""

import itertools
import os

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before anything imports datasets: tests never download

import random
from pathlib import Path

import pytest
import torch

from seq2seq.data.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]  # the checkout: tests/ lies in it

# Every test model is tiny: on two cores, thread hand-offs cost more than they save (and a test's
# subprocesses, DDP ranks among them, would otherwise fight its threads for the same cores).
torch.set_num_threads(1)

# A word-for-word dictionary: the mapping is learnable, and sentences differ in length (3-9 words).
LEXICON = {
    "der": "the",
    "ein": "a",
    "zwei": "two",
    "drei": "three",
    "rote": "red",
    "kleine": "small",
    "große": "big",
    "alte": "old",
    "junge": "young",
    "hund": "dog",
    "mann": "man",
    "frau": "woman",
    "kind": "child",
    "ball": "ball",
    "park": "park",
    "straße": "street",
    "wasser": "water",
    "läuft": "runs",
    "spielt": "plays",
    "sitzt": "sits",
    "springt": "jumps",
    "trägt": "carries",
    "sieht": "sees",
    "im": "in the",
    "auf": "on",
    "mit": "with",
    "und": "and",
    "über": "over",
}
SIZES = {"train": 200, "val": 20, "test": 20}


def make_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """`n` seeded random sentence pairs built from `LEXICON`."""
    rng = random.Random(seed)
    words = list(LEXICON)
    pairs = []
    for _ in range(n):
        de = [rng.choice(words) for _ in range(rng.randint(3, 9))]
        pairs.append((" ".join(de).capitalize(), " ".join(LEXICON[w] for w in de).capitalize()))
    return pairs


def write_corpus(folder: Path, sizes: dict[str, int] = SIZES, seed: int = 0) -> Path:
    """Write `<split>.de` / `<split>.en` files into `folder`; returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, (split, n) in enumerate(sizes.items()):
        pairs = make_pairs(n, seed * 100 + i)
        (folder / f"{split}.de").write_text("".join(de + "\n" for de, _ in pairs), "utf-8")
        (folder / f"{split}.en").write_text("".join(en + "\n" for _, en in pairs), "utf-8")
    return folder


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with train (200), val (20) and test (20) pairs as `<split>.de` / `<split>.en`."""
    return write_corpus(tmp_path_factory.mktemp("corpus") / "tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_corpus: Path) -> Tokenizer:
    """A joint ~100-piece sentencepiece model trained on both sides of the tiny training split."""
    texts = []
    for lang in ("de", "en"):
        texts += (tiny_corpus / f"train.{lang}").read_text("utf-8").splitlines()
    return Tokenizer.train(texts, vocab_size=100)


def tiny_train_args(corpus: Path, log_dir: Path, *extra: str) -> list[str]:
    """Flags for a seconds-long training run on the tiny corpus; the GRU's sizes only where the
    model is the GRU (train refuses a setting the Transformer does not read)."""
    transformer = "--model=transformer" in extra or any(
        pair == ("--model", "transformer") for pair in itertools.pairwise(extra)
    )
    gru_sizes = [] if transformer else ["--emb-size", "16", "--hidden-size", "32"]
    return [
        "--data-dir", str(corpus), "--vocab-size", "100", *gru_sizes,
        "--batch-tokens", "400", "--max-steps", "20", "--val-every", "10", "--log-dir", str(log_dir),
        "--accelerator", "cpu", "--devices", "1", "--heatmap-every", "0", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`last.ckpt` of a GRU trained once per session (~300 updates) on a private copy of the tiny
    corpus, `<root>/corpus`, which tests may hide to show that the checkpoint alone is enough."""
    import contextlib
    import shutil

    root = tmp_path_factory.mktemp("tiny_run")
    corpus = shutil.copytree(tiny_corpus, root / "corpus")
    args = tiny_train_args(corpus, root / "runs", "--max-steps", "300", "--max-epochs", "1000",
                           "--val-every", "150", "--lr", "1e-2", "--warmup-steps", "30",
                           "--dropout", "0", "--word-dropout", "0", "--label-smoothing", "0",
                           "--emb-size", "32",
                           "--hidden-size", "64")  # fmt: skip
    from seq2seq.commands import train

    with contextlib.chdir(root):  # the data cache goes to ./data/cache
        assert train.main(args) == 0
    return root / "runs" / "rnn-additive" / "version_0" / "checkpoints" / "last.ckpt"


# The last checkpoint format before the package moved into sub-packages (seq2seq/rnn.py,
# seq2seq/config.py, ...): `premove-gru-last.ckpt.xz`, written by the code of commit 0a17e04 (its
# `git archive` unpacked into TREE, then in an empty folder, with PYTHONPATH=TREE):
#
#     from pathlib import Path
#     from tests.conftest import load_script, tiny_train_args, write_corpus
#     corpus = write_corpus(Path("corpus"))
#     args = tiny_train_args(corpus, Path("runs"), "--max-steps", "20", "--max-epochs", "1000",
#                            "--val-every", "10", "--seed", "1", *PREMOVE_SIZES)
#     assert load_script("train").main(args) == 0
#
# and `xz -9` of its runs/rnn-additive/version_0/checkpoints/last.ckpt (128 KB; the tokenizer's
# normalisation table is most of it). Committed, so the test needs no git history.
PREMOVE_SIZES = ("--emb-size", "8", "--hidden-size", "8")


@pytest.fixture(scope="session")
def premove_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`last.ckpt` of a tiny GRU after 20 updates on `write_corpus`'s pairs, as the code of 0a17e04
    wrote it, unpacked outside any run folder, as a checkpoint handed on is."""
    import lzma

    packed = Path(__file__).parent / "fixtures" / "premove-gru-last.ckpt.xz"
    kept = tmp_path_factory.mktemp("premove") / "premove-gru-last.ckpt"
    kept.write_bytes(lzma.decompress(packed.read_bytes()))
    return kept
