"""Watching a recommender over time: the change detector, the backtest, drift tests, alert parameters."""
