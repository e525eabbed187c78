"""The one workaround for an upstream faust-streaming bug, kept here and nowhere else.

Bug: after a rebalance, ``Recovery.on_recovery_completed`` resumes the stream
partitions (``consumer.resume_partitions``) *before* it seeks them back to the
committed offsets (``consumer.perform_seek``), while the fetcher keeps running:
records fetched in that window are delivered, then delivered again after the
seek.  The tables-less path had the same ordering bug, fixed upstream in
https://github.com/faust-streaming/faust/pull/217 (issue #216); the path with
recovery completion still has it in faust-streaming 0.15.3, and duplicates after
rebalances are still reported (https://github.com/faust-streaming/faust/issues/502).

Workaround: stop the consumer's flow before recovery completion runs (the
completion resumes it after the seek), so nothing is fetched in the window.  It
is installed through faust's documented ``TableManager`` setting -- a subclass,
not a patch of faust's classes -- and only for the version it was checked
against; ``tests/test_faust_compat.py`` fails when the upstream ordering changes.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.tables import TableManager
from faust.tables.recovery import Recovery

#: The faust-streaming releases whose recovery ordering this was checked against.
CHECKED_VERSIONS = ("0.15.",)


def check_version(version: str = faust.__version__) -> None:
    """Refuse to start on a faust release this workaround was not checked against."""
    if not version.startswith(CHECKED_VERSIONS):
        raise RuntimeError(
            f"faust-streaming {version}: workers/service/faust_compat.py was checked against "
            f"{', '.join(v + 'x' for v in CHECKED_VERSIONS)}; re-check the recovery ordering "
            "(faust-streaming/faust#216, #502) and update CHECKED_VERSIONS"
        )


class SeekFirstRecovery(Recovery):
    """Recovery that pauses fetching until the partitions were sought to committed offsets."""

    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        self.app.consumer.stop_flow()  # resumed by the completion, after perform_seek()
        await super().on_recovery_completed(generation_id)


class SeekFirstTableManager(TableManager):
    """``TableManager`` whose recovery service is :class:`SeekFirstRecovery`."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:  # faust's own lazily created attribute
            self._recovery = SeekFirstRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery


def app_settings() -> dict[str, Any]:
    """The ``faust.App`` settings that install the workaround."""
    check_version()
    return {"TableManager": SeekFirstTableManager}
