"""Render the Prometheus rules (and scrape config) of reval-stream from parameters.

The committed ``rules.yml`` and ``prometheus.yml`` beside this file are the output
with the defaults; ``tests/test_deploy.py`` fails when they drift from it.

    python deploy/prometheus/render.py                            # rewrite rules.yml (defaults)
    python deploy/prometheus/render.py --set alert_k=5 --set quality_drop_fraction=0.3 -o my-rules.yml
    python deploy/prometheus/render.py --profile test -o /tmp/rules.yml    # short windows (tests)
    python deploy/prometheus/render.py --config -o prometheus.yml           # the scrape config
    python deploy/prometheus/render.py --signal-tests   # tests/signals_test.yml (the signal registry)
    python deploy/prometheus/render.py --list                                # every parameter

The parameters (every threshold, window and hold time, their defaults and the ``test``
profile) are defined in ``stream/monitoring/alert_params.py``, the rules in
``workers/adapters/prometheus/prometheus_rules.py``; run this with the Python the package is
installed in (``make setup``: ``.venv/bin/python deploy/prometheus/render.py``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

try:
    from stream.monitoring.alert_params import PROFILES, parse_set
    from workers.adapters.prometheus.prometheus_rules import render_config, render_rules, render_signal_tests
except ImportError as exc:  # a Python without the package: say which one to use
    sys.exit(f"error: {exc}; run with the Python reval-stream is installed in (make setup: .venv/bin/python)")

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="default")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="override a parameter"
    )
    parser.add_argument("--config", action="store_true", help="render the scrape config instead of the rules")
    parser.add_argument(
        "--signal-tests",
        action="store_true",
        help="render the promtool value tests of the signals' recording rules instead",
    )
    parser.add_argument("--list", action="store_true", help="print the parameters and exit")
    parser.add_argument(
        "-o", "--out", type=Path, help="output file ('-' = stdout) [default: rules.yml / prometheus.yml here]"
    )
    args = parser.parse_args(argv)
    try:
        params = parse_set(PROFILES[args.profile], args.set)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for name, value in asdict(params).items():
            print(f"{name} = {value!r}")
        return 0
    try:
        text = (
            render_config()
            if args.config
            else render_signal_tests(params)
            if args.signal_tests
            else render_rules(params)
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    default = (
        "prometheus.yml" if args.config else "tests/signals_test.yml" if args.signal_tests else "rules.yml"
    )
    out = args.out or HERE / default
    if str(out) == "-":
        sys.stdout.write(text)
    else:
        out.write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
