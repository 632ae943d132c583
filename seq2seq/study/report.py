"""A study's report, built from its folder alone (study.json, runs/*/result.json and hypotheses).

For each variant: mean, sample standard deviation and 95% confidence interval over seeds (Student's t)
of every figure. For each pair of variants, two questions about the BLEU difference:

- would it hold on other test sentences, the trained models fixed? Paired bootstrap resampling
  (1,000 resamples) and approximate randomization (10,000 trials) over source sentences
  (`seq2seq.study.paired`: sacrebleu's tests, its seed and counts): seed k of one variant against seed
  k of the other, and once over all common seeds together, where each resample draws source
  sentences with every seed's outputs of them (one draw for every seed), since the seeds translate
  the same sentences;
- would it hold over other training runs? Welch's t over the two variants' per-seed BLEU
  (`seq2seq.study.welch`), on the all-seeds line: the training noise between seeds.

Clark et al. 2011 ask for several runs a variant, with their mean and deviation, beside the test over
sentences. The first variant of the spec is the baseline of each test's line; the tests are
two-sided. Each p-value is shown beside its Holm adjustment over every line of the table that has one
(bootstrap, approximate randomization and Welch each a family), and only adjusted p-values below
`seq2seq.study.significance.ALPHA` are set in bold: a table of many tests finds some p < 0.05 by
chance alone. Beside each line's BLEU and chrF differences, Kocmi et al. 2024's accuracy at that
difference (`seq2seq.study.agreement`: the share of system pairs that the metric orders as human
judges do, from their published fit), what the difference means to people beside whether it is
noise. The table and its tests: `seq2seq.study.significance`.

`others` (`study.py report DIR --with DIR2`): the finished runs of other study folders join the
report as variants `<DIR2's name>/<variant>`, tested against this study's variants seed k against
seed k, once their split, beam and references are this study's (refused in one line otherwise).

Writes `report.md`, `report.json` and `report.png` (every seed a point beside the mean and interval;
BLEU, and AER when the study has a silver standard) into the study folder.
"""

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

from seq2seq.atomic import atomic_write, atomic_write_text
from seq2seq.errors import UserError
from seq2seq.study.layout import Study
from seq2seq.study.significance import significance, significance_table
from seq2seq.study.spec import Run, StudySpec

# Figures reported per variant: (key in result.json, column title, digits).
FIGURES = (
    ("bleu", "BLEU", 2),
    ("bleu_lowercase", "BLEU lowercased", 2),  # from the hypotheses, as published figures often are
    ("chrf", "chrF", 2),
    ("aer", "AER", 4),
    ("attn_entropy", "entropy (nats)", 3),
    ("max_weight", "max weight", 3),
    ("score_std", "score sd", 3),
    ("train_hours", "hours", 2),
    ("tokens_per_sec", "tokens/s", 0),
)
# Student's t at 0.975 for 1..30 degrees of freedom (two-sided 95%); beyond 30 the Cornish-Fisher
# expansion below agrees with the exact quantile to 1e-4.
T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010,
        2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739,
        2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)  # fmt: skip


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom."""
    if df <= len(T975):
        return T975[df - 1]
    z = statistics.NormalDist().inv_cdf(0.975)
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def summarize(values: list[float]) -> dict[str, Any]:
    """n, mean, sample sd and the 95% interval's half-width (None where n is too small)."""
    n = len(values)
    mean = statistics.fmean(values) if values else None
    sd = statistics.stdev(values) if n >= 2 else None
    half = t975(n - 1) * sd / math.sqrt(n) if sd is not None else None
    return {"n": n, "mean": mean, "sd": sd, "ci95": half, "values": values}


def load_results(study: Study, spec: StudySpec) -> dict[Run, dict[str, Any]]:
    """Each finished run's result.json with its hypotheses (`hyps`, a list of lines)."""
    results = {}
    for run in spec.runs():
        if study.state(run) != "done":
            continue
        results[run] = study.load_result(run)
    return results


