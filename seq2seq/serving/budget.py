"""The work budget of a request: the time and memory it would cost, estimated before any of it runs.

Per-field limits alone let a request through that is small in every field and huge in all of
them together, and a text that tokenizes to one subword a character (`"aA" * 500`: 1,001 subwords)
makes even one sentence large. So the server estimates each request's `Cost` from what the model
and the search really do, per sentence and model, and refuses one over `Limits.max_work` (time)
or `Limits.max_memory` (memory) with 413 before it is queued. With S the sentence's source
subwords (EOS included, cut as the model cuts it), T the longest output the search allows
(SearchConfig.limits: 1.5 x S + 10, no more than a Transformer's positions nor the server's
`max_output`), K the beam (1: greedy), n the n-best (of which one hypothesis, or all with
`"attention": "all"`, send their matrices back), V the vocabulary, A the additive scorer's size, N the heads
of the weights the search keeps (1 for the GRU), H and L the Transformer's width and layers:

- **work**, in nanoseconds of one thread of the CPU the constants were measured on
  (docs/guides/serving.md): T steps, each reading every weight of the model once (PARAM_NS a
  parameter, and LAYER_NS a decoder layer for its many small operations; the sentences batched
  together share their longest one's steps); K x T row-steps, each the model's own count of
  its forward FLOPs (`flops_per_token`, a third of the training update it reports: layers,
  heads' attention over S and the prefix, the output layer over V) at FLOP_NS, the additive
  scorer's S x A tanh at TANH_NS, and at ELEM_NS the softmax and top-k over V and the
  Transformer's cached keys and values each row reads (2 L x (S + T / 2) x H); KEPT_NS for each attention weight the search keeps and ANSWER_NS
  for each number the answer holds (rounding and writing them). Teacher-forced reading
  (/api/align): one row of T steps, and the T x V log-probabilities. The foresight reading
  (`"reading": "foresight"`) reads each pair teacher-forced and then the translator's states again
  for the head (two readings, an upper bound), with the head's S x A' tanh a row; after a search, it
  reads every n-best hypothesis so, on top of the search.
- **memory**, bytes held at once: the weights the search keeps (greedy: each step's (S) row and
  their stack; beam search: each step's (K, N, S), their stack and the n-best traced back, 2K + n
  copies), the Transformer's key and value caches (2 L x K x (T + S) x H, grown by copying),
  the (K, V) logits, and the answer: its matrices as float32 tensors, their rounded doubles and
  their JSON, ANSWER_BYTES a number. Teacher-forced: the (T, V) logits and their log-softmax.

Both are upper bounds: outputs usually end before T. A batch's padding to its longest sentence is
not counted (Translator sorts a call's sentences by length, so batches hold similar ones), nor is
the speed-up of many rows in one step's matrix products.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seq2seq.alignment.words import Reading
from seq2seq.data.batching import TokenBudgetBatchSampler
from seq2seq.decoding.search_config import SearchConfig, output_limits
from seq2seq.decoding.translator import Translator
from seq2seq.models.interface import Seq2Seq
from seq2seq.serving.requests import Limits, RequestError

# Nanoseconds of one thread of a 2-core AMD EPYC (AVX-512), fitted to greedy, beam and teacher-forced
# calls of the shared GRU and a small Transformer on "aA" * 500 (docs/guides/serving.md).
PARAM_NS = 0.6  # a step reads every weight once
LAYER_NS = 300_000.0  # a step's small operations, per decoder layer (the GRU's decoder is one)
FLOP_NS = 0.02  # a forward FLOP as the model counts it
TANH_NS = 2.5  # one element of the additive scorer's tanh(W_q q + W_k k), (S, A) a row-step
ELEM_NS = 1.0  # an elementwise operation: softmax, top-k, log-probabilities
KEPT_NS = 2.0  # an attention weight the search keeps (copied, stacked, traced back)
ANSWER_NS = 120.0  # a number of the answer (word alignments, rounding, listing, JSON)
ANSWER_BYTES = 4 + 8 + 3 * 8  # float32 tensor, rounded double, JSON text (~8 chars) held 3 times
FLOAT = 4  # bytes of a float32
MB = 2**20
MS = 10**6  # nanoseconds
BATCH_TOKENS = 4096  # Translator's default batches: padded source tokens


@dataclass(frozen=True)
class Cost:
    """What a request (or a batch, their sum) would cost: `work` in nanoseconds (module
    docstring), `memory` in bytes held at once."""

    work: int = 0
    memory: int = 0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.work + other.work, self.memory + other.memory)

    def within(self, limits: Limits) -> bool:
        return self.work <= limits.max_work * MS and self.memory <= limits.max_memory * MB


def subwords(translator: Translator, texts: list[str]) -> list[int]:
    """Subwords per text as `translator` reads it: EOS included, cut to a Transformer's positions."""
    lengths = [len(ids) for ids in translator.tokenizer.encode_batch(texts, threads=1)]
    most = translator.model.max_len  # None for the GRU: no limit
    return [(n if most is None else min(n, most - 1)) + 1 for n in lengths]


def output_limit(translator: Translator, search: SearchConfig, source: int) -> int:
    """The longest output (EOS included) a search may give for `source` subwords: the searches'
    own `output_limits`, for one sentence."""
    return int(output_limits(translator.model, search, torch.tensor([source]))[0])


@dataclass(frozen=True)
class Shape:
    """What the estimates read of a model: its parameters P, vocabulary V, the additive scorer's
    size A (0 for other scorers and the Transformer), heads N, and the Transformer's width H and
    layers L (0 for the GRU)."""

    P: int
    V: int
    A: int
    N: int
    H: int
    L: int


