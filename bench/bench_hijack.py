"""Meaning shift you can act on: do hijacked hashtags rank as movers above stable ones?

Probe hashtags are attached to copies of real crisis tweets of a feed (default: the bundled
CrisisLexT26 sample), so many tweets *before* a cut and as many *after* it:

* **hijacked** -- tweets of one crisis before, of another crisis after: the meaning changed;
* **gradual** -- one crisis before; after, the other crisis's share grows from 0 to 1 over
  the period (half of the after tweets, the later ones mostly);
* **stable** -- the same crisis on both sides (different tweets): it did not.

at several sizes (``--sizes``: 20, 60, 200 tweets a side), beside every real hashtag of the
feed with at least ``--min-support`` tweets on both sides of the cut (the median event time).
What a "crisis" (a sense) is comes from the feed (``--senses``): ``crises``, the
CrisisLexT26 crises by their signature hashtags (:data:`CRISES`); ``hashtags``, any feed's own
most used hashtags, each a sense of the tweets that carry it and none of the others, a
hijack going only to a hashtag hardly ever used in the same tweet (two names of one sense,
#qldfloods and #bigwet, are not a change of meaning); ``auto`` (the
default) takes the crises when at least 3 of them have enough tweets, else the hashtags -- so the
benchmark runs on feeds that hold none of those crises.
A probe's copy keeps its tweet's text and gets the probe tag appended; it counts for the
probe only (the real hashtags keep their own tweets).  Everything is embedded with the
encoder (``--model``, default the packaged MiniLM, offline), unit-length as the embed worker
pools them, and summed per hashtag and side -- the window means' sums.

Each ranking of movers is reported for every probe: its rank among the compared hashtags, the
AUC of hijacked (and gradual) against stable probes, how many hijacked probes are in the top
10% and above every stable probe:

* ``versions, cosine`` -- what ``reval thesaurus diff`` ranked until now: the cosine between the
  all-time mean at the cut and the all-time mean at the end (the later tweets diluted by the
  earlier);
* ``recent, cosine`` -- the cosine of the mean after the cut against the mean before (the
  index job's ranking until now);
* ``effect`` -- the spread-aware test's point effect (:mod:`stream.synonyms.shift_test`): the
  shift of the mean in units of the hashtag's own spread (the ranking of the round before);
* ``versions, test`` -- what ``reval thesaurus diff`` ranks now (:func:`stream.synonyms.drift.compare`
  on two versions that record their raw means), and ``recent, test`` -- what the index job
  ranks now (:func:`stream.synonyms.drift.recent_shift`): both by the lower end of the
  effect's 95% interval (:func:`stream.synonyms.shift_test.mover_key`), taken as the order
  the product lists its movers in.

    python -m bench.bench_hijack                           # prints a markdown section
    python -m bench.bench_hijack --seeds 1,2,3 --out /tmp/hijack.md --json /tmp/hijack.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench.results import bench_command, publish
from stream.intake.cleaning import Prepared, prepare
from stream.synonyms.drift import DEFAULT_MIN_SUPPORT, Snapshot, compare, recent_shift
from stream.synonyms.shift_test import effective_dimension, shift_test
from workers.adapters.files.feeds import read_tweets, sample_feed

# Tweets of one crisis: the first of its signature hashtags a tweet carries (CrisisLexT26).
CRISES: dict[str, tuple[str, ...]] = {
    "singapore-haze": ("sghaze", "haze", "singapore"),
    "queensland-floods": ("bigwet", "qldfloods", "qld"),
    "alberta-floods": ("yycflood", "abflood", "yyc", "calgary"),
    "nsw-fires": ("nswfires", "nswrfs", "bushfires"),
    "bangladesh-collapse": ("bangladesh", "savar"),
    "russia-meteor": ("russianmeteor", "meteor"),
    "lax-shooting": ("lax", "laxshooting"),
    "colorado-floods": ("coflood", "boulderflood", "boulder", "cowx"),
    "boston-bombings": ("prayforboston", "bostonmarathon", "boston"),
    "philippines-floods": ("rescueph", "reliefph", "maringph", "floodph", "habagat"),
}
KINDS = ("hijacked", "gradual", "stable")
RANKINGS = ("versions, cosine", "recent, cosine", "effect", "versions, test", "recent, test")


@dataclass(frozen=True)
class Sides:
    """Per hashtag: count and sum of unit-length embeddings before and after the cut."""

    names: list[str]
    n_before: npt.NDArray[np.int64]
    s_before: npt.NDArray[np.float64]
    n_after: npt.NDArray[np.int64]
    s_after: npt.NDArray[np.float64]


def load(feed: Path) -> tuple[list[Prepared], list[float]]:
    kept, times = [], []
    for parsed in read_tweets([feed]):
        tweet = parsed.value
        if tweet is None or tweet.created_at is None:
            continue
        prepared = prepare(tweet)
        if isinstance(prepared, Prepared):
            kept.append(prepared)
            times.append(tweet.created_at.timestamp())
    return kept, times


def crisis_of(prepared: Prepared) -> str | None:
    for crisis, signature in CRISES.items():
        if any(tag in signature for tag in prepared.hashtags):
            return crisis
    return None


def crisis_senses(kept: Sequence[Prepared]) -> dict[str, list[int]]:
    """The tweets of each CrisisLexT26 crisis (:data:`CRISES`), by index in ``kept``."""
    by_crisis: dict[str, list[int]] = {}
    for i, prepared in enumerate(kept):
        crisis = crisis_of(prepared)
        if crisis is not None:
            by_crisis.setdefault(crisis, []).append(i)
    return by_crisis


#: How many of a feed's own hashtags become senses (``--senses hashtags``): as many as the
#: sample feed has crises.
HASHTAG_SENSES = 10


def hashtag_senses(kept: Sequence[Prepared], least: int, most: int = HASHTAG_SENSES) -> dict[str, list[int]]:
    """Senses from any feed: its hashtags used by at least ``least`` tweets, each with the tweets
    that carry it and none of the others (a tweet of two is no one sense's); the ``most`` with
    the most such tweets, at least ``least``.

    >>> def tweet(*tags): return Prepared(None, "t", tags, ())
    >>> kept = [tweet("a")] * 3 + [tweet("b")] * 2 + [tweet("a", "b"), tweet("c")]
    >>> hashtag_senses(kept, least=2)
    {'a': [0, 1, 2], 'b': [3, 4]}
    """
    used = Counter(h for p in kept for h in set(p.hashtags))
    candidates = {h for h, n in used.items() if n >= least}
    alone: dict[str, list[int]] = {}
    for i, prepared in enumerate(kept):
        own = candidates.intersection(prepared.hashtags)
        if len(own) == 1:
            alone.setdefault(own.pop(), []).append(i)
    ranked = sorted((h for h, rows in alone.items() if len(rows) >= least), key=lambda h: (-len(alone[h]), h))
    return {h: alone[h] for h in ranked[:most]}


Partners = Callable[[str, Sequence[str]], list[str]]
"""Given a sense and the senses usable at a size, those it may be hijacked to."""


#: Two hashtags used together in more than this share of the tweets of the rarer one are one
#: sense under two names (#qldfloods and #bigwet): no hijack from one to the other.
SHARED_USE = 0.01


def apart_partners(kept: Sequence[Prepared], senses: Sequence[str]) -> Partners:
    """Where a hashtag sense may be hijacked to: the senses hardly ever used in the same tweet
    as it (at most :data:`SHARED_USE` of the rarer one's tweets) -- no embedding decides, so
    a hijack between two close meanings (a flood for a flood) stays in the benchmark.

    >>> def tweet(*tags): return Prepared(None, "t", tags, ())
    >>> kept = [tweet("qldfloods", "bigwet")] * 5 + [tweet("qldfloods")] * 5 + [tweet("rescueph")] * 5
    >>> apart_partners(kept, ["qldfloods", "bigwet", "rescueph"])("qldfloods", ["bigwet", "rescueph"])
    ['rescueph']
    """
    wanted = set(senses)
    used: Counter[str] = Counter()
    together: Counter[tuple[str, str]] = Counter()
    for prepared in kept:
        own = sorted(wanted.intersection(prepared.hashtags))
        used.update(own)
        together.update((a, b) for i, a in enumerate(own) for b in own[i + 1 :])

    def partners(first: str, usable: Sequence[str]) -> list[str]:
        def shared(other: str) -> float:
            pair = (first, other) if first < other else (other, first)
            return together[pair] / max(1, min(used[first], used[other]))

        return [c for c in usable if c != first and shared(c) <= SHARED_USE]

    return partners


def any_other(first: str, usable: Sequence[str]) -> list[str]:
    """The crises' partners: every other crisis (each crisis is its own meaning)."""
    return [c for c in usable if c != first]


def probes(
    by_crisis: dict[str, list[int]],
    sizes: Sequence[int],
    per_kind: int,
    rng: np.random.Generator,
    partners: Partners = any_other,
) -> list[tuple[str, str, int, list[int], list[int]]]:
    """(name, kind, size, tweet indices before, after) of every probe; sizes no sense has
    the tweets for (twice the size for a stable probe, two senses for a hijack) are skipped."""
    out = []
    for size in sizes:
        big = [c for c, rows in by_crisis.items() if len(rows) >= 2 * size]
        usable = [c for c, rows in by_crisis.items() if len(rows) >= size]
        for kind in KINDS:
            for i in range(per_kind):
                if not (big if kind == "stable" else usable):
                    break
                first = big[i % len(big)] if kind == "stable" else usable[i % len(usable)]
                other = partners(first, usable)
                if not other and kind != "stable":
                    continue
                second = other[(i * 3 + 1) % len(other)] if other else first
                rows = rng.permutation(by_crisis[first]).tolist()
                before = rows[:size]
                if kind == "stable":
                    after = rows[size : 2 * size]
                else:
                    new = rng.permutation(by_crisis[second]).tolist()[:size]
                    if kind == "hijacked":
                        after = new
                    else:  # the new sense's share grows linearly over the after period
                        old_rest = rows[size:] or rows
                        after = [
                            new[j] if rng.random() < (j + 0.5) / size else old_rest[j % len(old_rest)]
                            for j in range(size)
                        ]
                name = f"probe_{kind}_{size}_{i}__{first}__{first if kind == 'stable' else second}"
                out.append((name, kind, size, before, after))
    return out


def auc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """P(a positive scores above a negative), ties half (higher score = moved more)."""
    if not positive or not negative:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in positive for n in negative)
    return wins / (len(positive) * len(negative))


def evaluate(sides: Sides, min_support: int) -> dict[str, dict[str, float]]:
    """Each ranking's score per compared hashtag (higher = moved more)."""
    keep = (sides.n_before >= min_support) & (sides.n_after >= min_support)
    rows = np.flatnonzero(keep)
    names = [sides.names[i] for i in rows]
    nb, sb, na, sa = sides.n_before[rows], sides.s_before[rows], sides.n_after[rows], sides.s_after[rows]

    def cos(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.einsum("ij,ij->i", a, b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))

    versions = 1.0 - cos(sb, sb + sa)  # all-time at the cut against all-time at the end
    recent = 1.0 - cos(sb, sa)
    shift = recent_shift(
        names, sb + sa, (nb + na).tolist(), sa, na.tolist(), min_support=min_support, top=len(names)
    )
    point = shift_test(nb, sb, na, sa).effect
    # what `reval thesaurus diff` ranks by now: the test from two versions' raw means and counts
    empty: list[list[str]] = [[] for _ in names]
    old = Snapshot(names, sb / nb[:, None], empty, counts=nb, means=sb / nb[:, None])
    total_n = nb + na
    new = Snapshot(
        names, (sb + sa) / total_n[:, None], empty, counts=total_n, means=(sb + sa) / total_n[:, None]
    )
    diff = compare(old, new, min_support=min_support, top=len(names))
    assert diff.ranked_by == "effect_low"

    def order(ranked: Sequence[str]) -> dict[str, float]:  # the product's order as a score
        return {h: float(len(ranked) - i) for i, h in enumerate(ranked)}

    return {
        "versions, cosine": dict(zip(names, versions.tolist(), strict=True)),
        "recent, cosine": dict(zip(names, recent.tolist(), strict=True)),
        "effect": dict(zip(names, point.tolist(), strict=True)),
        "versions, test": order([m.hashtag for m in diff.movers]),
        "recent, test": order([m.hashtag for m in shift.movers]),
    }


def report(scores: dict[str, dict[str, float]], kinds: dict[str, tuple[str, int]]) -> dict[str, object]:
    """Each probe ranked among the real hashtags alone (1 + how many real hashtags moved
    more), so that probes do not crowd each other out of the top 10%."""
    out: dict[str, object] = {}
    for ranking, by_name in scores.items():
        real = sorted((h for h in by_name if h not in kinds), key=lambda h: (-by_name[h], h))
        real_scores = np.sort(np.array([by_name[h] for h in real]))

        def rank(
            h: str, by_name: dict[str, float] = by_name, real_scores: npt.NDArray[np.float64] = real_scores
        ) -> int:
            return 1 + int(len(real_scores) - np.searchsorted(real_scores, by_name[h], side="right"))

        top = max(1, round(0.1 * (len(real) + 1)))
        per_size: dict[str, object] = {}
        for size in sorted({s for _, s in kinds.values()}):
            of = {
                k: [h for h, (kind, s) in kinds.items() if kind == k and s == size and h in by_name]
                for k in KINDS
            }
            best_stable = max((by_name[h] for h in of["stable"]), default=float("-inf"))
            per_size[str(size)] = {
                "ranks": {k: sorted(rank(h) for h in of[k]) for k in KINDS},
                "auc_hijacked": auc([by_name[h] for h in of["hijacked"]], [by_name[h] for h in of["stable"]]),
                "auc_gradual": auc([by_name[h] for h in of["gradual"]], [by_name[h] for h in of["stable"]]),
                "hijacked_in_top10": sum(rank(h) <= top for h in of["hijacked"]),
                "gradual_in_top10": sum(rank(h) <= top for h in of["gradual"]),
                "stable_in_top10": sum(rank(h) <= top for h in of["stable"]),
                "hijacked_above_every_stable": sum(by_name[h] > best_stable for h in of["hijacked"]),
                "hijacked": len(of["hijacked"]),
            }
        outside = sorted(
            h.split("__", 1)[-1].replace("__", " -> ")
            for h, (kind, _) in kinds.items()
            if kind == "hijacked" and h in by_name and rank(h) > top
        )
        out[ranking] = {
            "compared": len(real) + 1,
            "top10_cut": top,
            "sizes": per_size,
            "top_real": real[:8],
            "hijacked_outside_top10": outside,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--feed", type=Path, default=None, help="feed (default: the bundled sample)")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--sizes", default="20,60,200")
    parser.add_argument("--per-kind", type=int, default=5, help="probes of each kind per size")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--min-support", type=int, default=DEFAULT_MIN_SUPPORT)
    parser.add_argument(
        "--senses",
        choices=("auto", "crises", "hashtags"),
        default="auto",
        help="what a sense is: CrisisLexT26's crises, the feed's own hashtags, or the crises where "
        "at least 3 have enough tweets (default)",
    )
    parser.add_argument("--out", type=Path, help="write the markdown section here too")
    parser.add_argument("--json", type=Path, help="write the figures as JSON")
    args = parser.parse_args(argv)
    command = bench_command("bench_hijack", argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    from workers.adapters.encoding.encoder import Encoder  # torch: only when the benchmark runs

    started = time.perf_counter()
    kept, times = load(args.feed or sample_feed())
    encoder = Encoder(args.model, device="cpu")
    vectors = np.asarray(encoder.encode([p.text for p in kept]), dtype=np.float64)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    cut = float(np.median(times))
    by_crisis = crisis_senses(kept)
    senses = args.senses
    if senses == "auto":
        enough = sum(len(rows) >= 2 * min(sizes) for rows in by_crisis.values())
        senses = "crises" if enough >= 3 else "hashtags"
    partners: Partners = any_other
    if senses == "hashtags":
        by_crisis = hashtag_senses(kept, least=min(sizes))
        partners = apart_partners(kept, list(by_crisis))
    if len(by_crisis) < 2:
        parser.error(
            f"the feed has {len(by_crisis)} {senses[:-1] if senses == 'crises' else 'hashtag'} sense(s) "
            f"with >= {min(sizes)} tweets; probes need 2 (try smaller --sizes)"
        )
    tags = sorted({h for p in kept for h in p.hashtags})
    index = {h: j for j, h in enumerate(tags)}
    dim = vectors.shape[1]
    nb, na = np.zeros(len(tags), np.int64), np.zeros(len(tags), np.int64)
    sb, sa = np.zeros((len(tags), dim)), np.zeros((len(tags), dim))
    for i, prepared in enumerate(kept):
        for h in prepared.hashtags:
            if times[i] < cut:
                nb[index[h]] += 1
                sb[index[h]] += vectors[i]
            else:
                na[index[h]] += 1
                sa[index[h]] += vectors[i]
    runs = []
    per_hashtag_dims = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        rng = np.random.default_rng(seed)
        made = probes(by_crisis, sizes, args.per_kind, rng, partners)
        # the copy's tag says nothing of the probe (its kind or crises would leak into the embedding)
        texts = [
            f"{kept[j].text} #probe{p}"
            for p, (*_, before, after) in enumerate(made)
            for j in (*before, *after)
        ]
        copies = np.asarray(encoder.encode(texts), dtype=np.float64)
        copies /= np.linalg.norm(copies, axis=1, keepdims=True)
        names, kinds = list(tags), {}
        pb, pa, qb, qa = [], [], [], []
        at = 0
        for name, kind, size, before, after in made:
            b, a = copies[at : at + len(before)], copies[at + len(before) : at + len(before) + len(after)]
            at += len(before) + len(after)
            names.append(name)
            kinds[name] = (kind, size)
            pb.append(len(b))
            pa.append(len(a))
            qb.append(b.sum(0))
            qa.append(a.sum(0))
            if seed == int(args.seeds.split(",")[0]) and kind == "stable":
                per_hashtag_dims.append(effective_dimension(np.vstack([b, a])))
        sides = Sides(
            names,
            np.concatenate([nb, pb]),
            np.vstack([sb, np.array(qb)]),
            np.concatenate([na, pa]),
            np.vstack([sa, np.array(qa)]),
        )
        runs.append({"seed": seed, "report": report(evaluate(sides, args.min_support), kinds)})
    seconds = time.perf_counter() - started
    dims = [d for d in per_hashtag_dims if d is not None]
    result = {
        "command": command,
        "model": args.model,
        "tweets": len(kept),
        "senses": senses,
        "crises": {c: len(rows) for c, rows in sorted(by_crisis.items())},
        "stable_probe_effective_dims": [round(d, 1) for d in dims],
        "seconds": round(seconds, 1),
        "runs": runs,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    publish(markdown(result, sizes), args.out)
    return 0


def markdown(result: dict[str, object], sizes: Sequence[int]) -> list[str]:
    runs = result["runs"]
    assert isinstance(runs, list)
    lines = [
        "## Hijacked hashtags as movers (bench/bench_hijack.py, issue 40)",
        "",
        f"Command: `{result['command']}`. Model {result['model']}, {result['tweets']} kept tweets; "
        f"{len(result['crises'])} {'crises' if result['senses'] == 'crises' else 'hashtags'} used as the "  # type: ignore[arg-type]
        f"probes' senses ({result['seconds']} s in all). "
        f"Effective dimension of stable probes' tweet covariance: {result['stable_probe_effective_dims']}.",
        "",
        "| seed | ranking | compared (real + 1) | size | hijacked ranks | gradual ranks | stable ranks "
        "| AUC hijacked / gradual vs stable | hijacked in top 10% | above every stable |",
        "|---|---|---:|---:|---|---|---|---|---:|---:|",
    ]
    for run in runs:
        for ranking in RANKINGS:
            found = run["report"][ranking]
            for size in sizes:
                if str(size) not in found["sizes"]:
                    continue  # no sense has the tweets for it
                cell = found["sizes"][str(size)]
                lines.append(
                    f"| {run['seed']} | {ranking} | {found['compared']} | {size} | "
                    f"{cell['ranks']['hijacked']} | {cell['ranks']['gradual']} | {cell['ranks']['stable']} | "
                    f"{cell['auc_hijacked']:.2f} / {cell['auc_gradual']:.2f} | "
                    f"{cell['hijacked_in_top10']}/{cell['hijacked']} (top {found['top10_cut']}) | "
                    f"{cell['hijacked_above_every_stable']}/{cell['hijacked']} |"
                )
    lines.append("")
    for ranking in RANKINGS:
        found = runs[0]["report"][ranking]
        first = ", ".join(found["top_real"])
        missed = "; ".join(found["hijacked_outside_top10"]) or "none"
        lines.append(f"*{ranking}* (seed {runs[0]['seed']}): real hashtags ranked first: {first}; ")
        lines.append(f"hijacked probes outside the top 10%: {missed}.")
        lines.append("")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
