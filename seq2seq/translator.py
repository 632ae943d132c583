"""Translator: a trained model and its tokenizer, translating lists of sentences.

    from seq2seq import Translator
    translator = Translator.load("best.ckpt", device="cpu")
    for result in translator.translate(["Ein Hund läuft."], beam=5):
        print(result.text, result.score)

The scripts (evaluate.py, translate.py) are thin wrappers over this class.
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import Tensor

from seq2seq.batching import source_loader
from seq2seq.checkpoint import load_model
from seq2seq.interface import Seq2Seq
from seq2seq.search import Hypotheses, SearchConfig, translate_batch
from seq2seq.tokenizer import Tokenizer


@dataclass
class Translation:
    """One hypothesis of one source sentence, as plain Python values.

    text: the detokenized translation. score: its total log-probability (EOS included).
    src_tokens, tgt_tokens: the subwords of source and hypothesis, each ending in `</s>`.
    attention: (len(tgt_tokens), [N,] len(src_tokens)), the soft attention the search used for each
        output subword (rows) over the source subwords (columns).
    nbest: the other hypotheses (best first, this one first) when more than one was asked for.
    """

    text: str
    score: float
    src_tokens: list[str]
    tgt_tokens: list[str]
    attention: Tensor
    nbest: list["Translation"] = field(default_factory=list)


class Translator:
    """Translate with `model` and `tokenizer` on `device` (the model is moved there, in eval mode)."""

    def __init__(self, model: Seq2Seq, tokenizer: Tokenizer, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.model, self.tokenizer = model.to(self.device).eval(), tokenizer

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> "Translator":
        """A Translator for the checkpoint at `path` (the file alone is enough)."""
        model, tokenizer = load_model(path)
        return cls(model, tokenizer, device)

    def translate(
        self,
        sentences: list[str],
        search: SearchConfig | None = None,
        batch_tokens: int = 4096,
        batch_size: int | None = None,
        **settings: float,
    ) -> list[Translation]:
        """Translate `sentences` (raw text); one result per sentence, in order. A blank sentence gets
        an empty translation with score 0.

        `settings` override fields of `search` (default: SearchConfig()) by name (`beam=5`, `nbest=3`, `length_penalty=0.6`).
        Batches hold `batch_tokens` source tokens, or `batch_size` sentences when that is given.
        """
        search = replace(search or SearchConfig(), **settings)
        kept = [i for i, line in enumerate(sentences) if line.strip()]
        hyps = self.search([sentences[i] for i in kept], search, batch_tokens, batch_size)
        results = [Translation("", 0.0, ["</s>"], ["</s>"], torch.zeros(1, 1)) for _ in sentences]
        for j, i in enumerate(kept):
            src_ids = self.tokenizer.encode(sentences[i])
            options = hyps.nbest[j] if hyps.nbest is not None else None
            best = self._result(src_ids, hyps.tokens[j], float(hyps.scores[j]), hyps.weights[j])
            if options is not None and search.nbest > 1:
                best.nbest = [
                    self._result(src_ids, ids, float(score), weights)
                    for ids, score, weights in zip(
                        options.tokens, options.scores, options.weights, strict=True
                    )
                ]
            results[i] = best
        return results

    def search(
        self,
        sentences: list[str],
        search: SearchConfig,
        batch_tokens: int = 4096,
        batch_size: int | None = None,
    ) -> Hypotheses:
        """The search output of non-blank `sentences`, in their order, scores on the CPU."""
        order: list[int] = []
        parts: list[Hypotheses] = []
        batches = source_loader(self.tokenizer, sentences, batch_tokens, batch_size)
        for batch in batches:
            parts.append(translate_batch(self.model, batch, search))
            order.extend(batch["index"].tolist())
        rank = sorted(range(len(order)), key=order.__getitem__)  # output position -> in `parts`
        picked = [(h, i) for h in parts for i in range(len(h.tokens))]
        picked = [picked[r] for r in rank]
        scores = torch.cat([h.scores.cpu() for h in parts])[rank] if parts else torch.zeros(0)
        lists = [h.nbest[i] for h, i in picked] if parts and parts[0].nbest is not None else None
        return Hypotheses(
            tokens=[h.tokens[i] for h, i in picked],
            scores=scores,
            weights=[h.weights[i] for h, i in picked],
            normalized=torch.cat([h.normalized.cpu() for h in parts])[rank] if lists else None,
            nbest=lists,
        )

    def _result(
        self, src_ids: list[int], ids: list[int], score: float, weights: Tensor
    ) -> Translation:
        pieces = self.tokenizer.pieces
        return Translation(
            text=self.tokenizer.decode(ids),
            score=score,
            src_tokens=[*pieces(src_ids), "</s>"],
            tgt_tokens=[*pieces(ids), "</s>"],
            attention=weights,
        )
