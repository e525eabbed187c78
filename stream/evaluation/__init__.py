"""Scoring: #REval and the exact metrics, the signal registry, chance correction, quality sums."""
