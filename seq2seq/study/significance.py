"""The tests of each pair of a study's variants, as the report gives them: per line (seed k against
seed k, and all common seeds together) BLEU and chrF with Kocmi et al.'s accuracy at each difference,
the paired tests over source sentences (`seq2seq.study.paired`), on the all-seeds line Welch's t over
the seeds (`seq2seq.study.welch`), and every test's Holm adjustment over the table, each test a family;
and that table as Markdown.
"""

from typing import Any

from seq2seq.errors import UserError
from seq2seq.study.agreement import COIN_TOSS, delta_for, pairwise_accuracy
from seq2seq.study.paired import TESTS, paired_p_values
from seq2seq.study.spec import Run
from seq2seq.study.welch import welch_test

ALPHA = 0.05  # Holm-adjusted p-values below it are set in bold


def significance(
    pairs: list[tuple[str, str]],
    seeds: list[int],
    results: dict[Run, dict[str, Any]],
    refs: list[str],
) -> list[dict[str, Any]]:
    """For each pair of variants: seed k against seed k, and all common seeds together, tested over
    source sentences (the all-seeds line resamples each sentence with every seed's outputs of it),
    and on the all-seeds line Welch's t over the per-seed BLEU of the lines above it. Each test's
    p-values are also Holm-adjusted over the rows that have one (bootstrap, AR and Welch each a
    family). Beside the BLEU and chrF differences, Kocmi et al.'s accuracy at that difference."""
    from sacrebleu.metrics import BLEU, CHRF

    rows = []
    for a, b in pairs:
        common = [s for s in seeds if Run(a, s) in results and Run(b, s) in results]
        groups = [([s], str(s)) for s in common]
        if len(common) >= 2:
            groups.append((common, "all"))
        per_seed: dict[str, list[float]] = {"a": [], "b": []}  # BLEU of each seed's line
        for group, label in groups:
            by_seed_a = [results[Run(a, s)]["hyps"] for s in group]
            by_seed_b = [results[Run(b, s)]["hyps"] for s in group]
            for seed, hyps in zip([*group, *group], [*by_seed_a, *by_seed_b], strict=True):
                if len(hyps) != len(refs):
                    raise UserError(f"{a}/{b} seed {seed}: {len(hyps)} hypotheses for "
                                    f"{len(refs)} references")  # fmt: skip
            hyps_a = [line for hyps in by_seed_a for line in hyps]  # seed by seed, in seed order
            hyps_b = [line for hyps in by_seed_b for line in hyps]
            refs_all = refs * len(group)
            bleu, chrf = BLEU(), CHRF()
            score_a = bleu.corpus_score(hyps_a, [refs_all]).score
            score_b = bleu.corpus_score(hyps_b, [refs_all]).score
            chrf_a = chrf.corpus_score(hyps_a, [refs_all]).score
            chrf_b = chrf.corpus_score(hyps_b, [refs_all]).score
            p = paired_p_values(by_seed_a, by_seed_b, refs)
            welch = welch_test(per_seed["a"], per_seed["b"]) if label == "all" else None
            if label != "all":
                per_seed["a"].append(score_a)
                per_seed["b"].append(score_b)
            rows.append({"baseline": a, "system": b, "seeds": label, "bleu_baseline": score_a,
                         "bleu_system": score_b, "delta": score_b - score_a,
                         "bleu_accuracy": pairwise_accuracy("bleu", score_b - score_a),
                         "chrf_baseline": chrf_a, "chrf_system": chrf_b,
                         "chrf_delta": chrf_b - chrf_a,
                         "chrf_accuracy": pairwise_accuracy("chrf", chrf_b - chrf_a),
                         "p_bs": p["bs"], "p_ar": p["ar"],
                         "welch_t": welch["t"] if welch else None,
                         "welch_df": welch["df"] if welch else None,
                         "p_welch": welch["p"] if welch else None})  # fmt: skip
    for test in [*TESTS, "welch"]:
        family = [row for row in rows if row[f"p_{test}"] is not None]
        adjusted = holm([row[f"p_{test}"] for row in family])
        for row in rows:
            row[f"p_{test}_holm"] = None
        for row, value in zip(family, adjusted, strict=True):
            row[f"p_{test}_holm"] = value
    return rows


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment (Holm 1979) of a family of m p-values, in their given order: the
    i-th smallest (i from 1) times m - i + 1, made non-decreasing in that order, at most 1. An adjusted
    p below alpha rejects with the chance of any false rejection in the family at most alpha, whatever
    the dependence between the tests."""
    m = len(p_values)
    adjusted, floor = [0.0] * m, 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        floor = max(floor, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = floor
    return adjusted


def _p(value: float | None) -> str:
    if value is None:
        return "-"
    return f"**{value:.4f}**" if value < ALPHA else f"{value:.4f}"


def _raw_p(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _judged(delta: float, accuracy: float) -> str:
    """A difference with Kocmi et al.'s accuracy at it: `+1.48 (~66%)`, or `+0.10 (coin toss)`."""
    share = f"~{accuracy:.0%}" if accuracy >= COIN_TOSS else "coin toss"
    return f"{delta:+.2f} ({share})"