def references(spec: StudySpec) -> tuple[list[str], str]:
    """The references of the study's split, from the corpus its flags name, and that corpus and
    direction in words (`multi30k de->en`)."""
    from seq2seq.data.corpus import read_pairs, resolve_corpus
    from seq2seq.training.config import parse_args

    first = next(iter(spec.variants.values()))
    cfg = parse_args([*spec.flags, *first])
    # In the current folder, where the study's `seq2seq train` children found the corpus by name.
    source = resolve_corpus(cfg.dataset, cfg.data_dir)
    refs = read_pairs(source, source.find_split(spec.split), cfg.src, cfg.tgt).tgt
    return refs, f"{source.name} {cfg.src}->{cfg.tgt}"


def referenced_runs(
    study: Study, spec: StudySpec, refs: list[str], corpus: str, others: list[Study]
) -> tuple[list[str], dict[Run, dict[str, Any]]]:
    """The variants and finished runs of the other study folders `others`, named `<folder>/<variant>`,
    each folder refused in one line unless its runs were scored on the same split, with the same
    beam, against the same references as this study's."""
    names, results = [], {}
    for other in others:
        where = f"--with {other.shown}"
        if other.folder.resolve() == study.folder.resolve():
            raise UserError(f"{where}: is this study's own folder; name another study's")
        if not other.spec_path.is_file():
            raise UserError(f"{where}: no study.json there; name a study's folder")
        other_spec = other.load_spec()
        if (other_spec.split, other_spec.beam) != (spec.split, spec.beam):
            raise UserError(
                f"{where}: its runs are scored on {other_spec.split} with beam {other_spec.beam}, "
                f"this study's on {spec.split} with beam {spec.beam}; only runs scored alike pair"
            )
        other_refs, other_corpus = references(other_spec)
        if other_refs != refs:
            raise UserError(
                f"{where}: its references ({other_corpus}, {other_spec.split}) are not this "
                f"study's ({corpus}, {spec.split}); only runs of the same sentences pair"
            )
        for variant in other_spec.variants:
            name = f"{other.folder.name}/{variant}"
            if name in names:
                raise UserError(f"{where}: a second study folder named {other.folder.name}")
            names.append(name)
        for run, result in load_results(other, other_spec).items():
            name = f"{other.folder.name}/{run.variant}"
            results[Run(name, run.seed)] = {**result, "variant": name}
    return names, results


def build_report(study: Study, others: list[Study] | None = None) -> list[Path]:
    """Write report.json, report.md and report.png; returns their paths. The finished runs of the
    study folders `others` join as variants `<folder>/<variant>`, each tested against this study's
    variants (not against each other: that is their own study's report)."""
    spec = study.load_spec()
    results = load_results(study, spec)
    if not results:
        raise UserError(f"{study.shown}: no finished run to report yet (study.py status)")
    refs, corpus = references(spec)
    own = list(spec.variants)
    names, referenced = referenced_runs(study, spec, refs, corpus, others or [])
    results.update(referenced)
    from seq2seq.decoding.metrics import corpus_bleu

    for result in results.values():  # every run, those scored before this figure existed too
        result["bleu_lowercase"] = corpus_bleu(result["hyps"], refs, lowercase=True).value
    seeds = list(dict.fromkeys([*spec.seeds, *(run.seed for run in referenced)]))
    variants = {}
    for variant in [*own, *names]:
        runs = [results[Run(variant, s)] for s in seeds if Run(variant, s) in results]
        variants[variant] = {
            key: summarize([r[key] for r in runs if r.get(key) is not None])
            for key, _, _ in FIGURES
        }
        variants[variant]["seeds"] = [r["seed"] for r in runs]
    pairs = [(a, b) for a, b in itertools.combinations([*own, *names], 2) if a in own]
    report = {
        "spec": json.loads(spec.to_json()),
        "with": [other.shown for other in others or []],
        "variants": variants,
        "significance": significance(pairs, seeds, results, refs),
        "runs": [{k: v for k, v in r.items() if k != "hyps"} for r in results.values()],
    }
    paths = [study.folder / "report.json", study.folder / "report.md", study.folder / "report.png"]
    atomic_write_text(paths[0], json.dumps(report, indent=2) + "\n")
    atomic_write_text(paths[1], markdown(study, spec, report))
    plot(report, paths[2])
    return paths


