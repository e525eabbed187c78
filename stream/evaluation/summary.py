"""Averages of scored events over a whole run, per (r, k) and per exact metric, river style
(``update``/``get``): what ``reval score --json`` prints.

Each signal of :data:`stream.evaluation.signals.SIGNALS` is averaged under its key; the chance-corrected
score is the kappa of the events' sums (:class:`stream.evaluation.chance.CorrectedSum`), with a 95%
delta-method interval.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stream.evaluation.chance import CorrectedSum
from stream.evaluation.metrics import Mean
from stream.evaluation.scoring import ALL, EventScore, ScoredBatch, r_label
from stream.evaluation.signals import SIGNALS

__all__ = ["Summary"]


class Summary:
    """Means over events of every signal per (r, k), the corrected score per (r, k) and the
    exact-match metrics per r; ``get()`` gives the shape ``reval score --json`` prints for one r.
    """

    def __init__(self) -> None:
        self.events = 0
        self.unscorable = 0
        #: Per signal key, per r label, per k: the running mean.
        self.means: dict[str, dict[str, dict[int, Mean]]] = {s.key: {} for s in SIGNALS}
        self.corrected: dict[str, dict[int, CorrectedSum]] = {}
        self.exact: dict[str, dict[str, Mean]] = {}

    def update(self, score: EventScore) -> None:
        self.events += 1
        if score.unscorable is not None:
            self.unscorable += 1
            return
        for key, by_r in score.values.items():
            table = self.means.setdefault(key, {})
            for r, by_k in by_r.items():
                means = table.setdefault(r, {})
                for k, value in by_k.items():
                    means.setdefault(k, Mean()).update(value)
        observed = score.reval
        for r, by_k in score.expected.items():
            sums = self.corrected.setdefault(r, {})
            for k, expected in by_k.items():
                sums.setdefault(k, CorrectedSum()).update(observed[r][k], expected)
        for r, scores in score.exact.items():
            exact = self.exact.setdefault(r, {})
            for name, value in scores.as_dict().items():
                exact.setdefault(name, Mean()).update(value)

    def update_many(self, scores: Iterable[EventScore]) -> Summary:
        for score in scores:
            self.update(score)
        return self

    def update_batch(self, batch: ScoredBatch) -> Summary:
        """Every event of ``batch``, in order."""
        return self.update_many(batch.event(i) for i in range(len(batch)))

    def _corrected(self, label: str, k: int) -> dict[str, Any]:
        found = self.corrected.get(label, {}).get(k)
        interval = None if found is None else found.interval()
        value = None if found is None else found.get()
        return {
            "reval_hit_ratio_corrected": value,
            # why the corrected score is null: no null model (a thesaurus without popularity),
            # or an expectation that leaves no room above chance
            "corrected_null_reason": None
            if value is not None
            else "no_null_model"
            if found is None
            else "no_room",
            "corrected_ci_low": None if interval is None else interval[0],
            "corrected_ci_high": None if interval is None else interval[1],
            "reval_hit_ratio_expected": None if found is None else found.expected / found.count,
        }

    def _mean(self, key: str, label: str, k: int) -> float | None:
        found = self.means[key].get(label, {}).get(k)
        return None if found is None else found.get()

    def get(self, r: int | None = ALL) -> dict[str, Any]:
        label = r_label(r)
        first, *others = SIGNALS
        return {
            "events": self.events,
            "unscorable": self.unscorable,
            "by_k": {
                str(k): {
                    first.key: mean.get(),
                    **self._corrected(label, k),
                    **{signal.key: self._mean(signal.key, label, k) for signal in others},
                }
                for k, mean in sorted(self.means[first.key].get(label, {}).items())
            },
            "exact": {name: mean.get() for name, mean in self.exact.get(label, {}).items()},
        }

    def labels(self) -> list[str]:
        return list(self.means[SIGNALS[0].key])
