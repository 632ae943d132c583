"""What a metric difference means to people: the share of human judges expected to agree with the
metric on which of two systems is better, given the size of the difference.

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
- It says how often humans would agree with the metric's direction at that difference, not whether the
  difference is real: that is the paired tests' question (`seq2seq.study.report`). A large difference
  can be seed noise, and a significant one can be too small for people to notice.
- The sign of delta only says which system the metric prefers; the agreement is the same either way
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
        raise ValueError(f"no published agreement fit for metric {metric!r}; known: {sorted(FITS)}")
    a, b = FITS[metric]
    return a / 100, b


def human_agreement(metric: str, delta: float) -> float:
    """The share of human judges (0..1) expected to agree with `metric` ("bleu" or "chrf") on which of
    two systems is better, when their scores differ by `delta` points; the same for -delta (it
    concerns whichever system the metric puts ahead)."""
    a, b = _fit(metric)
    return a / (1 + math.exp(-b * abs(delta)))


def delta_for(metric: str, agreement: float) -> float:
    """The smallest difference in `metric` at which the fit reaches `agreement` (0..1); the inverse of
    `human_agreement` on delta >= 0. Raises ValueError where the fit never reaches it."""
    a, b = _fit(metric)
    if not a / 2 <= agreement < a:
        raise ValueError(
            f"{metric}: the fit ranges over [{a / 2:.4f}, {a:.4f}); {agreement} is outside it"
        )
    return -math.log(a / agreement - 1) / b
