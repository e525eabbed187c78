"""`reval report`: the backtest's self-contained HTML page, checked on its source and in a
real headless Chromium (Selenium + Debian's chromedriver)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from workers.commands.report import write_report

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "backtest"
#: The plots of the docs example: one per drift over event time, two k-curves, the thesaurus.
EXAMPLE_PLOTS = [
    "metric-random:0.5",
    "metric-swap:least-popular",
    "metric-synonyms:1",
    "metric-stale:60",
    "metric-vocab:0.5",
    "k-curve-last-window",
    "k-curve-after-injection",
    "curves",
    "thesaurus",
    "audit",
    "grid",
]
FIGURE = re.compile(r'<figure class="plot" data-plot="([^"]*)">(.*?)</figure>', re.S)
HOSTILE = "random:<b>&amp;$x$"  # HTML markup, an entity and mathtext in a drift's name


def figures(page: str) -> dict[str, str]:
    return dict(FIGURE.findall(page))


def _curves() -> dict[str, Any]:
    """Detection curves: one with a deployed point and a missing delay, one with no points."""
    return {
        "reval_drop": {
            "parameter": "false_alarm_probability",
            "points": [
                {
                    "value": 0.1,
                    "false_alarms_per_day": 0.5,
                    "delays": {HOSTILE: 3600.0, "stale:60": None},
                },
                {
                    "value": 0.01,
                    "deployed": True,
                    "false_alarms_per_day": None,
                    "delays": {HOSTILE: None},
                },
            ],
        },
        "exact_drop": {"parameter": "quality_drop_fraction", "points": None},
    }


def _k_curve(t: list[str]) -> dict[str, Any]:
    return {
        "ks": [0, 5, 10],
        "last_window": {"from": t[2], "events": 8},
        "control": [0.1, None, 0.3],
        "drifts": {HOSTILE: [0.0, 0.1, None], "stale:60": [None, None, None]},
        "after_injection": {HOSTILE: {"control": [0.1, 0.2, 0.3], "drifted": [0.0, None, 0.2]}},
    }


def _thesaurus(t: list[str]) -> dict[str, Any]:
    """Two refits (the second without hubness), a mover whose name is markup."""
    return {
        "refits": [
            {"at": t[0], "hashtags": 10, "hubness": {"skewness": 1.2}, "drift": None},
            {
                "at": t[2],
                "hashtags": 12,
                "hubness": None,
                "drift": {"shift": {"p50": 0.01, "p90": None}, "top10_changed_share": 0.2},
            },
        ],
        "movers": [
            {
                "hashtag": "<i>flood</i>",
                "cosine": 0.5,
                "jaccard": None,
                "old_neighbours": ["rain"],
                "new_neighbours": None,
            }
        ],
    }


def _series(t: list[str]) -> dict[str, Any]:
    """The time series, nulls inside and one drift's series shorter than the others."""
    return {
        "t": t,
        "window_s": 7200.0,
        "control": {
            "reval": [0.5, None, 0.4, 0.45],
            "corrected": [0.2, None, 0.1, 0.15],
            "exact": [0.3, None, 0.2, 0.25],
        },
        "drifts": {
            HOSTILE: {
                "reval": [0.5, None, 0.2, 0.1],
                "corrected": [None] * 4,
                "exact": [0.3, 0.1],
            },  # short: padded
            "stale:60": {
                "reval": [0.5, 0.4, 0.1, 0.0],
                "corrected": [0.2, 0.1, -0.1, -0.2],
                "exact": [0.3, 0.2, 0.0, 0.0],
            },
        },
        "control_firing": {"reval_drop": [0, 0, 0, 0]},
    }


