"""The console's pages and actions (each behind ``Guard``), and its route table.

Pages are server-rendered; every action is a POST form answered with a
redirect to the page it came from (post/redirect/get), so the console works
with any browser, a screen reader or ``curl``.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from bot.console import queries
from bot.console.auth import COOKIE_NAME, SESSION_SECONDS, Principal
from bot.console.guard import Guard, client_of, read_form, secure
from bot.console.sse import transcript_stream
from bot.console.templating import STATIC_TYPES, ConsoleAssets
from bot.console.webchat import WEB_PLATFORM, WebChannel
from bot.core.approvals import short_arguments
from bot.core.knowledge.index import list_sources
from bot.core.parts import describe_size
from bot.core.prices import Prices
from bot.core.stores.base import TransactionalStore
from bot.errors import ChatflowError
from bot.gateway.approvals import approval_rows
from bot.gateway.contract import MessageEvent
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.scheduled_jobs import cancel_job, scheduled_jobs
from bot.gateway.takeover import ConversationNotFoundError, OperatorDesk, Takeovers
from bot.metrics import Metrics
from bot.usage_report import format_session_totals, session_usage

__all__ = ["MAX_REPLY_CHARS", "ConsoleServices", "ConsoleViews"]

logger = logging.getLogger(__name__)

MAX_REPLY_CHARS: Final = 16_000
"""Longest reply an operator may send."""
_SESSION_ID_RE: Final = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
_OBLIGATION_ID_RE: Final = re.compile(r"[0-9a-f]{1,64}")
_SHA256_RE: Final = re.compile(r"[0-9a-f]{64}")
_JOB_ID_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_APPROVAL_ID_RE: Final = re.compile(r"[0-9a-f]{12}")
_INLINE_IMAGES: Final = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
"""Shown in the page; any other file is only downloaded (an SVG could carry script)."""
_ERRORS: Final = {
    "noroute": "No message of this conversation says where to reply (it may have been pruned).",
    "empty": "A reply needs some text.",
    "failed": "The reply could not be recorded; nothing was sent. Try again.",
    "ignored": "The bot ignored it: with an allow list, add console-operator to ALLOWED_USERS.",
    "noweb": "The web channel is not running.",
    "expired": "That choice has expired or was already made.",
    "compactfailed": "The summary failed; the conversation is unchanged. Try again later.",
    "compactnothing": "Nothing to compact: the conversation is no longer than its recent turns.",
    "nocompact": "Compaction is not available here.",
}


@dataclass(frozen=True, slots=True)
class ConsoleServices:
    """What the console reads and acts on, from the running gateway."""

    store: TransactionalStore
    """The session store (read through SQL)."""
    ledger: DeliveryLedger
    """The delivery ledger (retry, abandon)."""
    takeovers: Takeovers
    """Takeover state (the one the message path reads)."""
    desk: OperatorDesk
    """Sends a person's replies."""
    send_requeued: Callable[[], Awaitable[int]]
    """Sends rows the operator re-queued now (``Gateway.retry_due(sweep=True)``)."""
    platforms: tuple[str, ...]
    """Platform names, for the filter."""
    metrics: Metrics
    """This process's metrics (summarised on the ledger page)."""
    web: WebChannel | None = None
    """The web channel, to try the agents from the browser (``None``: not offered)."""
    session_of: Callable[[MessageEvent], str] | None = None
    """The session id a message is routed to (``Gateway.session_key_for`` hashed)."""
    read_media: Callable[[str], Awaitable[bytes | None]] | None = None
    """The bytes of an attachment by SHA-256 (``MediaStore.read``); ``None``: not shown."""
    prices: Prices | None = None
    """``MODEL_PRICES``: a conversation's header shows its cost too (``None``: tokens only)."""
    compact: Callable[[str], Awaitable[str]] | None = None
    """Compacts a session now, returning the outcome (``Runner.compact``); ``None``: no button."""
    decide_approval: Callable[[str, Literal["approve", "deny"]], Awaitable[str]] | None = None
    """The operator's Approve / Deny of a gated tool call (``Approvals.decide``); ``None``:
    the Approvals page only lists."""
    forget_person: Callable[[str], Awaitable[list[str]]] | None = None
    """``forget-user``: erases one person (``PLATFORM:USER_ID``), returning what it removed
    per kind (``bot.gateway.erasure``); ``None``: the Memory page only lists."""


