"""The one upstream workaround (workers/service/faust_compat.py) is still needed, still
installed, and guarded: these fail when faust changes the ordering or the version."""

from __future__ import annotations

import inspect

import faust
import pytest
from faust.tables.recovery import Recovery

from workers.service.faust_compat import SeekFirstRecovery, SeekFirstTableManager, app_settings, check_version


def test_upstream_still_resumes_before_it_seeks() -> None:
    """faust-streaming#216/#502: when this fails, upstream fixed the ordering -- delete the
    workaround (and this test) instead of updating it."""
    source = inspect.getsource(Recovery.on_recovery_completed)
    assert "resume_partitions" in source and "perform_seek" in source
    assert source.index("resume_partitions") < source.index("perform_seek")


def test_only_checked_versions_start() -> None:
    check_version()  # the installed release is one it was checked against
    with pytest.raises(RuntimeError, match="faust_compat"):
        check_version("0.16.0")


def test_the_app_gets_the_seek_first_recovery() -> None:
    app = faust.App("test-faust-compat", broker="kafka://127.0.0.1:1", **app_settings())
    assert isinstance(app.tables, SeekFirstTableManager)
    assert isinstance(app.tables.recovery, SeekFirstRecovery)
