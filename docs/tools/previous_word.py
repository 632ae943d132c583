"""Is a checkpoint's teacher-forced attention right more often after a word it predicted?

Bahdanau attention for target piece t is scored with s_{t-1}, the decoder state before it has read
piece t-1 (docs/guides/alignments.md#what-the-decoder-reads-when-it-attends). This splits the linked
target words of a gold (or silver) alignment by whether the model's most likely piece at the step
before the word's first piece was the reference's piece, and prints how often each group's best
source word (`tgt2src`) is a gold link. Then the AER the `tgt2src` reading would have if it were
right on every linked word of the first group (and the first word of each sentence), the rest
unchanged. The output of docs/guides/alignments.md was printed by

    python docs/tools/previous_word.py CKPT data/silver/test_2016_flickr.de-en.align \
        ../shared/data/multi30k/test_2016_flickr.de.gz ../shared/data/multi30k/test_2016_flickr.en.gz
"""

import torch

from seq2seq import Translator
from seq2seq.alignment.words import alignment_error_rate, hard_links, read_pharaoh
from seq2seq.cli import Parser
from seq2seq.data.batching import collate
from seq2seq.data.corpus_files import read_lines
from seq2seq.data.words import word_spans_in_text


@torch.no_grad()
def predicted_pieces(translator: Translator, source: str, tgt_ids: list[int]) -> list[bool]:
    """Per target piece (EOS excluded), whether the teacher-forced model's argmax was that piece."""
    src_ids, _ = translator.tokenizer.encode_with_spans(source)
    batch = collate([{"src_ids": src_ids, "tgt_ids": tgt_ids, "index": 0}])
    state = translator.model.encode(batch["src"], batch["src_lens"], batch["src_mask"])
    features, _ = translator.model.decode(state, batch["tgt_in"])  # (1, T, O)
    best = translator.model.generator(features[0]).argmax(-1)  # (T,)
    return (best == batch["tgt_out"][0])[: len(tgt_ids)].tolist()


def main() -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt")
    parser.add_argument("gold", help="Pharaoh links, one line per pair (sure links are used)")
    parser.add_argument("src_file")
    parser.add_argument("ref_file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sources, targets = read_lines(args.src_file), read_lines(args.ref_file)
    gold = read_pharaoh(args.gold)
    translator = Translator.load(args.ckpt)
    results = translator.align(sources, targets)
    right = {True: 0, False: 0}  # previous piece predicted -> linked words (not first) linked right
    linked = {True: 0, False: 0}
    after_predicted = words = 0
    mended = []  # per pair: tgt2src links, made right on linked words after a predicted piece
    for source, target, result, (sure, _) in zip(sources, targets, results, gold, strict=True):
        tgt_ids, spans = translator.tokenizer.encode_with_spans(target)
        predicted = predicted_pieces(translator, source, tgt_ids)
        first_piece = {}  # target word -> its first piece
        for piece, word in enumerate(word_spans_in_text(target, spans)):
            first_piece.setdefault(word, piece)
        links = set(hard_links(result.word_attention, "tgt2src"))
        gold_source = {t: s for s, t in sure}  # an intersection links a target word at most once
        for word in range(len(target.split())):
            piece = first_piece.get(word)
            if piece is None:
                continue
            ok = piece == 0 or predicted[piece - 1]
            words += 1
            after_predicted += ok
            if word not in gold_source:
                continue
            if piece > 0:
                linked[ok] += 1
                right[ok] += (int(result.word_attention[word].argmax()), word) in sure
            if ok:
                links = {(s, t) for s, t in links if t != word} | {(gold_source[word], word)}
        mended.append(links)
    for ok in (True, False):
        label = "predicted" if ok else "not predicted"
        share = right[ok] / max(linked[ok], 1)
        print(
            f"previous piece {label}: {linked[ok]} linked words, best source word right {share:.4f}"
        )
    score = alignment_error_rate(mended, gold)
    print(f"words after a predicted piece (or first): {after_predicted} of {words}")
    print(
        f"tgt2src right on each of their linked words: AER {score.aer:.4f} "
        f"precision {score.precision:.4f} recall {score.recall:.4f}"
    )


if __name__ == "__main__":
    main()