def shape(model: Seq2Seq) -> Shape:
    args = getattr(model, "model_args", {})
    P, V = sum(p.numel() for p in model.parameters()), model.generator.weight.size(0)
    if args.get("model") == "transformer":
        return Shape(P, V, 0, int(args["heads"]), int(args["d_model"]), int(args["layers"]))
    return Shape(P, V, model.decoder.scorer.tanh_size, 1, 0, 0)  # the scorer states its tanh


def _rows(model: Seq2Seq, s: Shape, S: int, T: int, rows: int) -> float:
    """Nanoseconds of `rows` output rows of T steps over a source of S (module docstring), the
    steps' reading of the weights left out (`shared_steps`)."""
    flops = float(model.flops_per_token(float(S), float(T))) / 3  # forward, per row-step
    cached = 2 * s.L * (S + T / 2) * s.H  # the Transformer's keys and values each row reads
    per_row = FLOP_NS * flops + TANH_NS * S * s.A + ELEM_NS * (2 * s.V + cached)
    return T * rows * per_row


def shared_steps(model: Seq2Seq, sizes: list[tuple[int, int]]) -> Cost:
    """Nanoseconds of the steps of sentences of (S, T) subwords, each reading every weight once,
    batched as Translator batches them (BATCH_TOKENS padded tokens a batch, sorted by length):
    the sentences of a batch share its longest one's steps."""
    s = shape(model)
    groups = TokenBudgetBatchSampler([max(S, T) for S, T in sizes], BATCH_TOKENS)
    steps = sum(max(sizes[i][1] for i in group) for group in groups)
    return Cost(int((PARAM_NS * s.P + LAYER_NS * max(s.L, 1)) * steps), 0)


def search_cost(model: Seq2Seq, S: int, T: int, beam: int, nbest: int, attended: int) -> Cost:
    """One sentence of S source subwords searched for at most T steps with `beam` rows, the
    `nbest` hypotheses traced back and the matrices of `attended` of them sent back (module
    docstring); its steps' reading of the
    weights is `shared_steps`'s."""
    s = shape(model)
    kept = T * s.N * S * (2 if beam == 1 else 2 * beam + nbest)  # weights the search holds
    answer = attended * T * S  # (T, S) numbers per matrix sent back; word ones are smaller
    caches = 2 * 2 * s.L * beam * (T + S) * s.H  # keys and values, and their copy as one grows
    memory = FLOAT * (kept + caches + beam * s.V) + ANSWER_BYTES * answer
    work = _rows(model, s, S, T, beam) + KEPT_NS * kept + ANSWER_NS * answer
    return Cost(int(work), int(memory))


def reading_cost(model: Seq2Seq, S: int, T: int) -> Cost:
    """One pair read teacher-forced: S source subwords, T target ones (module docstring); its
    steps' reading of the weights is `shared_steps`'s."""
    s = shape(model)
    kept, logits = T * s.N * S, 2 * T * s.V  # the weights; the logits and their log-softmax
    memory = FLOAT * (kept + logits + 2 * s.L * (T + S) * s.H) + ANSWER_BYTES * T * S
    work = _rows(model, s, S, T, 1) + KEPT_NS * kept + ANSWER_NS * T * S
    return Cost(int(work), int(memory))


def foresight_costs(translator: Translator, sizes: list[tuple[int, int]]) -> Cost:
    """Reading pairs of (S, T) subwords with the foresight head (module docstring): the model's
    teacher-forced reading, its states again, and the head's scorer."""
    head = translator.foresight
    tanh = 0 if head is None else head.scorer.tanh_size  # A', the head's scorer size
    total = shared_steps(translator.model, sizes + sizes)  # two passes over the same steps
    for S, T in sizes:
        once = reading_cost(translator.model, S, T)
        total += once + once + Cost(int(TANH_NS * S * tanh * T), FLOAT * T * S)
    return total


def translate_costs(
    translators: Sequence[Translator],
    sentences: list[str],
    search: SearchConfig,
    attended: int,
    reading: Reading = "attention",
) -> list[Cost]:
    """Per translator, what translating `sentences` with it costs; `attended`: hypotheses per
    sentence whose attention is sent back; `reading` "foresight" reads every hypothesis again."""
    costs = []
    for translator in translators:
        sizes = [(S, output_limit(translator, search, S)) for S in subwords(translator, sentences)]
        total = shared_steps(translator.model, sizes)
        for S, T in sizes:
            total += search_cost(translator.model, S, T, search.beam, search.nbest, attended)
        if reading == "foresight":
            total += foresight_costs(translator, sizes * search.nbest)
        costs.append(total)
    return costs


def align_costs(
    translators: Sequence[Translator],
    sentences: list[str],
    references: list[str],
    reading: Reading = "attention",
) -> list[Cost]:
    """Per translator, what reading `references` teacher-forced costs, as `reading` says."""
    costs = []
    for translator in translators:
        sources, targets = subwords(translator, sentences), subwords(translator, references)
        sizes = list(zip(sources, targets, strict=True))
        if reading == "foresight":
            costs.append(foresight_costs(translator, sizes))
            continue
        total = shared_steps(translator.model, sizes)
        for S, T in sizes:
            total += reading_cost(translator.model, S, T)
        costs.append(total)
    return costs


def check_cost(costs: Sequence[Cost], limits: Limits) -> None:
    """413 for a request whose summed cost (over its models) passes `max_work` or `max_memory`."""
    total = sum(costs, Cost())
    if total.within(limits):
        return
    raise RequestError(
        413,
        f"this request would cost about {total.work / MS:,.0f} ms of work and "
        f"{total.memory / MB:,.0f} MB; the server takes {limits.max_work:,} ms and "
        f"{limits.max_memory:,} MB a request (--max-work, --max-memory): send fewer or shorter "
        "sentences, a smaller beam or n-best, or fewer models",
    )
