"""Every reading's AER of one checkpoint, on the reference and on its own translations, as a report.

For a checkpoint holding a foresight head (`seq2seq fit-foresight`): its attention and the head's,
each made into word links two ways (`tgt2src`, `intersect`), read teacher-forced on the split's
first reference against the silver standard (`--gold`), and on the model's own beam translations
against eflomal's alignment of them (`--hyp-align`, or made here as `seq2seq silver-alignments`
makes the silver standard: aligned together with the training pairs, needs eflomal). Each figure
is the one `python scripts/evaluate.py CKPT --align-ref ... --align-reading R --align-direction D`
prints (with `--align-on hyp` and the beam for the own translations): one search a reading, both
directions read from its word matrix. Writes DIR/readings.json (the figures, the head's fit record,
the command, commit, CPU), DIR/readings.md (the table as printed), DIR/<split>.hyp and, unless
given, DIR/<split>.hyp.align. With `--reverse CKPT2`, a checkpoint of the other direction, also
its reading of each pair turned round (`reverse:<reading>`) and both directions joined by each of
intersect, union, grow-diag-final and grow-diag-final-and (`joined:<method>[:foresight]`), as
`evaluate --reverse CKPT2` scores them; the foresight reading is joined when both hold a head. The
report of docs/readings/shared-fs600 was printed by

    python docs/tools/readings_report.py FS.ckpt --out DIR --threads 1
"""

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from seq2seq import Translator
from seq2seq.alignment.joined import join_all, joined_label
from seq2seq.alignment.silver import require_eflomal, silver_alignments
from seq2seq.alignment.words import (
    JOINS,
    READINGS,
    alignment_error_rate,
    flip,
    hard_links,
    parse_pharaoh,
    read_pharaoh,
)
from seq2seq.atomic import atomic_write_text
from seq2seq.checkpoint import corpus_of, read_checkpoint
from seq2seq.cli import Parser, cli_message, use_threads
from seq2seq.data.corpus import read_pairs, resolve_corpus
from seq2seq.data.words import check_links_fit
from seq2seq.decoding.evaluate import check_reverse, read_split
from seq2seq.decoding.metrics import corpus_bleu
from seq2seq.decoding.search_config import SearchConfig
from seq2seq.errors import UserError
from seq2seq.machine import provenance

DIRECTIONS = ("tgt2src", "intersect")
GOLD = "docs/study/test_2016_flickr.de-en.align"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", metavar="CKPT", help="a checkpoint holding a foresight head")
    p.add_argument("--out", metavar="DIR", required=True, help="where the report is written")
    p.add_argument("--split", default="test", help="a split of the checkpoint's corpus")
    p.add_argument("--gold", default=GOLD, help="the split's silver (or gold) Pharaoh file")
    p.add_argument("--beam", type=int, default=5, help="beam size of the own translations")
    p.add_argument("--hyp-align", metavar="FILE", help="eflomal's links of the own translations "
                   "(default: made here, aligned with the training pairs)")  # fmt: skip
    p.add_argument("--reverse", metavar="CKPT2", help="a checkpoint of the other direction: its "
                   "links, and both directions joined")  # fmt: skip
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    return p.parse_args(argv)


def silver_of_own(corpus: dict, sources: list[str], hyps: list[str]) -> list[str]:
    """eflomal's links of (source, own translation) pairs, a Pharaoh line a pair, aligned with the
    training pairs beside them as the silver standard of the split was."""
    source = resolve_corpus(corpus["dataset"], corpus["data_dir"])
    train = read_pairs(source, source.find_split("train"), corpus["src"], corpus["tgt"])
    with tempfile.TemporaryDirectory() as tmp:
        files = [Path(tmp) / name for name in ("src", "hyp", "train.src", "train.tgt")]
        for path, lines in zip(files, (sources, hyps, train.src, train.tgt), strict=True):
            path.write_text("".join(line + "\n" for line in lines), "utf-8")
        return list(silver_alignments(files[0], files[1], (files[2], files[3])).lines)


def with_links(results: list, direction: str) -> list:
    """`results` with their word matrices made into links `direction`'s way (one list a pair)."""
    return [replace(r, word_alignment=hard_links(r.word_attention, direction)) for r in results]


def row(on: str, reading: str, direction: str, links: list, gold: list) -> dict:
    """One figure of the report: AER, precision and recall of `links` (a list a pair) on `gold`."""
    score = alignment_error_rate(links, gold)
    return {"on": on, "reading": reading, "direction": direction, "aer": score.aer,
            "precision": score.precision, "recall": score.recall}  # fmt: skip


def scored(results: list, gold: list, on: str, reading: str, back: list | None) -> list[dict]:
    """The figures of `results` each direction; with `back`, the other direction's readings of the
    same pairs turned round, also theirs and both joined by each method."""
    rows = []
    for direction in DIRECTIONS:
        forward = with_links(results, direction)
        rows.append(row(on, reading, direction, [r.word_alignment for r in forward], gold))
        if back is None:
            continue
        turned = with_links(back, direction)
        flipped = [flip(r.word_alignment) for r in turned]
        rows.append(row(on, f"reverse:{reading}", direction, flipped, gold))
        for method in JOINS:
            joined = [r.word_alignment for r in join_all(forward, turned, method, reading)]
            rows.append(row(on, joined_label(method, reading), direction, joined, gold))
    return rows


