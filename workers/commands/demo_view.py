"""The live table of ``reval demo``: the workers' ``/metrics`` scraped (:class:`Scrape`), one
:func:`snapshot` of what they export -- the #REval-hit-ratio of the top-5 by k, the
chance-corrected value at k=10 from the exported sums, the thesaurus behind them -- and
its :func:`render` on a terminal, as plain text, or as JSON lines (:class:`Output`)."""

from __future__ import annotations

import json
import math
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, TextIO

from prometheus_client.parser import text_string_to_metric_families
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from stream.evaluation.chance import corrected_of_sums
from stream.monitoring.cusum import ALTERNATIVES

#: The table's cut-off, its k columns and the k of its chance-corrected column.
R = "5"
KS_SHOWN = (0, 5, 10, 20, 50)
K_CORRECTED = "10"


@dataclass
class Scrape:
    """Samples of one /metrics page."""

    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    @classmethod
    def of(cls, port: int) -> Scrape:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                return cls.parse(response.read().decode())
        except OSError:
            return cls()

    @classmethod
    def parse(cls, body: str) -> Scrape:
        out = {}
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return cls(out)

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def total(self, name: str, **labels: str) -> float:
        want = set(labels.items())
        return sum(v for (n, lab), v in self.samples.items() if n == name and want <= set(lab))

    def labels(self, name: str, label: str, **labels: str) -> set[str]:
        """The values of ``label`` among the samples of ``name`` that carry ``labels``."""
        want = set(labels.items())
        return {
            dict(lab)[label]
            for n, lab in self.samples
            if n == name and want <= set(lab) and label in dict(lab)
        }


# --------------------------------------------------------------------------- the table


