"""Corpus BLEU of each system's output on the short, middle and long thirds of a test set, by the
number of whitespace-separated words of each source sentence. Does a system lose more on long
sentences than another? The en->de table of docs/results/study.md was printed by

    python docs/tools/bleu_by_length.py ../shared/data/multi30k/test_2016_flickr.en.gz \
        ../shared/data/multi30k/test_2016_flickr.de.gz docs/study-recipe-en-de/runs/*/test.hyp \
        docs/study-baseline-en-de/runs/*/test.hyp

Each HYP is one output line per source line (a study run's `test.hyp`); a row is named by the
folder it is in. The cut points are the source lengths at a third and two thirds of the sorted
lengths, so sentences of one length stay in one part. Prints a Markdown table.
"""

import sys
from pathlib import Path

import sacrebleu

from seq2seq.cli import Parser
from seq2seq.data.corpus_files import read_lines


def parts_by_length(sources: list[str], parts: int) -> list[tuple[str, list[int]]]:
    """Per part, its word counts ("10-12") and the indices of the sources whose count falls in it;
    a cut point that repeats (many sources of one length) leaves no empty part."""
    lengths = [len(source.split()) for source in sources]
    ordered = sorted(lengths)
    cuts = sorted({ordered[len(ordered) * k // parts] for k in range(1, parts)} - {ordered[0]})
    bounds = [ordered[0], *cuts, ordered[-1] + 1]
    return [
        (f"{low}-{high - 1}", [i for i, n in enumerate(lengths) if low <= n < high])
        for low, high in zip(bounds, bounds[1:], strict=False)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="the test sources, one a line (plain or .gz)")
    parser.add_argument("reference", help="the references, one a line (plain or .gz)")
    parser.add_argument("hyps", nargs="+", metavar="HYP", help="a system's output, one a line")
    parser.add_argument("--parts", type=int, default=3, help="how many length parts (default: 3)")
    args = parser.parse_args(argv)
    sources, references = read_lines(args.source), read_lines(args.reference)
    outputs = {hyp: read_lines(hyp) for hyp in args.hyps}
    for path, lines in [(args.reference, references), *outputs.items()]:
        if len(lines) != len(sources):
            parser.error(f"{path} has {len(lines)} lines, {args.source} has {len(sources)}")
    if args.parts < 1 or args.parts > len(sources):
        parser.error(f"--parts must be from 1 to {len(sources)}")
    parts = parts_by_length(sources, args.parts)
    heads = [f"{words} words ({len(part)})" for words, part in parts]
    print("| output | " + " | ".join(heads) + f" | all ({len(sources)}) |")
    print("|---" * (len(heads) + 2) + "|")
    for path, lines in outputs.items():
        scores = [
            sacrebleu.corpus_bleu([lines[i] for i in part], [[references[i] for i in part]]).score
            for part in [*(part for _, part in parts), range(len(sources))]
        ]
        print(f"| {Path(path).parent.name} | " + " | ".join(f"{s:.2f}" for s in scores) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