def small_run(tmp_path: Path, *, slices: bool = True) -> Path:
    """A two-drift run with nulls wherever the real one may have them."""
    t = [
        "2024-01-01T00:00:00+00:00",
        "2024-01-02T00:00:00+00:00",
        "2024-01-03T00:00:00+00:00",
        "2024-01-04T00:00:00+00:00",
    ]
    row = {
        "delay_events": None,
        "false_alarms_per_day": 0.0,
        "fired": False,
        "injected_at": t[1],
        "delay_s": None,
    }
    detection: dict[str, Any] = {
        "signals": [
            {
                **row,
                "signal": "reval_drop",
                "drift": HOSTILE,
                "delay_s": 86400.0,
                "delay_events": 12,
                "fired": True,
            },
            {**row, "signal": "exact_drop", "drift": HOSTILE, "false_alarms_per_day": None},
            {**row, "signal": "reval_drop", "drift": "stale:60", "delay_s": 3600.0, "delay_events": 3},
            {**row, "signal": "exact_drop", "drift": "stale:60", "delay_s": 3600.0, "delay_events": 3},
        ],
        "recommender": "mowe",
        "feeds": ["feed.jsonl.gz"],
        "alert_k": 10,
        "alert_r": 10,
        "time_scale": 2.0,
        "rules": {"quality_window": 7200.0, "min_events": 50},
        "period": {"first_event": t[0], "last_event": t[-1], "days": 3.0},
        "events": 400,
        "scored_events": None,
        "instants_with_enough_events": 0.5,
        "false_alarm_episodes": {"reval_drop": 1},
        "effects": {
            HOSTILE: {
                "injected_at": t[1],
                "events_after": 200,
                "reval_after": {"control": 0.3, "drifted": None},
            }
        },
        "goal": {"random": True, "stale": False, "synonyms": None},
        "goal_matched": {
            "random": {
                "drift": HOSTILE,
                "false_alarms_per_day": 0.0,
                "reval_delay_s": 86400.0,
                "exact_delay_s": None,
                "exact_threshold": None,
                "met": True,
            },
            "stale": {
                "drift": "stale:60",
                "false_alarms_per_day": None,
                "reval_delay_s": None,
                "exact_delay_s": 3600.0,
                "exact_threshold": 0.4,
                "met": False,
            },
        },
        "curves": _curves(),
        "k_curve": _k_curve(t),
        "thesaurus": _thesaurus(t),
        "signal_rules": {"reval_drop": "RevalRecommenderQualityDrop"},
    }
    if slices:
        detection["slices"] = {
            "lang=<en>": {"events": 300, "control": 0.25, "drifts": {HOSTILE: 0.1, "stale:60": None}}
        }
    (tmp_path / "detection.json").write_text(json.dumps(detection))
    (tmp_path / "series.json").write_text(json.dumps(_series(t)))
    return tmp_path


@pytest.fixture(scope="module")
def example_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs example's report, written once into a copy of its run directory."""
    run = tmp_path_factory.mktemp("backtest")
    for name in ("detection.json", "series.json", "grid.json"):
        shutil.copy(EXAMPLE / name, run / name)
    return write_report(run)


# --- the page's source -------------------------------------------------------------------


def test_the_example_has_one_inline_svg_plot_per_expected_figure(example_report: Path) -> None:
    assert example_report.name == "report.html"
    page = example_report.read_text(encoding="utf-8")
    plots = figures(page)
    assert list(plots) == EXAMPLE_PLOTS
    assert page.count('<figure class="plot"') == len(EXAMPLE_PLOTS)
    for name, body in plots.items():
        assert body.count("<svg") == 1 and "<path" in body, name
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page  # prologs are invalid inside HTML
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "ids repeat across the inline SVGs"
    assert set(re.findall(r'(?:href="#|url\(#)([^")]+)', page)) <= set(ids), "a reference points nowhere"
    # The sample feed's backtest has the four popularity slices, control and drifted.
    assert "no slices in this run" not in page
    assert all(f"<td>{label}</td>" in page for label in ("head", "torso", "tail", "novel"))
    # Self-contained: nothing to fetch, nothing to run.
    assert not re.search(r"<script|<link|<img|<iframe|\bsrc=|url\(\s*['\"]?(https?:|//)", page, re.I)
    # What was run, readable without having run it.
    for text in ("mowe", "crisislex-t26", "2013-02-15", "k=10", "×113.128", "43%", "105.8 d (3,311 events)"):
        assert text in page, text
    assert "Movers at the last refit" in page and "helicopter" in page
    # exact match has no threshold as quiet as the #REval alert (0.013 false alarms a day) that fires
    assert "At matched false alarms" in page and "exact match — (no threshold at that rate fires)" in page
    # Only hashtags that moved: got tweets, or changed neighbours (issue 26).
    movers = json.loads((EXAMPLE / "detection.json").read_text())["thesaurus"]["movers"]
    assert movers and all(m["support_old"] != m["support_new"] or m["jaccard"] < 1 for m in movers)