def _mean(scrape: Scrape, name: str, **labels: str) -> float | None:
    count = scrape.get(f"{name}_count", **labels)
    total = scrape.get(f"{name}_sum", **labels)
    return total / count if count and total is not None else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def snapshot(
    embed: Scrape, score: Scrape, version: str | None, hashtags: int, elapsed_s: float
) -> dict[str, Any]:
    """One refresh, as ``--json`` prints it::

        {"elapsed_s", "thesaurus": {"version", "hashtags"}, "embedded", "scored",
         "recommenders": {NAME: {"events", "exact_hit_ratio", "reval": {"0": x, "5": x, ...},
                                 "corrected": {"10": x},
                                 "detector": {"events", "alarms": {"quality_lost", "wording_changed"}}}}}

    ``elapsed_s``: seconds since the first scored event; ``thesaurus``: the newest published
    version and its hashtag count; ``embedded``: tweets embedded; ``scored``: events scored
    (all recommenders); per recommender, over its scorable events so far at the top-5:
    ``events``, the mean exact hit ratio, the mean #REval-hit-ratio per k, and the
    chance-corrected #REval at k=10 as the kappa of the sums (null while no event has a null
    model), and the change detector's events taken and alarms so far (its charts calibrate on a
    recommender's first REVAL_DETECTOR_REFERENCE events).  Values are rounded to 4 decimals.
    """
    recommenders: dict[str, Any] = {}
    for name in sorted(score.labels("reval_hit_ratio_count", "recommender", r=R)):
        ks = sorted(map(int, score.labels("reval_hit_ratio_count", "k", recommender=name, r=R)))
        where = {"recommender": name, "k": K_CORRECTED, "r": R}
        observed = score.get("reval_corrected_observed_total", **where)
        expected = score.get("reval_corrected_expected_total", **where)
        events = score.get("reval_corrected_events_total", **where)
        corrected = None
        if observed is not None and expected is not None and events:
            corrected = corrected_of_sums(observed, expected, best=events)
        recommenders[name] = {
            "events": int(score.get("reval_hit_ratio_count", recommender=name, k="0", r=R) or 0),
            "exact_hit_ratio": _rounded(
                _mean(score, "reval_exact_match", recommender=name, metric="hit_ratio", r=R)
            ),
            "reval": {
                str(k): _rounded(_mean(score, "reval_hit_ratio", recommender=name, k=str(k), r=R)) for k in ks
            },
            "corrected": {K_CORRECTED: _rounded(corrected)},
            # the live change detector (stream.monitoring.cusum.Detector): events taken, alarms so far
            "detector": {
                "events": int(score.get("reval_detector_events", recommender=name) or 0),
                "alarms": {
                    alternative: int(
                        score.get("reval_detector_alarms", recommender=name, alternative=alternative) or 0
                    )
                    for alternative in ALTERNATIVES
                },
            },
        }
    return {
        "elapsed_s": round(elapsed_s, 1),
        "thesaurus": {"version": version, "hashtags": hashtags},
        "embedded": int(embed.get("reval_tweets_embedded_total") or 0),
        "scored": int(score.total("reval_events_total", outcome="scored")),
        "recommenders": recommenders,
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(snap: dict[str, Any], rates: dict[str, float] | None = None) -> RenderableType:
    """The table of a :func:`snapshot`, 75 columns wide (fits an 80-column terminal)."""
    thesaurus = snap["thesaurus"]
    table = Table(
        title=f"thesaurus {thesaurus['version'] or '-'} ({thesaurus['hashtags']:,} hashtags): "
        f"#REval-hit-ratio of the top-{R} by k",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
    )
    table.add_column("recommender", no_wrap=True, min_width=13)
    table.add_column("events", justify="right", no_wrap=True)
    for k in KS_SHOWN:
        table.add_column(f"k={k}" + ("\n(exact)" if k == 0 else ""), justify="right", no_wrap=True)
    table.add_column(f"k={K_CORRECTED}\ncorrected", justify="right", no_wrap=True)
    for name, row in snap["recommenders"].items():
        table.add_row(
            name,
            f"{row['events']:,}",
            *(_fmt(row["reval"].get(str(k))) for k in KS_SHOWN),
            _fmt(row["corrected"][K_CORRECTED]),
        )
    rates = rates or {}
    status = Text(
        f"{snap['elapsed_s']:.0f} s: embedded {snap['embedded']:,} tweets "
        f"({rates.get('embedded', 0):.0f}/s), "
        f"scored {snap['scored']:,} events ({rates.get('scored', 0):.0f}/s)"
    )
    alarms = [
        f"{name} {alternative.replace('_', ' ')} x{n}"
        for name, row in snap["recommenders"].items()
        for alternative, n in row.get("detector", {}).get("alarms", {}).items()
        if n
    ]
    status.append("\nchange detector alarms: " + ("; ".join(alarms) if alarms else "none"))
    legend = Text(
        "corrected: 0 = a popularity-weighted random recommender, 1 = perfect; "
        "least-popular is the canary (lowest), random the null (about 0)",
        style="dim",
    )
    return Group(table, status, legend)


class Output:
    """Where the refreshes go: a live table on a terminal, a plain table per refresh when
    stdout is not one, or one JSON object per refresh (``json_lines``); progress on stderr."""

    def __init__(self, *, json_lines: bool = False, stdout: TextIO | None = None) -> None:
        self.json_lines = json_lines
        self.stdout = stdout or sys.stdout
        self.console = Console(file=self.stdout)
        self.err = Console(stderr=True)
        self.live: Live | None = None
        self._rates: dict[str, tuple[float, float]] = {}
        self._last_note = -math.inf
        self._noted = ""

    @property
    def interactive(self) -> bool:
        return not self.json_lines and self.console.is_terminal

    def __enter__(self) -> Output:
        if self.interactive:
            self.live = Live(console=self.console, refresh_per_second=4, auto_refresh=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def note(self, text: str, *, every: float = 5.0) -> None:
        """A progress line: in the live display, else on stderr at most every ``every`` s."""
        if self.live is not None:
            self.live.update(Text(text), refresh=True)
            return
        now = time.monotonic()
        if text and text != self._noted and now - self._last_note >= every:
            self._last_note, self._noted = now, text
            self.err.print(text, highlight=False, soft_wrap=True)

    def say(self, text: str) -> None:
        """A message that stays (start-up facts, the end)."""
        target = self.live.console if self.live is not None else self.err
        target.print(text, highlight=False, soft_wrap=True)

    def show(self, snap: dict[str, Any], phase: str = "") -> None:
        now = time.monotonic()
        rates = {}
        for name in ("embedded", "scored"):
            t0, v0 = self._rates.get(name, (now, snap[name]))
            rates[name] = (snap[name] - v0) / (now - t0) if now > t0 else 0.0
            self._rates[name] = (now, snap[name])
        if self.json_lines:
            self.stdout.write(json.dumps(snap) + "\n")
            self.stdout.flush()
            return
        view = render(snap, rates)
        if self.live is not None:
            self.live.update(Group(view, Text(phase, style="dim")) if phase else view, refresh=True)
        else:
            self.console.print(view)
            self.console.print()
            self.stdout.flush()
