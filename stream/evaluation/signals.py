"""The per-event signals, each declared once: what a scores record carries under its key, what
``reval score --json`` averages, what ``/metrics`` exports, how it is summed and windowed, and
its recording rule -- all follow from the :class:`Signal` below.

A signal here is a value per scorable event and per (r, k) cell of the grid, computed for a
whole batch from its rank matrices (:class:`stream.evaluation.rank_grid.RankGrid`) and aggregated as a
mean over scorable events.  Its declaration says:

* ``title``: what a table of its means is called (``reval score``);
* ``key``: the scores record's key (``{r: {k: value}}``), the key of its mean in ``reval score
  --json``'s ``by_k[k]``, and the name of its metric family (a summary: ``_sum`` and ``_count``
  per recommender, k and r);
* ``rolling``: the HELP of ``<key>_rolling``, the mean over each window of event time (None:
  no windows -- the recording rules give windows of wall-clock time from the sums);
* ``squares``: the HELP of ``<key>_squares``, the sum of the values' squares (a variance);
* ``rule``: the recording rules ``reval:<rule>:mean<w>`` for each quality window.

The chance correction (observed and expected sums), the exact-match metrics (five per r) and
the popularity slices (a cell per slice) have shapes of their own; they are written once in
:mod:`stream.evaluation.scoring` (the record and the columns) and :mod:`stream.evaluation.quality` (the sums).

>>> [s.key for s in SIGNALS]
['reval_hit_ratio', 'reval_hit_ratio_ranked', 'reval_hit_ratio_precision', 'reval_reciprocal_rank']
>>> RECORD_KEYS[-2:]
('reval_hit_ratio_precision', 'reval_reciprocal_rank')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from stream.evaluation.rank_grid import RankGrid

__all__ = ["RECORD_KEYS", "SIGNALS", "Signal"]


@dataclass(frozen=True)
class Signal:
    """One per-event signal (the module's docstring says what each field drives)."""

    key: str
    title: str
    help: str
    #: Its values on the first m rows of each event's matrix, at each k: |B| x K.
    values: Callable[[RankGrid, npt.NDArray[np.int64]], npt.NDArray[np.float64]]
    rolling: str | None = None
    squares: str | None = None
    rule: str | None = None


SIGNALS: tuple[Signal, ...] = (
    Signal(
        "reval_hit_ratio",
        "average #REval-hit-ratio",
        "#REval-hit-ratio of scored events",
        RankGrid.reval,
        rolling="#REval-hit-ratio mean over a window of event time",
        rule="hit_ratio",
    ),
    Signal(
        "reval_hit_ratio_ranked",
        "rank-aware #REval-hit-ratio",
        "Rank-aware #REval-hit-ratio of scored events (hit credit decays with both ranks)",
        RankGrid.ranked,
        rolling="Rank-aware #REval-hit-ratio mean over a window of event time",
    ),
    # What the #REval alert tests (stream.monitoring.backtest.skill_loss): its variance from the squares.
    Signal(
        "reval_hit_ratio_precision",
        "#REval precision form (share of the recommended with a ground truth among their k synonyms;"
        " what the #REval alert tests)",
        "Precision form of #REval of scored events: share of the top-r recommended hashtags with a "
        "ground truth among their k synonyms",
        RankGrid.precision,
        squares="Sum of the squares of the precision form of #REval (its variance)",
    ),
    Signal(
        "reval_reciprocal_rank",
        "reciprocal rank of the first #REval hit (1/i for the first recommended hashtag with a ground"
        " truth among its k synonyms)",
        "Reciprocal rank of the first recommended hashtag (in list order) with a ground truth among "
        "its k synonyms, 0 if none",
        RankGrid.reciprocal_rank,
        rule="reciprocal_rank",
    ),
)


#: The scores record's keys, in order: the event's own fields and the cells where they were first
#: written (consumers that know only the first keys keep working); a signal declared after these
#: comes last, in the order of :data:`SIGNALS`.
_FIRST_KEYS = (
    "tweet_id",
    "recommender",
    "thesaurus_version",
    "scorable",
    "unscorable_reason",
    "reval_hit_ratio",
    "reval_hit_ratio_corrected",
    "exact",
    "unknown_recommended",
    "n_recommended",
    "reval_hit_ratio_ranked",
    "reval_hit_ratio_slices",
    "reval_hit_ratio_expected",
    "reval_hit_ratio_precision",
)
RECORD_KEYS: tuple[str, ...] = _FIRST_KEYS + tuple(s.key for s in SIGNALS if s.key not in _FIRST_KEYS)