def test_the_small_run_escapes_text_and_survives_nulls(tmp_path: Path) -> None:
    out = write_report(small_run(tmp_path), tmp_path / "elsewhere.html")
    assert out == tmp_path / "elsewhere.html"
    page = out.read_text(encoding="utf-8")
    plots = figures(page)
    names = [
        "metric-random:&lt;b&gt;&amp;amp;$x$",
        "metric-stale:60",
        "k-curve-last-window",
        "k-curve-after-injection",
        "curves",
        "thesaurus",
    ]
    assert list(plots) == names
    for name, body in plots.items():
        assert "<svg" in body and "<path" in body, name
    assert "<b>" not in page and "<i>flood</i>" not in page and "&lt;i&gt;flood&lt;/i&gt;" in page
    assert "lang=&lt;en&gt;" in page and "no slices in this run" not in page  # the slices table
    assert "24.0 h (12 events)" in page and "60 min (3 events)" in page
    # The goal's three outcomes: met, not met, and not decided where neither alert fired.
    assert "random: <span" in page and "stale: <span" in page
    assert "synonyms: not decided (neither alert fired)" in page
    # ... and at matched false alarms, where a value is missing too.
    assert "#REval alert 24.0 h, exact match — (no threshold at that rate fires): <span" in page
    assert "stale:60 (≤ — a day): #REval alert —, exact match 60 min" in page


def test_a_run_with_only_signals_still_gets_a_page(tmp_path: Path) -> None:
    (tmp_path / "detection.json").write_text(json.dumps({"signals": [], "k_curve": None, "thesaurus": 3}))
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert "<figure" not in page
    for note in (
        "no series.json in this run",
        "no k-curve in this run",
        "no thesaurus refits",
        "no slices in this run",
    ):
        assert note in page, note


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "not found"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"signals": {}}', "'signals' must be a list"),
        ('{"recommender": "mowe"}', "'signals' must be a list"),
        ('{"signals": [{"signal": "reval_drop"}]}', "signals[0] must have a string 'drift'"),
        ('{"signals": [3]}', "signals[0] must be an object"),
    ],
)
def test_a_missing_or_malformed_detection_json_is_one_line_value_error(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    if content is not None:
        (tmp_path / "detection.json").write_text(content)
    with pytest.raises(ValueError) as raised:
        write_report(tmp_path)
    message = str(raised.value)
    assert str(tmp_path / "detection.json") in message and problem in message
    assert "\n" not in message
    assert not (tmp_path / "report.html").exists()


def test_a_malformed_series_json_is_a_value_error_too(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    (run / "series.json").write_text('{"t": 3}')
    with pytest.raises(ValueError, match=r"series\.json: expected an object with a list 't'"):
        write_report(run)


# --- in a real browser ------------------------------------------------------------------

INSTALL = (
    "install them with `apt-get install -y --no-install-recommends chromium chromium-driver` "
    "(or run .ci/services.sh) and `pip install -e '.[dev]'` (selenium)"
)


def _missing_browser() -> str | None:
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (Python)")
    return f"{', '.join(missing)} missing: {INSTALL}" if missing else None


@contextmanager
def chromium() -> Iterator[Any]:
    """Headless Debian Chromium under Selenium; fails (in CI) or skips when it is missing."""
    why = _missing_browser()
    if why is not None:
        if os.environ.get("CI"):  # in CI a missing browser is a broken setup, not a reason to skip
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(shutil.which("chromium"))
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1200,900",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # Debian's chromedriver by path: Selenium Manager would otherwise try to download one.
    driver = webdriver.Chrome(
        options=options, service=Service(executable_path=str(shutil.which("chromedriver")))
    )
    try:
        yield driver
    finally:
        driver.quit()


#: Per figure: its name, the svg's box, and how many of its paths have a drawn, non-empty box.
MEASURE = """
return Array.from(document.querySelectorAll('figure.plot')).map(f => {
  const svg = f.querySelector('svg');
  if (!svg) return {name: f.dataset.plot, svg: false};
  const box = svg.getBoundingClientRect();
  const drawn = Array.from(svg.querySelectorAll('path')).filter(p => {
    const b = p.getBBox();
    return (p.getAttribute('d') || '').length > 0 && (b.width > 0 || b.height > 0);
  }).length;
  return {name: f.dataset.plot, svg: true, width: box.width, height: box.height, drawn: drawn};
});
"""


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_report_renders_in_headless_chromium(example_report: Path) -> None:
    with chromium() as browser:
        browser.get(example_report.as_uri())
        assert browser.execute_script("return document.readyState") == "complete"
        title = browser.title
        severe = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        plots = browser.execute_script(MEASURE)
    assert title.startswith("Drift-detection backtest: mowe")
    assert not severe, f"console errors: {severe}"
    assert [p["name"] for p in plots] == EXAMPLE_PLOTS
    for p in plots:
        assert p["svg"], p
        assert p["width"] > 0 and p["height"] > 0, p
        assert p["drawn"] > 0, p
