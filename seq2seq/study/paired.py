"""Paired tests of a BLEU difference that resample source sentences, each with every seed's outputs.

A study translates each test sentence once per seed, so over seeds 1-3 a variant has three outputs of
every source sentence. Tests that treat those 3 x n outputs as 3 x n independent samples (sacrebleu's
`--paired-bs` / `--paired-ar` on the seeds' files concatenated) resample the same source sentence as if
it were three, and so understate how much the difference would move on other sentences. Here the unit
is the source sentence (a cluster of one output per seed):

- paired bootstrap: each of the `TESTS["bs"]` resamples draws n sentence indices with replacement, the
  same draw for every seed and both systems; each side's BLEU is the corpus BLEU of every seed's
  outputs of the drawn sentences together;
- approximate randomization: each of the `TESTS["ar"]` trials swaps, sentence by sentence with
  probability 1/2, the two systems' outputs of that sentence for every seed at once.

Both are sacrebleu's own tests (`sacrebleu.significance`: its seed, sample counts, p-value with the +1
of Riezler and Maxwell 2005, and the bootstrap's centred statistic) with the sentence's statistics
summed over seeds in place of one output's: BLEU's sufficient statistics (lengths, n-gram matches and
totals) add up over sentences, so the corpus BLEU of any set of outputs is computed from their sum
(sacrebleu's `_extract_corpus_statistics` and `_compute_score_from_stats`, the pieces its own tests
use). With one seed they are sacrebleu's tests exactly, to the same p-value.

The tests are two-sided: the statistic is |BLEU_system - BLEU_baseline|.
"""

from typing import Any

import numpy as np

TESTS = {"bs": 1000, "ar": 10000}  # sacrebleu's CLI defaults: resamples, trials
SEED = 12345  # sacrebleu's default seed (SACREBLEU_SEED)


def _metric(refs: list[str]) -> Any:
    from sacrebleu.metrics import BLEU

    return BLEU(references=[refs])  # the references' n-grams cached once for every seed


def sentence_stats(metric: Any, hyps_by_seed: list[list[str]]) -> np.ndarray:
    """BLEU's sufficient statistics of each source sentence, summed over the seeds' outputs of it:
    (n_sentences, n_stats), int64. `hyps_by_seed`: one list of n hypotheses per seed, in the order
    of the references `metric` caches."""
    per_seed = [np.array(metric._extract_corpus_statistics(hyps, None)) for hyps in hyps_by_seed]
    return np.stack(per_seed).sum(0)  # (seeds, n, n_stats) -> (n, n_stats)


def corpus_score(metric: Any, stats: np.ndarray) -> float:
    """The corpus BLEU of the outputs whose sentence statistics are the rows of `stats`."""
    return metric._compute_score_from_stats(stats.sum(0)).score


def _scores(metric: Any, sums: np.ndarray) -> np.ndarray:
    """The BLEU of each row of summed statistics (samples, n_stats) -> (samples,); each distinct row
    scored once (small test sets repeat rows often)."""
    rows, inverse = np.unique(sums, axis=0, return_inverse=True)
    scores = np.array([metric._compute_score_from_stats(row).score for row in rows])
    return scores[inverse.reshape(-1)]


def draw_sentences(n_sentences: int, n_samples: int = TESTS["bs"]) -> np.ndarray:
    """The bootstrap's sentence indices, (n_samples, n_sentences): sacrebleu's draw, with its seed."""
    rng = np.random.default_rng(SEED)
    return rng.choice(n_sentences, size=(n_samples, n_sentences), replace=True)


def draw_swaps(n_sentences: int, n_trials: int = TESTS["ar"]) -> np.ndarray:
    """Approximate randomization's swaps, (n_trials, n_sentences) bool, True where the baseline's
    outputs of that sentence stay on its side: sacrebleu's draw, with its seed."""
    rng = np.random.default_rng(SEED)
    return rng.integers(2, size=(n_trials, n_sentences), dtype=bool)


def _p_value(samples: np.ndarray, observed: float) -> float:
    """The share of samples above the observed statistic, with the +1 that keeps a test's chance of
    a false rejection within its level (sacrebleu's, after MultEval)."""
    return (int(np.sum(samples > observed)) + 1) / (len(samples) + 1)


def bootstrap_p(metric: Any, baseline: np.ndarray, system: np.ndarray) -> float:
    """Paired bootstrap over source sentences. baseline, system: (n, n_stats) sentence statistics."""
    observed = abs(corpus_score(metric, system) - corpus_score(metric, baseline))
    idxs = draw_sentences(len(baseline))  # (samples, n): one draw for both sides and every seed
    # (samples, n_stats) each; float32 as sacrebleu's
    sides = [_scores(metric, stats.astype("float32")[idxs].sum(1)) for stats in (baseline, system)]
    diffs = np.abs(sides[1] - sides[0])
    return _p_value(diffs - diffs.mean(), observed)  # centred: the null's spread about zero


def randomization_p(metric: Any, baseline: np.ndarray, system: np.ndarray) -> float:
    """Approximate randomization over source sentences. baseline, system: (n, n_stats)."""
    observed = abs(corpus_score(metric, system) - corpus_score(metric, baseline))
    keep = draw_swaps(len(baseline))  # (trials, n)
    side_a = keep @ baseline + ~keep @ system  # (trials, n_stats)
    side_b = ~keep @ baseline + keep @ system
    scores = [_scores(metric, side) for side in (side_a, side_b)]
    return _p_value(np.abs(scores[0] - scores[1]), observed)


def paired_p_values(
    baseline: list[list[str]], system: list[list[str]], refs: list[str]
) -> dict[str, float]:
    """Two-sided p-values of the BLEU difference, {"bs": p, "ar": p}, resampling source sentences.

    Args:
        baseline, system: one list of hypotheses per seed, seed k of one beside seed k of the other,
            each as long as `refs`.
        refs: the references, one a source sentence.
    """
    metric = _metric(refs)
    a, b = sentence_stats(metric, baseline), sentence_stats(metric, system)
    return {"bs": bootstrap_p(metric, a, b), "ar": randomization_p(metric, a, b)}
