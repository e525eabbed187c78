"""``reval backtest``: does an alert catch a drifted recommender, and how soon?

The feed is replayed in event time, walking forward the way the live system does:

* the first ``warmup`` share of the tweets only trains (recommender, thesaurus means);
* from then on, every ``refit_days`` of event time, the recommender is refitted on every
  labelled tweet so far and the thesaurus is rebuilt from the running means of every
  tweet so far (the index job's all-time means, with this round's hubness method);
* every labelled tweet after the warm-up is a recommendation event, recommended by the
  current model and scored with :func:`stream.evaluation.scoring.score_event` -- the scorer's path
  -- against the current thesaurus.

That undisturbed run is the *control*.  Each ``--inject`` is a second run whose lists
are changed from its time on (:mod:`stream.monitoring.backtest`).  Every alert signal is evaluated
over both runs with the thresholds of ``deploy/prometheus`` (:mod:`stream.monitoring.alert_params`),
its durations stretched by the time scale when the feed is sparser than production.

MOWE's word vectors are trained once, on the warm-up tweets (gensim's Word2Vec); refits
index the new tweets with them.  Writes ``detection.json``, ``detection.md`` and
``series.json`` (per-instant window means of every run, for plots).

Three modules: :mod:`.simulation` (the walk forward), :mod:`.analysis` (the signals
evaluated, :func:`run_backtest`) and :mod:`.rendering` (the files).
"""

from stream.monitoring.alert_params import rule_params
from workers.commands.backtest.analysis import Backtest, goal, run_backtest
from workers.commands.backtest.rendering import RESULT_FILES, backfill, check_out, markdown, write_outputs
from workers.commands.backtest.simulation import (
    DEFAULT_INJECTIONS,
    EMBEDDING_SIGNAL,
    BacktestConfig,
    rules_for,
)

__all__ = [
    "DEFAULT_INJECTIONS",
    "EMBEDDING_SIGNAL",
    "RESULT_FILES",
    "Backtest",
    "BacktestConfig",
    "backfill",
    "check_out",
    "goal",
    "markdown",
    "rule_params",
    "rules_for",
    "run_backtest",
    "write_outputs",
]
