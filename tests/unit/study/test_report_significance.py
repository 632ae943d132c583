"""The report's tests of a difference: the paired tests over source sentences (one seed: sacrebleu's
own; several: each sentence resampled with every seed's outputs of it) and Welch's t over seeds,
against values derived here another way."""

import math
import random

import numpy as np
import pytest
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from seq2seq.study.paired import TESTS, draw_sentences, paired_p_values, sentence_stats
from seq2seq.study.welch import betainc, t_two_sided_p, welch_test

WORDS = (
    "the a cat dog sat on mat ran far home with red blue big small house tree under over".split()
)


def sentences(n: int = 40) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))) for _ in range(n)]


def cut(refs: list[str], every: int, offset: int, words: int) -> list[str]:
    """The references with `words` final words dropped from every `every`-th sentence."""
    return [" ".join(r.split()[:-words]) if (i + offset) % every == 0 else r
            for i, r in enumerate(refs)]  # fmt: skip


def sacrebleu_p(baseline: list[str], system: list[str], refs: list[str], test: str) -> float:
    """sacrebleu's own paired test of the files as given (its seed, its default counts)."""
    paired = PairedTest([("baseline", baseline), ("system", system)],
                        {"BLEU": BLEU(references=[refs])}, references=None, test_type=test,
                        n_samples=TESTS[test])  # fmt: skip
    return paired()[1]["BLEU"][1].p_value


def test_one_seed_is_sacrebleus_own_paired_test():
    refs = sentences()
    a, b = cut(refs, 4, 0, 1), cut(refs, 4, 1, 2)
    p = paired_p_values([a], [b], refs)
    assert p == {test: sacrebleu_p(a, b, refs, test) for test in TESTS}
    assert 0.01 < p["bs"] < 0.5 and 0.01 < p["ar"] < 0.5  # a case neither floor nor ceiling


def test_seeds_are_resampled_with_their_source_sentence():
    # Three seeds that translate every sentence alike carry no more evidence than one: resampled by
    # source sentence, the test gives the one seed's p. Pooled as 3 x 40 independent outputs
    # (sacrebleu on the concatenated files), the same outputs look three times the evidence.
    refs = sentences()
    a, b = cut(refs, 4, 0, 1), cut(refs, 4, 1, 2)
    one = paired_p_values([a], [b], refs)
    assert paired_p_values([a] * 3, [b] * 3, refs) == one
    assert sacrebleu_p(a * 3, b * 3, refs * 3, "bs") < one["bs"] / 3


def test_a_sentences_row_holds_every_seeds_output_of_it():
    # What a bootstrap draw takes: row i of the statistics is sentence i of seed 1 plus sentence i
    # of seed 2, so one drawn index brings in that sentence for every seed.
    refs = sentences(12)
    seed1, seed2 = cut(refs, 2, 0, 1), cut(refs, 3, 0, 2)
    metric = BLEU(references=[refs])
    rows = sentence_stats(metric, [seed1, seed2])
    for i in range(len(refs)):
        alone = [BLEU(references=[[refs[i]]])._extract_corpus_statistics([h[i]], None)[0]
                 for h in (seed1, seed2)]  # fmt: skip
        assert rows[i].tolist() == (np.array(alone[0]) + np.array(alone[1])).tolist()
    # the concatenated outputs' corpus BLEU is the BLEU of the rows' sum
    whole = BLEU().corpus_score(seed1 + seed2, [refs * 2]).score
    assert metric._compute_score_from_stats(rows.sum(0)).score == pytest.approx(whole)
    idxs = draw_sentences(len(refs), 50)
    assert idxs.shape == (50, len(refs)) and idxs.min() >= 0 and idxs.max() < len(refs)


def density_integral_p(t: float, df: float, steps: int = 20000) -> float:
    """Two-sided tail of Student's t by Simpson's rule on its density over [0, |t|]."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(x: float) -> float:
        return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))

    h = abs(t) / steps
    total = density(0.0) + density(abs(t))
    total += sum((4 if k % 2 else 2) * density(k * h) for k in range(1, steps))
    return 1.0 - 2.0 * total * h / 3.0


def test_welch_equals_a_hand_computation():
    a, b = [41.01, 40.92, 41.45], [42.74, 41.80, 42.22]
    # means 41.1267 and 42.2533; sample variances 0.0804 and 0.2212 (sums of squares over n - 1)
    mean_a, mean_b = sum(a) / 3, sum(b) / 3
    var_a = sum((x - mean_a) ** 2 for x in a) / 2
    var_b = sum((x - mean_b) ** 2 for x in b) / 2
    se2 = var_a / 3 + var_b / 3
    t = (mean_b - mean_a) / math.sqrt(se2)
    df = se2**2 / ((var_a / 3) ** 2 / 2 + (var_b / 3) ** 2 / 2)
    result = welch_test(a, b)
    assert result["t"] == pytest.approx(t) and result["df"] == pytest.approx(df)
    assert 2 < df < 4  # Welch's df: between the smaller side's n - 1 and n_a + n_b - 2
    assert result["p"] == pytest.approx(density_integral_p(t, df), abs=1e-7)
    swapped = welch_test(b, a)
    assert swapped["p"] == pytest.approx(result["p"]) and swapped["t"] == pytest.approx(-t)
    assert welch_test([1.0, 1.0], [2.0, 2.0]) is None and welch_test([1.0], [2.0, 3.0]) is None


def test_t_tails_match_closed_forms():
    # df 1 is the Cauchy distribution, df 2 has a closed-form tail: 1 - |t| / sqrt(2 + t^2).
    for t in (0.0, 0.3, 1.0, 2.5, 12.0, -4.0):
        assert t_two_sided_p(t, 1.0) == pytest.approx(1 - 2 / math.pi * math.atan(abs(t)))
        assert t_two_sided_p(t, 2.0) == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t))
    # two equal-variance samples of two give Welch's df = 2: means 2 and 5, variances 2 and 2,
    # so t = 3 / sqrt(2 / 2 + 2 / 2)
    result = welch_test([1.0, 3.0], [4.0, 6.0])
    t = 3 / math.sqrt(2)
    assert result["df"] == pytest.approx(2.0) and result["t"] == pytest.approx(t)
    assert result["p"] == pytest.approx(1 - t / math.sqrt(2 + t * t))
    # I_x(a, 1) = x^a and the symmetry I_x(a, b) = 1 - I_{1-x}(b, a)
    assert betainc(2.5, 1.0, 0.3) == pytest.approx(0.3**2.5)
    assert betainc(1.5, 4.0, 0.8) == pytest.approx(1 - betainc(4.0, 1.5, 0.2))
