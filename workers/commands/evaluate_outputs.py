"""The files of ``reval evaluate``: ``results.json`` / ``.csv``, ``synonyms.md``, ``cores.md``,
``curves.png`` (:func:`write_outputs`), and the check that ``--out`` holds no earlier run's."""

from __future__ import annotations

import csv
import json
from dataclasses import fields
from pathlib import Path

import numpy as np

from workers.adapters.files.feeds import check_output_path
from workers.commands.evaluate import Experiment
from workers.commands.evaluate_summary import Cell

#: The columns of ``results.csv``: each cell's p-core, then its fields.
CSV_COLUMNS = ("core", *(f.name for f in fields(Cell)))

# --------------------------------------------------------------------------- outputs


RESULT_FILES = frozenset(
    {
        "results.json",
        "results.csv",
        "recommendations.jsonl",
        "synonyms.md",
        "curves.png",
        "timings.json",
        "cores.md",
        "thesauri",
    }
)


def check_results_dir(
    out: Path, *, replace: bool, files: frozenset[str] = RESULT_FILES, command: str = "reval evaluate"
) -> None:
    """Refuse to write results anywhere but a new or empty directory, or -- with
    ``replace`` -- one holding only ``files`` of an earlier run (never the user's files)."""
    if not out.exists() and not out.is_symlink():
        check_output_path(out)
        return
    if not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    present = {p.name for p in out.iterdir()}
    foreign = sorted(present - files)
    if foreign:
        raise ValueError(
            f"{out} holds files not written by {command} ({', '.join(foreign[:3])}): "
            "refusing to write there (choose a new directory)"
        )
    if present and not replace:
        raise ValueError(f"{out} already holds results: pass --force to replace them")


