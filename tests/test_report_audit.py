"""The report's audit section: each refit's coherence lift and agreement, in the page's
source and drawn in headless Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_report import MEASURE, chromium, figures, small_run
from workers.commands.report import write_report


def _with_audit(tmp_path: Path, voted: bool) -> Path:
    run = small_run(tmp_path)
    detection = json.loads((run / "detection.json").read_text())
    refits = detection["thesaurus"]["refits"]
    for i, refit in enumerate(refits):
        lift = 0.02 + 0.01 * i
        refit["audit"] = {
            "coherence": {
                "tfidf": {
                    "synonyms": 0.05 + lift,
                    "random": 0.05,
                    "lift": lift,
                    "lift_ci_low": lift - 0.005,
                    "lift_ci_high": lift + 0.005,
                    "hashtags": 180,
                    "k": 10,
                }
            },
            "agreement": {"audit": "a", "tau_w": 0.4, "tau_w_ci_low": 0.2, "tau_w_ci_high": 0.6, "rho_w": 0.7}
            if voted and i
            else None,
        }
    refits.append({"at": "2024-01-04T00:00:00+00:00", "audit": {"coherence": {"tfidf": None}}})
    (run / "detection.json").write_text(json.dumps(detection))
    return run


def test_the_audit_section_lists_every_refit(tmp_path: Path) -> None:
    page = write_report(_with_audit(tmp_path, voted=True)).read_text()
    section = page[page.index('<section id="audit">') :]
    assert "(f) Thesaurus audit" in section
    assert "0.0200 [0.0150, 0.0250]" in section  # the first refit's lift and interval
    assert "0.4000 [0.2000, 0.6000]" in section  # τ_w of the second
    assert "—" in section  # the refit without votes, and the one without a lift
    assert "audit" in figures(page)


def test_without_votes_only_coherence_is_plotted(tmp_path: Path) -> None:
    page = write_report(_with_audit(tmp_path, voted=False)).read_text()
    assert "No audit votes were given" in figures(page)["audit"]


def test_a_run_without_audits_says_so(tmp_path: Path) -> None:
    page = write_report(small_run(tmp_path)).read_text()
    assert "no audit in this run" in page
    assert "audit" not in figures(page)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_audit_plot_renders_in_headless_chromium(tmp_path: Path) -> None:
    report = write_report(_with_audit(tmp_path, voted=True))
    with chromium() as browser:
        browser.get(report.as_uri())
        plots = {p["name"]: p for p in browser.execute_script(MEASURE)}
        severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe
    audit = plots["audit"]
    assert audit["svg"] and audit["width"] > 0 and audit["drawn"] > 0
