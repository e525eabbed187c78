"""Prometheus: the exporter, the quality collector, rendered rules and alerts, backfill."""
