"""The server's work estimate against the CPU time it bounds, for each reading of a checkpoint.

On the sentence `"aA" * 500` (one subword a character, the worst case the estimates were fitted on):
greedy, beam 5 / n-best 5, and the pair read teacher-forced, each with the attention reading and,
when the checkpoint holds a foresight head, the foresight one. Each line gives the estimate
(seq2seq.serving.budget) and the CPU time of `run_batch` (the batch and the answer's rounding, not
its JSON) on one thread. The figures of docs/guides/serving.md were printed by

    OMP_NUM_THREADS=1 python docs/tools/reading_budget.py FS.ckpt

with FS.ckpt the shared GRU with a 5-update head (`seq2seq fit-foresight
../shared/models/multi30k-de-en-additive.ckpt --out FS.ckpt --steps 5`: the head's work does not
depend on how well it is fitted).
"""

import time

import torch

from seq2seq import Translator
from seq2seq.cli import Parser
from seq2seq.serving.answers import run_batch
from seq2seq.serving.budget import MS, align_costs, translate_costs
from seq2seq.serving.requests import Limits, ServedSearch

SENTENCE = "aA" * 500


def main() -> None:
    p = Parser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", metavar="CKPT")
    args = p.parse_args()
    torch.set_num_threads(1)
    translator = Translator.load(args.checkpoint)
    readings = ["attention"] + ([] if translator.foresight is None else ["foresight"])
    most = Limits().max_output
    for name, beam in (
        ("greedy, one sentence", 1),
        ("beam 5 / n-best 5", 5),
        ("teacher-forced", 0),
    ):
        for reading in readings:
            if beam:
                search = ServedSearch(beam=beam, nbest=beam, max_output=most)
                [cost] = translate_costs([translator], [SENTENCE], search, 1, reading)
                key, items = ("translate", search, True, "best", reading), [SENTENCE]
            else:
                [cost] = align_costs([translator], [SENTENCE], [SENTENCE], reading)
                key, items = ("align", reading), [(SENTENCE, SENTENCE)]
            start = time.process_time()
            run_batch(translator, key, items)
            cpu = time.process_time() - start
            print(
                f"{name:22s} {reading:9s} estimate {cost.work / MS:7,.0f} ms, "
                f"measured {cpu * 1000:7,.0f} ms of CPU"
            )


if __name__ == "__main__":
    main()
