"""Greedy and beam-5 sentences/s of a checkpoint in a process that does nothing else, as
evaluate.py, translate.py and the server decode.

    python docs/tools/decode_fresh.py [--checkpoint CKPT] [--rounds N] [--sentences N]

Decodes the Multi30k validation sources (`--src`, default de; BLEU against `--tgt`) with whichever
`seq2seq` comes first on the path, so two commits compare side by side:

    git archive <commit> | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old python docs/tools/decode_fresh.py; python docs/tools/decode_fresh.py

(A commit before the sub-packages kept the Translator in seq2seq.translator.) Prints one JSON line:
the package decoded with, sentences/s of each round (greedy, then beam 5) and the BLEU of each
search. What it showed: docs/results/benchmarks.md.
"""

import argparse
import gzip
import json
import time
from pathlib import Path

import sacrebleu
import torch

import seq2seq

try:
    from seq2seq.decoding.translator import Translator
except ImportError:  # a commit before the sub-packages
    from seq2seq.translator import Translator

HERE = Path(__file__).resolve().parents[2]


def read(path: str, first: int | None) -> list[str]:
    """The first `first` lines of a gzip text file (all with None), without newlines."""
    with gzip.open(path, "rt") as lines:
        return [line.rstrip("\n") for line in lines][:first]


def main() -> None:
    # argparse, not seq2seq.cli.Parser: the package decoded with may predate it.
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--checkpoint", default=str(HERE.parent / "shared/models/multi30k-de-en-additive.ckpt")
    )
    p.add_argument("--data-dir", default=str(HERE.parent / "shared/data/multi30k"))
    p.add_argument("--src", default="de")
    p.add_argument("--tgt", default="en")
    p.add_argument("--rounds", type=int, default=3, help="rounds of greedy, then beam 5")
    p.add_argument("--sentences", type=int, default=None, help="the first N (default: all)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    sources, refs = (
        read(f"{args.data_dir}/val.{lang}.gz", args.sentences) for lang in (args.src, args.tgt)
    )
    translator = Translator.load(args.checkpoint, "cpu")
    translator.translate(sources[:64], beam=5)  # warm-up: threads, first allocations
    out = {"package": seq2seq.__file__, "threads": args.threads, "sentences": len(sources)}
    for _ in range(args.rounds):
        for name, beam in (("greedy", 1), ("beam5", 5)):
            start = time.perf_counter()
            hyps = translator.translate(sources, beam=beam)
            out.setdefault(name, []).append(round(len(sources) / (time.perf_counter() - start), 1))
            out[f"{name}_bleu"] = round(
                sacrebleu.corpus_bleu([h.text for h in hyps], [refs]).score, 2
            )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
