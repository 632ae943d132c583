"""A test over seeds: Welch's t on two variants' per-seed scores.

The paired tests (`seq2seq.study.paired`) ask whether a difference would hold on other test
sentences, the trained models fixed. This one asks whether it would hold over other training runs:
each seed's score is one draw of the training noise (initialisation, data order, dropout), and the
test compares the two variants' means over their seeds, given how far each variant's seeds spread.
With three seeds a side it has little power: only a difference large against the seeds' spread is
told apart.

Welch's t (Welch 1947, "The generalization of 'Student's' problem when several different population
variances are involved", Biometrika 34), with the Welch-Satterthwaite degrees of freedom, for
samples a and b of sizes n_a, n_b, means m_a, m_b and sample variances s_a^2, s_b^2:

    v_a = s_a^2 / n_a,   v_b = s_b^2 / n_b
    t   = (m_b - m_a) / sqrt(v_a + v_b)
    df  = (v_a + v_b)^2 / (v_a^2 / (n_a - 1) + v_b^2 / (n_b - 1))
    p   = P(|T_df| >= |t|) = I_{df / (df + t^2)}(df / 2, 1 / 2)    (two-sided)

where I_x(a, b) is the regularized incomplete beta function (DLMF 8.17.1; the t distribution's
tails, Abramowitz and Stegun 26.7.1 with 26.5.27), computed from its continued fraction (DLMF
8.17.22) by the modified Lentz method (Press et al., Numerical Recipes, 3rd ed., section 6.4). The
project has no scipy; torch's StudentT has no cdf.
"""

import math
import statistics
from typing import Any

_TINY = 1e-300  # keeps the continued fraction's denominators off zero (Lentz)
_EPS = 1e-15  # relative change at which the continued fraction has converged
_MAX_TERMS = 500


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (DLMF 8.17.22), by the modified Lentz method."""

    def step(value: float) -> float:
        return value if abs(value) > _TINY else _TINY

    c, d = 1.0, 1.0 / step(1.0 - (a + b) * x / (a + 1.0))
    h = d
    for m in range(1, _MAX_TERMS):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))  # d_{2m}
        d = 1.0 / step(1.0 + even * d)
        c = step(1.0 + even / c)
        h *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))  # d_{2m+1}
        d = 1.0 / step(1.0 + odd * d)
        c = step(1.0 + odd / c)
        h *= d * c
        if abs(d * c - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta ({a}, {b}, {x}): no convergence in {_MAX_TERMS} terms")


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast only below this point
        return 1.0 - betainc(b, a, 1.0 - x)
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    return math.exp(log_front) * _continued_fraction(a, b, x) / a


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom."""
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def welch_test(a: list[float], b: list[float]) -> dict[str, Any] | None:
    """Welch's t of b's mean against a's: {"t", "df", "p"} (p two-sided). None where it is not
    defined: fewer than two values a side, or no spread on either side."""
    if len(a) < 2 or len(b) < 2:
        return None
    v_a = statistics.variance(a) / len(a)
    v_b = statistics.variance(b) / len(b)
    if v_a + v_b == 0.0:
        return None
    t = (statistics.fmean(b) - statistics.fmean(a)) / math.sqrt(v_a + v_b)
    df = (v_a + v_b) ** 2 / (v_a**2 / (len(a) - 1) + v_b**2 / (len(b) - 1))
    return {"t": t, "df": df, "p": t_two_sided_p(t, df)}