def table(rows: list[dict]) -> str:
    """The report's table: a row a reading, a column a (text read, direction)."""
    columns = [(on, d) for on in ("ref", "hyp") for d in DIRECTIONS]
    named = {"ref": "reference", "hyp": "own translations"}
    head = "| reading | " + " | ".join(f"{named[on]}, {d}" for on, d in columns) + " |"
    lines = [head, "|---" * (len(columns) + 1) + "|"]
    for reading in dict.fromkeys(r["reading"] for r in rows):  # in the order they were scored
        cells = []
        for on, direction in columns:
            (row,) = [
                r
                for r in rows
                if (r["on"], r["reading"], r["direction"]) == (on, reading, direction)
            ]
            cells.append(f"{row['aer']:.4f} (P {row['precision']:.4f}, R {row['recall']:.4f})")
        lines.append(f"| {reading} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def links_of(flag: str, path: str) -> list:
    """The Pharaoh links of `path`, a UserError naming `flag` (and, for --gold's default, where it
    is found) when they cannot be read."""
    try:
        return read_pharaoh(path)
    except UserError as err:
        where = " (the default, under the checkout's root: run from there)" if path == GOLD else ""
        raise UserError(f"{flag} {err}{where}") from None


def report(args: argparse.Namespace, argv: list[str]) -> tuple[dict, dict[str, str]]:
    """The report's figures (readings.json) and the files beside them (name: text); UserError for
    a bad input, before any translation where it can be told."""
    use_threads(args.threads)
    search = SearchConfig(beam=args.beam)
    gold = links_of("--gold", args.gold)  # a bad file fails here, before any translation
    checkpoint = read_checkpoint(args.checkpoint)
    corpus = corpus_of(checkpoint)
    translator = Translator.load(args.checkpoint)
    if translator.foresight is None:
        raise UserError(f"{args.checkpoint} holds no foresight head: fit one with "
                        f"`python -m seq2seq fit-foresight {args.checkpoint} --out FS.ckpt`")  # fmt: skip
    sources, references, data = read_split(args.split, corpus, instead="")
    if len(gold) != len(sources):
        raise UserError(f"--gold {args.gold} has {len(gold)} lines for {len(sources)} pairs")
    check_links_fit([p for _, p in gold], sources, references[0], f"--gold {args.gold}")
    reverse = None
    if args.reverse is not None:
        check_reverse(corpus, args.reverse)
        reverse = Translator.load(args.reverse)
    given = links_of("--hyp-align", args.hyp_align) if args.hyp_align else None
    if given is not None and len(given) != len(sources):
        raise UserError(
            f"--hyp-align {args.hyp_align} has {len(given)} lines for {len(sources)} pairs"
        )
    if given is None:
        require_eflomal()  # the own translations' links are made after minutes of translating
    start, rows = time.perf_counter(), []
    own = {
        r: translator.translate(sources, search, return_alignments=True, reading=r)
        for r in READINGS
    }
    hyps = [t.text for t in own["attention"]]
    if [t.text for t in own["foresight"]] != hyps:  # a reading never changes the search
        raise RuntimeError("the foresight reading's search found other translations")
    files = {f"{args.split}.hyp": "".join(h + "\n" for h in hyps)}
    if given is None:
        made = silver_of_own(corpus, sources, hyps)
        files[f"{args.split}.hyp.align"] = "".join(line + "\n" for line in made)
        given = parse_pharaoh(made, "eflomal's links of the own translations")
    else:  # links made for other translations point past their words
        check_links_fit([p for _, p in given], sources, hyps, f"--hyp-align {args.hyp_align}")
    for reading in READINGS:
        joins = reverse is not None and (reading == "attention" or reverse.foresight is not None)
        for on, targets, links in (("ref", references[0], gold), ("hyp", hyps, given)):
            found = (
                own[reading] if on == "hyp" else translator.align(sources, targets, reading=reading)
            )
            back = reverse.align(targets, sources, reading=reading) if joins else None
            rows += scored(found, links, on, reading, back)
    head = checkpoint["foresight"].get("fit")  # how the head was fitted (seq2seq fit-foresight)
    return {
        "checkpoint": str(args.checkpoint),
        "command": shlex.join(["python", "docs/tools/readings_report.py", *argv]),
        "data": data,
        "gold": args.gold,
        "hyp_align": args.hyp_align or str(Path(args.out) / f"{args.split}.hyp.align"),
        "reverse": args.reverse,
        "beam": args.beam,
        "bleu": corpus_bleu(hyps, references).value,
        "head": head,
        "seconds": time.perf_counter() - start,
        "threads": torch.get_num_threads(),
        **provenance(),
        "readings": rows,
    }, files


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    try:
        writable(out)  # a folder that cannot be made is refused before any translation
        result, files = report(args, argv)
    except UserError as err:
        print(f"error: {cli_message(err)}", file=sys.stderr)
        return 2
    text = table(result["readings"])
    files |= {"readings.json": json.dumps(result, indent=2) + "\n", "readings.md": text}
    try:  # written last and whole: a refused report leaves none
        out.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            atomic_write_text(out / name, content)
    except OSError as err:
        print(f"error: --out {out}: cannot write ({err.strerror})", file=sys.stderr)
        return 2
    print(f"{result['checkpoint']}: BLEU {result['bleu']:.2f} at beam {result['beam']}, "
          f"{result['seconds']:.0f} s on {result['cpu']}, {result['threads']} thread(s)")  # fmt: skip
    print(text, end="")
    return 0


def writable(out: Path) -> None:
    """Refuses an --out that is not a folder, or one that cannot be made, making nothing."""
    there = next((p for p in (out, *out.parents) if p.exists()), None)
    if there is not None and not there.is_dir():
        raise UserError(f"--out {out}: cannot make the folder ({there} is a file)")
    if there is not None and not os.access(there, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: cannot make the folder ({there} is not writable)")


if __name__ == "__main__":
    sys.exit(main())