def write_outputs(experiment: Experiment, out_dir: str | Path, *, save_thesauri: bool = False) -> Path:
    """Write results.json/.csv, curves.png, synonyms.md, recommendations.jsonl, timings.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps(experiment.results_json(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    with open(out / "results.csv", "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for cell in experiment.cells:
            writer.writerow(
                [
                    "" if cell[c] is None else (f"{cell[c]:.6f}" if isinstance(cell[c], float) else cell[c])
                    for c in CSV_COLUMNS
                ]
            )
    with open(out / "recommendations.jsonl", "w", encoding="utf-8") as fh:
        for event in experiment.events:
            fh.write(json.dumps(event, ensure_ascii=False) + "\n")
    (out / "synonyms.md").write_text(synonyms_markdown(experiment), encoding="utf-8")
    if len(experiment.config.cores) > 1:
        (out / "cores.md").write_text(cores_markdown(experiment), encoding="utf-8")
    plot_curves(experiment, out / "curves.png")
    (out / "timings.json").write_text(json.dumps(experiment.timings, indent=2) + "\n", encoding="utf-8")
    if save_thesauri:
        for name, thesaurus in experiment.built.items():
            thesaurus.save(out / "thesauri" / name, replace=True)
    return out


def cores_markdown(experiment: Experiment) -> str:
    """Where the ranking of recommenders flips from the first p-core to the others."""
    config, found = experiment.config, experiment.core_flips()
    sizes = experiment.data["cores"]
    lines = [
        "# The ranking of recommenders on p-cores (paper 002)",
        "",
        "The p-core keeps each hashtag used in at least p kept tweets, each tweet with at least one "
        "kept hashtag (its ground truth: the hashtags it kept), each user with at least p kept tweets "
        "where the feed names users; every cell is recomputed on it (seeds pooled). A flip is a pair "
        "of recommenders in the opposite order by mean; *clear*: on both cores the two 95% intervals "
        "are apart.",
        "",
        "| core | tweets | hashtags |",
        "|---:|---:|---:|",
        *(f"| {level} | {info['tweets']:,} | {info['hashtags']:,} |" for level, info in sizes.items()),
        "",
    ]
    if not found:
        return "\n".join([*lines, f"The ranking never flips against the {config.cores[0]}-core.", ""])
    clear = sum(1 for f in found for pair in f["flips"] if pair["clear"])
    lines += [
        f"{len(found)} cells flip ({clear} clear pair flips); rankings best first.",
        "",
        "| metric | embedding, hubness | r | k | cores | ranking before | ranking after | flips |",
        "|---|---|---:|---:|---|---|---|---|",
    ]
    for f in found:
        before, after = (f["ranking"][str(f[key])] for key in ("from_core", "to_core"))
        pairs = ", ".join(
            f"{p['above']} > {p['below']}" + (" (clear)" if p["clear"] else "") for p in f["flips"]
        )
        metric = "corrected" if f["metric"] == "reval_hit_ratio_corrected" else "#REval"
        split = f", {f['split']} split" if len(config.splits) > 1 else ""
        lines.append(
            f"| {metric}{split} | {f['variant']}, {f['hubness']} | {f['r']} | {f['k']} | "
            f"{f['from_core']} → {f['to_core']} | {', '.join(before)} | {', '.join(after)} | {pairs} |"
        )
    return "\n".join(lines) + "\n"


def synonyms_markdown(experiment: Experiment) -> str:
    """The paper's Table 5 for the most used training hashtags, and each thesaurus's hubs."""
    n = experiment.config.n_synonyms
    keys = list(experiment.synonyms)
    lines = [
        f"# The {n} nearest synonyms of the {len(experiment.top_hashtags)} most used training hashtags",
        "",
        f"First split and seed ({experiment.config.splits[0]}, {experiment.config.seeds[0]}).",
        "",
        "| Hashtag (training tweets) | " + " | ".join(_key_label(experiment, k) for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for tag, count in experiment.top_hashtags:
        cells = [", ".join(f"#{s}" for s in experiment.synonyms[k][tag]) for k in keys]
        lines.append(f"| #{tag} ({count}) | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Hubs: the hashtags among the 10 nearest of the most others (N_10)",
        "",
        "| thesaurus | skewness of N_10 | largest N_10 (share) | lists reaching a top-10 hub | top hubs |",
        "|---|---:|---:|---:|---|",
    ]
    for key in keys:
        report = experiment.thesauri[key]["hubness"]
        hubs = ", ".join(f"#{h} ({c})" for h, c in experiment.hubs[key][:10])
        lines.append(
            f"| {_key_label(experiment, key)} | {report['skewness']:.2f} | {report['max']} "
            f"({100 * report['max_share']:.1f}%) | {100 * report['share_with_hub']:.1f}% | {hubs} |"
        )
    return "\n".join(lines) + "\n"


def _key_label(experiment: Experiment, key: str) -> str:
    info = experiment.thesauri[key]
    return f"{info['label']}, {info['hubness_method']}"


_STYLE = {"bertag": ("tab:blue", "o"), "word2vec": ("tab:green", "s"), "fasttext": ("tab:orange", "^")}
_BASELINE_STYLE = {"popular": ("black", "-"), "least-popular": ("tab:red", ":"), "random": ("tab:gray", "--")}


def _series(
    experiment: Experiment, variant: str, recommender: str, r: int, fields: tuple[str, str, str]
) -> list[list[float]]:
    """The mean, low and high of a curve over k (NaN where unscorable)."""
    cells = [
        experiment.cell(variant=variant, recommender=recommender, r=r, k=k) for k in experiment.config.ks
    ]
    return [[np.nan if c[name] is None else c[name] for c in cells] for name in fields]


def plot_curves(experiment: Experiment, path: str | Path) -> None:
    """#REval-hit-ratio (top row) and its chance-corrected value (bottom row) against k,
    one panel per r: the main recommender per embedding with 95% bands, and on the first
    embedding the baselines -- popular, the least-popular canary, the random null."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = experiment.config
    rs, ks = list(config.rs), list(config.ks)
    main = config.recommender_names[0]
    fig, axes = plt.subplots(2, len(rs), figsize=(4.4 * len(rs), 7.2), sharex=True, squeeze=False)
    for row, (metric, low, high) in enumerate(
        (
            ("reval_hit_ratio", "ci_low", "ci_high"),
            ("reval_hit_ratio_corrected", "corrected_ci_low", "corrected_ci_high"),
        )
    ):
        for ax, r in zip(axes[row], rs, strict=True):
            fields = (metric, low, high)
            for variant in config.embeddings:
                colour, marker = _STYLE[variant]
                ys, lo, hi = _series(experiment, variant, main, r, fields)
                ax.plot(ks, ys, marker=marker, color=colour, label=f"{main}, {experiment.labels[variant]}")
                ax.fill_between(ks, lo, hi, color=colour, alpha=0.15, linewidth=0)
            first = config.embeddings[0]
            for name in config.recommender_names[1:]:
                colour, style = _BASELINE_STYLE.get(name, ("tab:purple", "-."))
                ys, lo, hi = _series(experiment, first, name, r, fields)
                ax.plot(ks, ys, linestyle=style, color=colour, label=f"{name}, {experiment.labels[first]}")
                ax.fill_between(ks, lo, hi, color=colour, alpha=0.08, linewidth=0)
            if row == 1:
                ax.axhline(0.0, color="tab:gray", linewidth=0.8)
                ax.set_xlabel("k (number of synonyms)")
            ax.set_title(f"top-{r} recommendations")
            ax.set_xticks(ks)
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel("#REval-hit-ratio" if row == 0 else "chance-corrected #REval")
    axes[0][-1].legend(loc="upper left", fontsize="x-small")
    d = experiment.data
    fig.suptitle(
        f"{config.splits[0]} split, seeds {', '.join(map(str, config.seeds))} pooled, hubness "
        f"{config.hubness[0]}: {d['train_tweets']:,} training / {d['test_tweets']:,} test tweets per seed; "
        "bands: 95% bootstrap",
        fontsize="medium",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