def significance_table(rows: list[dict[str, Any]]) -> list[str]:
    """The paired tests' section of the report, its table and the note under it, as lines."""
    lines = [
        "",
        "## Significance of BLEU (over source sentences: bootstrap 1,000, approximate randomization "
        "10,000; over seeds: Welch's t; two-sided)",
        "",
        "| baseline | system | seeds | BLEU baseline | BLEU system | BLEU delta (accuracy) | chrF "
        "delta (accuracy) | p (bootstrap) | Holm | p (AR) | Holm | p (Welch, seeds) | Holm |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['baseline']} | {row['system']} | {row['seeds']} | {row['bleu_baseline']:.2f} | "
            f"{row['bleu_system']:.2f} | {_judged(row['delta'], row['bleu_accuracy'])} | "
            f"{_judged(row['chrf_delta'], row['chrf_accuracy'])} | {_raw_p(row['p_bs'])} | "
            f"{_p(row['p_bs_holm'])} | {_raw_p(row['p_ar'])} | {_p(row['p_ar_holm'])} | "
            f"{_raw_p(row.get('p_welch'))} | {_p(row.get('p_welch_holm'))} |"
        )
    counts = {test: sum(row.get(f"p_{test}") is not None for row in rows) for test in TESTS}
    welch = sum(row.get("p_welch") is not None for row in rows)
    note = (
        "Bootstrap and AR resample source sentences: would the difference hold on other test "
        "sentences, the trained models fixed? Holm: the p-value before it adjusted by Holm's method "
        f"over the {counts['bs']} bootstrap, {counts['ar']} AR and {welch} Welch test(s) of this "
        f"table, each test a family. Bold: adjusted p < {ALPHA}, a difference that holds with every "
        "test of its family taken into account."
    )
    note += (
        " Accuracy: Kocmi et al. 2024's pairwise accuracy at that difference, the share of system "
        "pairs in which the metric orders the two systems as human judges do (whichever it puts "
        'ahead), from their fit (ACL, "Navigating the Metrics Maze"; '
        "github.com/kocmitom/MT-Thresholds) over the system pairs of their human evaluations; what "
        "a difference means to people, not whether it is noise. `coin toss`: the fit falls below "
        f"50%, under {delta_for('bleu', COIN_TOSS):.2f} BLEU or "
        f"{delta_for('chrf', COIN_TOSS):.2f} chrF."
    )
    if any(row["seeds"] == "all" for row in rows):
        note = (
            "`all`: each variant's hypotheses of every seed concatenated in seed order for its "
            "BLEU and chrF; each bootstrap resample or AR trial draws or swaps source sentences "
            "with every seed's outputs of them at once (one draw for every seed). Welch, on the "
            "`all` line: Welch's t over the two variants' per-seed BLEU (the seed lines above it): "
            "would the difference hold over other training runs, given how far the seeds spread? "
            f"{note}"
        )
    return [*lines, "", note]