class ConsoleViews:
    """Handlers of every console route."""

    def __init__(
        self, services: ConsoleServices, guard: Guard, assets: ConsoleAssets, prefix: str
    ) -> None:
        self.services = services
        self.guard = guard
        self.assets = assets
        self.prefix = prefix

    def routes(self) -> list[BaseRoute]:
        """The console's routes, every one behind the guard except sign-in and static."""
        p, wrap = self.prefix, self.guard.wrap
        return [
            Route(f"{p}/login", self.login_form, methods=["GET"]),
            Route(f"{p}/login", self.login, methods=["POST"]),
            Route(f"{p}/static/{{name}}", self.static, methods=["GET"]),
            Route(f"{p}/logout", wrap(self.logout), methods=["POST"]),
            Route(p, wrap(self.conversations, page=True), methods=["GET"]),
            Route(f"{p}/ledger", wrap(self.ledger, page=True), methods=["GET"]),
            Route(f"{p}/ledger/{{oid}}/retry", wrap(self.retry), methods=["POST"]),
            Route(f"{p}/ledger/{{oid}}/abandon", wrap(self.abandon), methods=["POST"]),
            Route(f"{p}/c/{{sid}}", wrap(self.transcript, page=True), methods=["GET"]),
            Route(f"{p}/c/{{sid}}/messages", wrap(self.messages), methods=["GET"]),
            Route(f"{p}/c/{{sid}}/live", wrap(self.live), methods=["GET"]),
            Route(f"{p}/c/{{sid}}/media/{{sha}}", wrap(self.media), methods=["GET"]),
            Route(f"{p}/c/{{sid}}/events", wrap(self.events), methods=["GET"]),
            Route(f"{p}/c/{{sid}}/takeover", wrap(self.take_over), methods=["POST"]),
            Route(f"{p}/c/{{sid}}/handback", wrap(self.hand_back), methods=["POST"]),
            Route(f"{p}/c/{{sid}}/compact", wrap(self.compact), methods=["POST"]),
            Route(f"{p}/c/{{sid}}/reply", wrap(self.reply), methods=["POST"]),
            Route(f"{p}/c/{{sid}}/send", wrap(self.send), methods=["POST"]),
            Route(f"{p}/scheduled", wrap(self.scheduled, page=True), methods=["GET"]),
            Route(f"{p}/scheduled/{{jid}}/cancel", wrap(self.cancel_job), methods=["POST"]),
            Route(f"{p}/approvals", wrap(self.approvals, page=True), methods=["GET"]),
            Route(f"{p}/knowledge", wrap(self.knowledge, page=True), methods=["GET"]),
            Route(f"{p}/approvals/{{aid}}/{{choice}}", wrap(self.decide), methods=["POST"]),
            Route(f"{p}/web", wrap(self.web_page, page=True), methods=["GET"]),
            Route(f"{p}/web", wrap(self.web_start), methods=["POST"]),
            Route(f"{p}/c/{{sid}}/say", wrap(self.web_say), methods=["POST"]),
            Route(f"{p}/c/{{sid}}/tap", wrap(self.web_tap), methods=["POST"]),
        ]

    # -- helpers -------------------------------------------------------------

    def _html(
        self, name: str, who: Principal | None, status: int = 200, **context: Any
    ) -> Response:
        csrf = "" if who is None or who.session is None else self.guard.auth.csrf_for(who.session)
        extra: dict[str, Any] = {}
        if who is not None:
            extra = {"csrf": csrf, "web_enabled": self.services.web is not None}
        now = datetime.now(UTC)
        body = self.assets.render(
            name,
            prefix=self.prefix,
            ago=lambda moment: _ago(moment, now),
            platform_label=queries.platform_label,
            part_label=queries.part_label,
            size=describe_size,
            media_on=self.services.read_media is not None,
            inline_images=_INLINE_IMAGES if self.services.read_media else frozenset(),
            **extra,
            **context,
        )
        return HTMLResponse(body, status_code=status)

    async def _page(self, name: str, who: Principal, **context: Any) -> Response:
        """A whole page: with the navigation's counts of what waits for a person."""
        store = self.services.store
        waiting = sum(r.state == "waiting" for r in await queries.needing_a_person(store))
        counts = await queries.ledger_counts(store)
        needs = sum(counts[state] for state in queries.ATTENTION)
        return self._html(name, who, waiting_count=waiting, ledger_attention=needs, **context)

    def _back(self, path: str, error: str | None = None) -> Response:
        target = f"{self.prefix}{path}" + (f"?error={error}" if error else "")
        return RedirectResponse(target, status_code=303)

    @staticmethod
    def _sid(request: Request) -> str | None:
        sid = str(request.path_params["sid"])
        return sid if _SESSION_ID_RE.fullmatch(sid) else None

    # -- sign-in -------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        """The sign-in form."""
        return secure(self._login_page(request.query_params.get("next", "")))

    def _login_page(self, target: str, error: str = "", status: int = 200) -> Response:
        body = self.assets.render(
            "login.html", prefix=self.prefix, next=self._safe_next(target), error=error
        )
        return HTMLResponse(body, status_code=status)

    def _safe_next(self, target: str) -> str:
        # Only a path of the console itself: never an open redirect.
        ok = target.startswith(self.prefix) and not target.startswith("//") and "\\" not in target
        return target if ok else self.prefix

    async def login(self, request: Request) -> Response:
        """Check the posted token; set the session cookie."""
        form = await read_form(request) or {}
        # The token is judged before any throttle: the right one always signs in.
        check = self.guard.auth.check(form.get("token", ""), client_of(request))
        if not check.ok:
            if check.retry_after:  # logged once per window by ``ConsoleAuth``
                response: Response = self._login_page("", "Too many wrong tokens; wait.", 429)
                response.headers["Retry-After"] = str(int(check.retry_after) + 1)
                return secure(response)
            # INFO: a typo is no alarm, and a warning would land in the middle of a
            # terminal chat (``quiet_console_logs``); a guessing run is warned of
            # once per window by ``ConsoleAuth``.
            logger.info("console sign-in refused: wrong token")
            return secure(self._login_page(form.get("next", ""), "Wrong token.", 401))
        response = RedirectResponse(self._safe_next(form.get("next", "")), status_code=303)
        response.set_cookie(
            COOKIE_NAME,
            await self.guard.sign_in(),
            max_age=SESSION_SECONDS,
            path=self.prefix,
            httponly=True,
            samesite="strict",
            # The scheme the browser used: uvicorn takes it from X-Forwarded-Proto
            # when the peer is a proxy FORWARDED_ALLOW_IPS trusts.
            secure=_https(request),
        )
        logger.info("console sign-in")
        return secure(response)

    async def logout(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """End the session server-side, and drop its cookie."""
        await self.guard.sign_out(who)
        response = self._back("/login")
        response.delete_cookie(
            COOKIE_NAME, path=self.prefix, httponly=True, samesite="strict", secure=_https(request)
        )
        return response

    async def static(self, request: Request) -> Response:
        """``console.js`` and ``console.css``; anything else is 404 (no listing)."""
        name = str(request.path_params["name"])
        if name not in STATIC_TYPES:
            return secure(PlainTextResponse("not found", status_code=404))
        response = Response(self.assets.static[name], media_type=STATIC_TYPES[name])
        response.headers["Cache-Control"] = "private, max-age=300"
        return secure(response)

    # -- conversations ---------------------------------------------------------

    async def conversations(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """The conversation list: filter by platform, search by text, key-set pages."""
        params = request.query_params
        platform = params.get("platform", "").strip()
        if platform not in self.services.platforms:
            platform = ""
        search = params.get("q", "").strip()[:200]
        before = params.get("before", "").strip() or None
        person = params.get("view") == "person"
        next_cursor: str | None = None
        if person:  # what waits for a person: a short list, no pages
            rows = await queries.needing_a_person(self.services.store)
            platform = search = ""
            before = None
        else:
            rows, next_cursor = await queries.list_conversations(
                self.services.store,
                platform=platform or None,
                search=search or None,
                before=before,
            )

        def query(**values: str | None) -> str:
            return urlencode({k: v for k, v in values.items() if v})

        return await self._page(
            "conversations.html",
            who,
            rows=rows,
            person=person,
            platforms=self.services.platforms,
            platform=platform,
            search=search,
            before=before,
            next_cursor=next_cursor,
            query=query,
            search_window=queries.SEARCH_WINDOW,
        )

    async def transcript(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """One conversation: its messages live, takeover controls and the reply box."""
        sid = self._sid(request)
        row = None if sid is None else await self._opened(sid)
        if sid is None or row is None:
            return PlainTextResponse("no such conversation", status_code=404)
        items = await queries.transcript(self.services.store, sid)
        # The inbox beside the transcript (wide screens): its first page.
        inbox, _ = await queries.list_conversations(self.services.store)
        return await self._page(
            "transcript.html",
            who,
            row=row,
            usage=await self._usage(sid),
            sid=sid,
            web=self._is_web(sid),
            items=items,
            inbox=inbox,
            error=_ERRORS.get(request.query_params.get("error", ""), ""),
            nonce=uuid.uuid4().hex,
            send_nonce=uuid.uuid4().hex,
            max_reply=MAX_REPLY_CHARS,
        )

    async def _opened(self, sid: str) -> queries.ConversationRow | None:
        """The conversation an operator looks at, marked read; ``None``: no such one."""
        store = self.services.store
        row = await queries.conversation(store, sid)
        if row is None:
            if self._is_web(sid):
                # Just started from the web page: its session is created when its turn
                # begins (the live view brings the real header in then).
                return queries.ConversationRow(sid, WEB_PLATFORM, "DM", "…", "", 0, False)
            return None
        if row.unread:
            await queries.mark_read(store, sid)
        return row

    async def messages(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """The rendered messages of a transcript."""
        sid = self._sid(request)
        if sid is None:
            return PlainTextResponse("no such conversation", status_code=404)
        items = await queries.transcript(self.services.store, sid)
        return self._html("messages.html", who, items=items, sid=sid)

    async def live(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """What the live view swaps in: the header (state, agent, buttons) and the messages."""
        sid = self._sid(request)
        row = None if sid is None else await self._opened(sid)
        if sid is None or row is None:
            return PlainTextResponse("no such conversation", status_code=404)
        items = await queries.transcript(self.services.store, sid)
        usage = await self._usage(sid)
        return self._html("live.html", who, row=row, items=items, sid=sid, usage=usage)

    async def _usage(self, sid: str) -> str:
        """The conversation's token totals (and cost, with ``MODEL_PRICES``), one line."""
        by_model = await session_usage(self.services.store, sid)
        return format_session_totals(by_model, self.services.prices)

    async def media(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """An attachment of this conversation: an image shown inline, any other file
        downloaded; a file no message of the conversation names is 404."""
        sid, sha = self._sid(request), str(request.path_params["sha"])
        read = self.services.read_media
        if sid is None or read is None or not _SHA256_RE.fullmatch(sha):
            return PlainTextResponse("not found", status_code=404)
        part = await queries.media_part(self.services.store, sid, sha)
        data = None if part is None else await read(sha)
        if part is None or data is None:
            return PlainTextResponse("not found", status_code=404)
        mime = getattr(part, "mime_type", "")
        if mime in _INLINE_IMAGES:
            response = Response(data, media_type=mime)
            response.headers["Content-Disposition"] = "inline"
        else:
            response = Response(data, media_type="application/octet-stream")
            response.headers["Content-Disposition"] = "attachment"
        response.headers["Cache-Control"] = "private, max-age=3600"
        return response

    async def events(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """The live stream of a transcript (Server-Sent Events)."""
        sid = self._sid(request)
        if sid is None:
            return PlainTextResponse("no such conversation", status_code=404)
        return transcript_stream(self.services.store, sid)

    # -- takeover ------------------------------------------------------------

    async def take_over(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """Stop the bot answering this conversation."""
        sid = self._sid(request)
        if sid is None or await queries.conversation(self.services.store, sid) is None:
            return PlainTextResponse("no such conversation", status_code=404)
        await self.services.takeovers.take_over(sid)
        return self._back(f"/c/{sid}")

    async def hand_back(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """Let the bot answer this conversation again."""
        sid = self._sid(request)
        if sid is None:
            return PlainTextResponse("no such conversation", status_code=404)
        await self.services.takeovers.hand_back(sid)
        return self._back(f"/c/{sid}")

    async def compact(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """Summarise this conversation's older turns now (as ``/compact`` does)."""
        sid = self._sid(request)
        if sid is None or await queries.conversation(self.services.store, sid) is None:
            return PlainTextResponse("no such conversation", status_code=404)
        if self.services.compact is None:
            return self._back(f"/c/{sid}", "nocompact")
        outcome = await self.services.compact(sid)
        error = {"compacted": None, "failed": "compactfailed"}.get(outcome, "compactnothing")
        return self._back(f"/c/{sid}", error)

    async def reply(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """Send the operator's reply through the ledger, taking the conversation over."""
        return await self._operator_message(request, form, take_over=True)

    async def send(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """Send the operator's message through the ledger; the bot keeps answering."""
        return await self._operator_message(request, form, take_over=False)

    async def _operator_message(
        self, request: Request, form: Mapping[str, str], *, take_over: bool
    ) -> Response:
        sid = self._sid(request)
        if sid is None:
            return PlainTextResponse("no such conversation", status_code=404)
        text = form.get("text", "").replace("\r\n", "\n").strip()
        if not text or len(text) > MAX_REPLY_CHARS:
            return self._back(f"/c/{sid}", "empty")
        if await queries.conversation(self.services.store, sid) is None:
            return PlainTextResponse("no such conversation", status_code=404)
        if take_over:
            # A person replying means a person answers now: the bot must not talk over them.
            await self.services.takeovers.take_over(sid)
        try:
            await self.services.desk.reply(sid, text, nonce=_nonce(form))
        except ConversationNotFoundError:
            return self._back(f"/c/{sid}", "noroute")
        except ChatflowError as exc:
            logger.warning("operator reply in session %s failed: %s", sid, type(exc).__name__)
            return self._back(f"/c/{sid}", "failed")
        return self._back(f"/c/{sid}")

    # -- ledger ----------------------------------------------------------------

    async def ledger(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """Owed, failed and abandoned replies, with retry and abandon buttons."""
        store = self.services.store
        await self.services.ledger.flush()  # delivered marks buffered so far count
        rows = await queries.ledger_rows(store)
        counts = await queries.ledger_counts(store)
        taken = len(await self.services.takeovers.reload())
        chats = await queries.conversations_by_id(store, (o.session_id for o in rows))
        now = datetime.now(UTC)
        return await self._page(
            "ledger.html",
            who,
            attention=[o for o in rows if o.state in queries.ATTENTION],
            in_flight=[o for o in rows if o.state not in queries.ATTENTION],
            chats=chats,
            counts=counts,
            taken_over=taken,
            metrics=queries.metric_totals(self.services.metrics),
            age=lambda moment: queries.age(moment, now),
        )

    async def retry(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """``ledger retry``: re-queue a failed or abandoned reply, and send it now."""
        oid = str(request.path_params["oid"])
        if _OBLIGATION_ID_RE.fullmatch(oid) and await self.services.ledger.retry(oid):
            await self.services.send_requeued()
        return self._back("/ledger")

    async def abandon(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """``ledger abandon``: give an undelivered reply up."""
        oid = str(request.path_params["oid"])
        reason = form.get("reason", "").strip()[:200] or "abandoned in the console"
        if _OBLIGATION_ID_RE.fullmatch(oid):
            await self.services.ledger.abandon(oid, reason)
        return self._back("/ledger")

    # -- scheduled messages ------------------------------------------------------

    async def scheduled(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """Messages agents scheduled that are still waiting, with a cancel button each."""
        store = self.services.store
        jobs = await scheduled_jobs(store)
        chats = await queries.conversations_by_id(store, (j.session_id for j in jobs))
        return await self._page("scheduled.html", who, jobs=jobs, chats=chats)

    async def cancel_job(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """``schedule cancel``: a job not sent yet is never sent."""
        jid = str(request.path_params["jid"])
        if _JOB_ID_RE.fullmatch(jid):
            await cancel_job(self.services.store, jid)
        return self._back("/scheduled")

    # -- knowledge ------------------------------------------------------------------

    async def knowledge(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """The knowledge base's sources (``knowledge list``): passages and when added."""
        sources = await list_sources(self.services.store)
        return await self._page("knowledge.html", who, sources=sources)

    # -- approvals ------------------------------------------------------------------

    async def approvals(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """Tool calls waiting for a person's yes, with Approve / Deny each."""
        store = self.services.store
        rows = await approval_rows(store)
        chats = await queries.conversations_by_id(store, (r.session_id for r in rows))
        return await self._page(
            "approvals.html",
            who,
            rows=rows,
            chats=chats,
            short=short_arguments,
            can_decide=self.services.decide_approval is not None,
        )

    async def decide(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """``approvals approve|deny``: decided once (a second click changes nothing)."""
        aid, choice = str(request.path_params["aid"]), str(request.path_params["choice"])
        decide = self.services.decide_approval
        if decide is not None and _APPROVAL_ID_RE.fullmatch(aid):
            if choice == "approve":
                await decide(aid, "approve")
            elif choice == "deny":
                await decide(aid, "deny")
        return self._back("/approvals")

    # -- the web channel -----------------------------------------------------------

    def _is_web(self, sid: str) -> bool:
        return self.services.web is not None and sid.startswith(f"{WEB_PLATFORM}-")

    async def web_page(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """Try the agents: start a conversation, or open one started here before."""
        if self.services.web is None:
            return PlainTextResponse("the web channel is off", status_code=404)
        rows, _ = await queries.list_conversations(self.services.store, platform=WEB_PLATFORM)
        error = _ERRORS.get(request.query_params.get("error", ""), "")
        return await self._page("web.html", who, rows=rows, nonce=uuid.uuid4().hex, error=error)

    async def web_start(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """Start a new web conversation with its first message."""
        nonce = _nonce(form)
        return await self._say(f"try-{nonce[:12]}", form, nonce, "/web")

    async def web_say(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """Say something as the test user of a web conversation."""
        sid = self._sid(request)
        if sid is None or not self._is_web(sid):
            return PlainTextResponse("not a web conversation", status_code=404)
        route = await self.services.desk.route(sid)
        if route is None or route.platform != WEB_PLATFORM:
            return self._back(f"/c/{sid}", "noroute")
        return await self._say(route.chat_id, form, _nonce(form), f"/c/{sid}")

    async def web_tap(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """Click a button a reply of a web conversation carries: a tap, as a user's."""
        sid = self._sid(request)
        if sid is None or not self._is_web(sid) or self.services.web is None:
            return PlainTextResponse("not a web conversation", status_code=404)
        route = await self.services.desk.route(sid)
        token = form.get("token", "")
        if route is None or route.platform != WEB_PLATFORM or not token:
            return self._back(f"/c/{sid}", "noroute")
        try:
            accepted = await self.services.web.tap(
                route.chat_id, token, message_id=uuid.uuid4().hex
            )
        except ChatflowError as exc:
            logger.warning("web channel tap refused: %s", type(exc).__name__)
            return self._back(f"/c/{sid}", "noweb")
        return self._back(f"/c/{sid}", None if accepted else "expired")

    async def _say(self, chat_id: str, form: Mapping[str, str], nonce: str, back: str) -> Response:
        web, session_of = self.services.web, self.services.session_of
        text = form.get("text", "").replace("\r\n", "\n").strip()
        if web is None or session_of is None:
            return self._back(back, "noweb")
        if not text or len(text) > MAX_REPLY_CHARS:
            return self._back(back, "empty")
        try:
            event, accepted = await web.say(chat_id, text, message_id=nonce)
        except ChatflowError as exc:
            logger.warning("web channel message refused: %s", type(exc).__name__)
            return self._back(back, "noweb")
        session_id = session_of(event)
        if not accepted and await queries.conversation(self.services.store, session_id) is None:
            return self._back(back, "ignored")
        return self._back(f"/c/{session_id}")


def _ago(moment: datetime | str, now: datetime) -> str:
    """``moment`` as a list shows it: ``now``, ``5 min``, ``3 h``, ``2 d``."""
    if isinstance(moment, str):
        try:
            moment = datetime.fromisoformat(moment)
        except ValueError:
            return ""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if (now - moment).total_seconds() < 60:
        return "now"
    return queries.age(moment, now)


def _https(request: Request) -> bool:
    return request.url.scheme == "https"


def _nonce(form: Mapping[str, str]) -> str:
    nonce = form.get("nonce", "")
    return nonce if re.fullmatch(r"[0-9a-f]{32}", nonce) else uuid.uuid4().hex
