"""The audit page (``reval audit serve``): people compare two pairs of hashtags and pick
the more related one; every vote is an event in the Kafka ``votes`` log.

aiohttp (already in the stack through Faust).  What the server keeps in memory is derived
from the log (:func:`stream.auditing.audit.replay`), so a restart -- even after ``kill -9`` -- picks
up exactly where the log ends, and the log alone replays an audit.  A vote is answered
200 only after the broker acknowledged it (``acks=all``); a vote the broker did not take
is answered 503 and changes nothing.  One server per audit (it is the log's only writer).

Endpoints: ``GET /`` the page (``/app.js``, ``/style.css``), ``GET /api/next`` the next
comparison for a voter (held for that voter ``LEASE_S`` seconds, so two people do not
answer the same one), ``POST /api/vote``, ``GET /api/state``.  Errors are JSON
``{"error": reason, "detail": ...}``: 400 ``bad_json`` / ``bad_vote``, 401 ``token``,
404 ``unknown_comparison``, 409 ``replayed`` / ``already_voted``, 413 (a body over
``MAX_BODY`` bytes), 415 ``content_type``, 503 ``log_unavailable``.

Access: loopback by default; with a token (``--token`` / ``REVAL_AUDIT_TOKEN``) every
request must carry it (header ``X-Audit-Token``, or the cookie that ``/?token=...`` sets,
``HttpOnly; SameSite=Strict``), compared in constant time.  Votes must be
``application/json`` (a cross-site form cannot send that without a CORS preflight, which
is never granted), and the page loads no outside resource (a strict CSP).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from aiohttp import web

from stream.auditing.audit import AuditState, Plan, replay
from stream.auditing.ballots import VoteError
from workers.service.thesaurus_audit import VoteLog

log = logging.getLogger("reval.audit")

MAX_BODY = 4096
LEASE_S = 120.0
COOKIE = "reval_audit_token"
STATUS = {
    "bad_json": 400,
    "bad_vote": 400,
    "bad_outcome": 400,
    "unknown_comparison": 404,
    "finished": 409,
    "replayed": 409,
    "already_voted": 409,
}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(reason: str, detail: str, status: int | None = None) -> web.Response:
    return web.json_response({"error": reason, "detail": detail}, status=status or STATUS.get(reason, 400))


def open_audit(log_: VoteLog, plan: Plan) -> AuditState:
    """The state of ``plan.audit`` from the log; the plan is appended when the log has
    none for it (a new audit).  An audit already planned keeps its own plan."""
    log_.ensure()
    states = replay(log_.events())
    if plan.audit not in states:
        log_.append({"type": "plan", "audit": plan.audit, "plan": plan.to_dict()})
        states = replay(log_.events())
    return states[plan.audit]


class AuditServer:
    """The page and its API for one audit."""

    def __init__(
        self,
        state: AuditState,
        log_: VoteLog,
        examples: Mapping[str, Sequence[str]] | None = None,
        token: str | None = None,
    ) -> None:
        self.state = state
        self.log = log_
        self.examples = {h: list(v)[:2] for h, v in (examples or {}).items()}
        self.token = token or None
        self.lock = asyncio.Lock()
        self.leases: dict[tuple[int, str], tuple[str, float]] = {}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._guard])
        app.add_routes(
            [
                web.get("/", self.page),
                web.get("/app.js", self.asset),
                web.get("/style.css", self.asset),
                web.get("/favicon.ico", self.no_icon),
                web.get("/api/next", self.next_comparison),
                web.get("/api/state", self.progress),
                web.post("/api/vote", self.vote),
            ]
        )
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The token check (when one is set) and the security headers on every answer."""
        if self.token is not None:
            given = request.query.get("token") if request.path == "/" else None
            given = given or request.headers.get("X-Audit-Token") or request.cookies.get(COOKIE)
            if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
                response: web.StreamResponse = _error("token", "a valid audit token is required", 401)
                response.headers.update(HEADERS)
                return response
            if "token" in request.query:  # keep the token out of the address bar and history
                found = web.HTTPSeeOther("/")
                found.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict", path="/")
                raise found
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status == 413:
                response = _error("too_large", f"a request body holds at most {MAX_BODY} bytes", 413)
            else:
                raise
        response.headers.update(HEADERS)
        return response

    async def page(self, request: web.Request) -> web.Response:
        return web.Response(text=_asset("audit.html"), content_type="text/html", charset="utf-8")

    async def no_icon(self, request: web.Request) -> web.Response:
        return web.Response(status=204)  # the page has no icon; a 404 would be a console error

    async def asset(self, request: web.Request) -> web.Response:
        name = request.path.lstrip("/")
        kind = "text/javascript" if name.endswith(".js") else "text/css"
        return web.Response(text=_asset(name), content_type=kind, charset="utf-8")

    def _progress(self) -> dict[str, Any]:
        plan = self.state.plan
        return {
            "audit": plan.audit,
            "votes": self.state.votes,
            "total": plan.comparisons,
            "finished": self.state.finished,
            "ballots": [
                {"area": a.seed, "ballot": min(c.ballot_number, plan.n_ballots), "of": plan.n_ballots}
                for a, c in zip(plan.areas, self.state.campaigns, strict=True)
            ],
        }

    async def progress(self, request: web.Request) -> web.Response:
        return web.json_response(self._progress())

    def _pair(self, area: int, item: int) -> dict[str, Any]:
        a, b = self.state.item(area, item)
        return {"hashtags": [a, b], "examples": {h: self.examples.get(h, []) for h in (a, b)}}

    async def next_comparison(self, request: web.Request) -> web.Response:
        voter = request.query.get("voter", "")[:64] or "anonymous"
        now = time.monotonic()
        self.leases = {k: v for k, v in self.leases.items() if v[1] > now}
        pending = self.state.pending()
        mine = [p for p in pending if self.leases.get((p[0], p[1]), ("",))[0] == voter]
        free = [p for p in pending if (p[0], p[1]) not in self.leases]
        choices = mine or free or pending
        if not choices:
            return web.json_response({"comparison": None, "progress": self._progress()})
        area, comparison, left, right = choices[0]
        self.leases[(area, comparison)] = (voter, now + LEASE_S)
        return web.json_response(
            {
                "area": area,
                "comparison": comparison,
                "left": self._pair(area, left),
                "right": self._pair(area, right),
                "progress": self._progress(),
            }
        )

    async def vote(self, request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            return _error("content_type", "votes are JSON (Content-Type: application/json)", 415)
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            return _error("bad_json", "the body is not valid JSON")
        if not isinstance(body, dict):
            return _error("bad_json", "the body must be a JSON object")
        event = {
            "type": "vote",
            "audit": self.state.plan.audit,
            "vote_id": body.get("vote_id"),
            "area": body.get("area"),
            "comparison": body.get("comparison"),
            "choice": body.get("choice"),
            "voter": str(body.get("voter", ""))[:64],
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        async with self.lock:  # one vote at a time: check, log, count
            try:
                self.state.check_vote(event)
            except VoteError as exc:
                return _error(exc.reason, str(exc))
            try:
                await asyncio.to_thread(self.log.append, event)
            except Exception as exc:  # the broker did not acknowledge: nothing is counted
                log.error("vote %s not recorded: %s", event["vote_id"], exc)
                return _error("log_unavailable", "the vote log is unavailable; nothing was recorded", 503)
            self.state.apply(event)
            self.leases.pop((body["area"], body["comparison"]), None)
        return web.json_response({"ok": True, "progress": self._progress()})


def _asset(name: str) -> str:
    return resources.files("workers.service").joinpath("audit_page", name).read_text(encoding="utf-8")


def serve(server: AuditServer, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    """Run until SIGINT or SIGTERM; ``on_ready(url)`` once the socket listens (port 0: a
    free port, named in the URL)."""

    async def main() -> None:
        runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            bound_host, bound_port = runner.addresses[0][:2]
            shown = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
            on_ready(f"http://{shown}:{bound_port}/")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await runner.cleanup()
            await asyncio.to_thread(server.log.close)

    asyncio.run(main())