def _cell(summary: dict[str, Any], digits: int) -> str:
    if not summary["n"]:
        return "-"
    text = f"{summary['mean']:.{digits}f}"
    if summary["sd"] is not None:
        text += f" ± {summary['sd']:.{digits}f} [±{summary['ci95']:.{digits}f}]"
    return text


def markdown(study: Study, spec: StudySpec, report: dict[str, Any]) -> str:
    """The report as Markdown: per-variant means, per-run rows, paired tests."""
    shown = [
        (k, t, d) for k, t, d in FIGURES if any(v[k]["n"] for v in report["variants"].values())
    ]
    others = report.get("with", [])
    rebuild = " ".join([study.shown, *(f"--with {other}" for other in others)])
    joined = (
        f" With the finished runs of {', '.join(f'`{other}`' for other in others)} as variants "
        "`<folder>/<variant>`, each tested against this study's variants."
        if others
        else ""
    )
    lines = [
        f"# Study `{study.shown}`",
        "",
        f"Variants x seeds {' '.join(map(str, spec.seeds))}, scored on `{spec.split}` with beam "
        f"{spec.beam}.{joined} Rebuild with `python scripts/study.py report {rebuild}`.",
        "",
        "## Per variant: mean ± sd [95% interval half-width] over seeds",
        "",
        "| variant | seeds | " + " | ".join(title for _, title, _ in shown) + " |",
        "|---|---|" + "---|" * len(shown),
    ]
    for name, figures in report["variants"].items():
        cells = [_cell(figures[key], digits) for key, _, digits in shown]
        seeds = " ".join(map(str, figures["seeds"]))
        lines.append(f"| {name} | {seeds} | " + " | ".join(cells) + " |")
    lines += significance_table(report["significance"])
    lines += [
        "",
        "## Runs",
        "",
        "| run | BLEU | chrF | AER | checkpoint | updates | hours | trained at | CPU |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        # in the order of the run's sittings: the commit it started at first
        commits = dict.fromkeys(s["commit"][:7] + ("+" if s["commit"].endswith("dirty") else "")
                                for s in r["trained"] if s.get("commit"))  # fmt: skip
        cpus = sorted({s["cpu"] for s in r["trained"] if s.get("cpu")})
        aer = f"{r['aer']:.4f}" if r.get("aer") is not None else "-"
        lines.append(
            f"| {r['variant']}-seed{r['seed']} | {r['bleu']:.2f} | {r['chrf']:.2f} | {aer} | "
            f"{r['checkpoint_rule']} | {r['updates']} | {r['train_hours']:.2f} | "
            f"{', '.join(commits)} | {'; '.join(cpus)} |"
        )
    first = report["runs"][0]
    lines += ["", f"Signatures: BLEU `{first['bleu_signature']}`, chrF `{first['chrf_signature']}`.",
              "Flags of each run: `report.json` (`runs[].flags`).", ""]  # fmt: skip
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """Every seed as a point beside its variant's mean and 95% interval; BLEU and AER panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("bleu", "BLEU (beam, test)"), ("aer", "AER (lower is better)")]
    keys = [(k, t) for k, t in keys if any(v[k]["n"] for v in report["variants"].values())]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
    names = list(report["variants"])
    for ax, (key, title) in zip(axes[0], keys, strict=True):
        for x, name in enumerate(names):
            summary = report["variants"][name][key]
            if not summary["n"]:
                continue
            ax.scatter([x - 0.12] * summary["n"], summary["values"], s=18, color="0.45", zorder=3)
            error = summary["ci95"] if summary["ci95"] is not None else 0.0
            ax.errorbar([x + 0.12], [summary["mean"]], yerr=[error], fmt="o", color="C0",
                        capsize=4, zorder=3)  # fmt: skip
        ax.set_xticks(range(len(names)), names)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("grey: one seed each; blue: mean and 95% interval", fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda file: fig.savefig(file, format="png", dpi=110))
    plt.close(fig)
