"""What a metric difference means to people: Kocmi et al.'s accuracy at that difference, the share of
system pairs that the metric orders as human judges do, given the size of the difference (not a share
of judges: each pair's human ranking is one verdict, from many judgements).

The fit is Kocmi, Zouhar, Federmann and Post (2024), "Navigating the Metrics Maze: Reconciling Score
Magnitudes and Accuracies", ACL 2024 (Long Papers), pages 1999-2014,
https://aclanthology.org/2024.acl-long.110, with its coefficients as the authors publish them in
github.com/kocmitom/MT-Thresholds (`python-tool/mt_thresholds.py`, the `mt-thresholds` package 1.0.2,
and `web-tool/src/thresholds.json`, which agree). For a metric difference delta between two systems,
the pairwise accuracy, the share of system pairs in which human judges rank the two systems the way
the metric does, is fitted as a scaled sigmoid:

    accuracy(delta) = a / (1 + exp(-b * delta))         (a in percent)

    BLEU: a = 88.33333333333225, b = 0.9663926931178954
    chrF: a = 92.999999999972,   b = 1.1142732157139852

The paper's table of thresholds (`appendix/main_thresholds.tex` in the repository) reads the same
fit backwards: BLEU 0.27 for 50% ("coin toss"), 1.06 for 65%, 2.34 for 80%, 3.35 for 85%, never 90%;
chrF 0.14, 0.76, 1.63, 2.12, and 3.05 for 90%.

What it is, and what it is not:
- The fit is over the 6,530 system pairs of ToShip23, the paper's large set of human evaluations of
  MT systems across many language pairs (with WMT's human evaluations as a check), not over Multi30k
  nor over small research models. It transfers to our pairs only as an estimate.
- It says how often the human ranking agrees with the metric's direction at that difference, not
  whether the difference is real: that is the significance tests' question (`seq2seq.study.report`).
  A large difference can be seed noise, and a significant one can be too small for people to notice.
- The sign of delta only says which system the metric prefers; the accuracy is the same either way
  (the fit is used at |delta|), and it concerns the system ahead on the metric.
- The fit has no floor at 50%: below |delta| 0.27 BLEU or 0.14 chrF it falls under a coin toss (44%
  for BLEU at 0), which means the metric's direction tells nothing, not that people prefer the other
  system. It also has a ceiling below 100%: a (88.3% for BLEU, 93% for chrF).
- The paper finds the string metrics much weaker between unrelated systems than between iterations of
  one system (BLEU's accuracy 59.1% against 74.8%, `appendix/accuracy_results.tex`); a Transformer
  against a GRU is the unrelated case, where the estimate is likely optimistic.
"""

import math

# metric -> (a, b) of accuracy(delta) = a / (1 + exp(-b * delta)), a in percent; MT-Thresholds'
# published coefficients for sacreBLEU's BLEU and chrF.
FITS = {
    "bleu": (88.33333333333225, 0.9663926931178954),
    "chrf": (92.999999999972, 1.1142732157139852),
}
COIN_TOSS = 0.5  # below it the fit says the metric's direction is no better than chance


def _fit(metric: str) -> tuple[float, float]:
    if metric not in FITS:
        raise ValueError(f"no published accuracy fit for metric {metric!r}; known: {sorted(FITS)}")
    a, b = FITS[metric]
    return a / 100, b


def pairwise_accuracy(metric: str, delta: float) -> float:
    """Kocmi et al.'s accuracy (0..1) of `metric` ("bleu" or "chrf") at a difference of `delta`
    points: the share of system pairs that differ by that much in which the human ranking puts ahead
    the system the metric puts ahead; the same for -delta."""
    a, b = _fit(metric)
    return a / (1 + math.exp(-b * abs(delta)))


def delta_for(metric: str, accuracy: float) -> float:
    """The smallest difference in `metric` at which the fit reaches `accuracy` (0..1); the inverse of
    `pairwise_accuracy` on delta >= 0. Raises ValueError where the fit never reaches it."""
    a, b = _fit(metric)
    if not a / 2 <= accuracy < a:
        raise ValueError(
            f"{metric}: the fit ranges over [{a / 2:.4f}, {a:.4f}); {accuracy} is outside it"
        )
    return -math.log(a / accuracy - 1) / b
