"""``chatflow doctor``: settings, data folder, database, port, agents, models, MCP servers
and platforms, one line each (``ok``, ``WARN`` or ``FAIL``)."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

import httpx

from bot.agents_loader import LoadedAgents, load_agents
from bot.config import Settings
from bot.core.agent import servers_of
from bot.core.mcp.servers import MCPServer
from bot.core.models.routing import ModelSettings, default_model_name, route_model
from bot.data_dir import ensure_data_dir
from bot.database import open_store
from bot.errors import ChatflowError
from bot.server import listen_socket
from bot.setting_typos import setting_typos
from bot.tracing.setup import environment as tracing_environment
from bot.tracing.setup import plan as tracing_plan

__all__ = ["CheckResult", "run_checks", "tools_line"]

TIMEOUT = httpx.Timeout(10.0)
OPENAI_DEFAULT_BASE = "https://api.openai.com/v1"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check."""

    name: str
    """What was checked."""
    ok: bool
    """Whether it passed."""
    detail: str
    """One line for the operator."""
    warning: bool = False
    """Passed, but worth a look (``WARN``): never fails the run."""


async def _check_database(settings: Settings) -> CheckResult:
    from bot.core.stores.postgres import PostgresSessionStore

    store = open_store(settings)
    try:
        query = "PRAGMA quick_check" if settings.database_dialect == "sqlite" else "SELECT 'ok'"
        async with store.transaction() as tx:
            rows = await tx.fetchall(query)
        verdict = str(rows[0][0]) if rows else "no answer"
        detail = f"{settings.database_label}: {verdict}"
        if isinstance(store, PostgresSessionStore) and verdict == "ok":
            proxied = await store.behind_proxy()
            detail += (
                f"; {store.max_connections} connections per process (DATABASE_CONNECTIONS)"
                + (
                    "; a pooler or proxy is in front of the server"
                    if proxied
                    else "; connected to the server directly"
                )
                + f", DATABASE_POOLER={settings.database_pooler}"
            )
            if proxied and settings.database_pooler != "transaction":
                return CheckResult(
                    "database",
                    True,
                    detail + " (set DATABASE_POOLER=transaction if it is PgBouncer in "
                    "transaction mode)",
                    warning=True,
                )
        return CheckResult("database", verdict == "ok", detail)
    finally:
        await store.close()


def _check_data_dir(settings: Settings) -> CheckResult:
    try:
        ensure_data_dir(settings.data_dir)
    except ChatflowError as exc:
        return CheckResult("data dir", False, str(exc))
    return CheckResult("data dir", True, f"{settings.data_dir.resolve()} (writable)")


def _check_http_port(settings: Settings) -> CheckResult:
    where = f"{settings.http_host}:{settings.http_port}"
    if settings.http_port == 0:
        return CheckResult("http", True, f"{settings.http_host}: a free port is picked at start")
    try:
        listen_socket(settings.http_host, settings.http_port).close()
    except ChatflowError as exc:
        return CheckResult("http", False, f"{exc} (is the bot already running?)")
    return CheckResult("http", True, f"{where} is free")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


async def _check_models(
    settings: Settings, loaded: LoadedAgents, client: httpx.AsyncClient
) -> list[CheckResult]:
    model_settings = ModelSettings.from_settings(settings)
    agents = loaded.starting_agent.reachable_agents()
    results = [CheckResult("agents", True, f"{_plural(len(agents), 'agent')} from {loaded.source}")]
    try:
        names = {a.model or default_model_name(model_settings) for a in agents}
        # The summary models (Compaction(model=...), COMPACTION_MODEL) are checked alike.
        chosen = [a.compaction or settings.compaction for a in agents]
        names |= {c.model for c in chosen if c is not None and isinstance(c.model, str)}
        routes = [(name, route_model(name, model_settings)) for name in sorted(names)]
    except ChatflowError as exc:
        return [CheckResult("agents", False, str(exc))]
    for name, route in routes:
        if route.provider == "offline":
            results.append(CheckResult(f"model {name}", True, "offline demo model (no network)"))
            continue
        base = (route.base_url or OPENAI_DEFAULT_BASE).rstrip("/")
        try:
            response = await client.get(
                f"{base}/models", headers={"Authorization": f"Bearer {route.api_key}"}
            )
        except httpx.HTTPError as exc:
            results.append(CheckResult(f"model {name}", False, f"{base}: {type(exc).__name__}"))
            continue
        ok = response.status_code == 200
        results.append(CheckResult(f"model {name}", ok, f"{base}: HTTP {response.status_code}"))
    return results


async def _check_mcp_server(server: MCPServer) -> CheckResult:
    """Start the server, list its tools, close it: ``mcp <name>: <where>: N tools: ...``."""
    name = f"mcp {server.name}"
    try:
        await server.connect()
    except ChatflowError as exc:
        optional = " (optional: the bot starts without it)" if server.optional else ""
        reason = server.last_error or str(exc)
        detail = f"{server.describe()}: failed to start: {reason}{optional}"
        return CheckResult(name, server.optional, detail)
    finally:
        tools = [t.name for t in server.tools]
        await server.close()
    return CheckResult(name, True, f"{server.describe()}: {tools_line(tools)}")


def tools_line(tools: Sequence[str]) -> str:
    """``1 tool: lookup_customer``, ``2 tools: a, b``, ``0 tools: none``."""
    listed = ", ".join(tools) if tools else "none"
    return f"{len(tools)} tool{'' if len(tools) == 1 else 's'}: {listed}"


def _check_approvals(loaded: LoadedAgents) -> CheckResult:
    """``approvals: Billing: request_refund; Ops: wipe (sometimes)``: the tools whose
    calls wait for a person's yes, per agent (MCP tools never do)."""
    gated = []
    for agent in loaded.starting_agent.reachable_agents():
        names = [
            t.name
            if t.needs_approval is True or isinstance(t.needs_approval, str)
            else f"{t.name} (when its check says so)"
            for t in agent.function_tools
            if t.gated
        ]
        if names:
            gated.append(f"{agent.name}: {', '.join(names)}")
    detail = "; ".join(gated) if gated else "no tool waits for approval"
    return CheckResult("approvals", True, detail)


def _check_voice(settings: Settings, loaded: LoadedAgents) -> CheckResult:
    """``voice replies: auto, gpt-4o-mini-tts (alloy); Concierge: always``, and a
    warning when nothing could speak them (no key for a real model)."""
    agents = [
        f"{agent.name}: {agent.voice.mode}"
        for agent in loaded.starting_agent.reachable_agents()
        if agent.voice is not None and agent.voice.mode is not None
    ]
    spoken = settings.voice_replies != "off" or any(not line.endswith(": off") for line in agents)
    if not spoken:
        return CheckResult("voice replies", True, "off (VOICE_REPLIES=auto answers voice notes)")
    detail = "; ".join(
        [f"{settings.voice_replies}, {settings.tts_model} ({settings.tts_voice})", *agents]
    )
    model = default_model_name(ModelSettings.from_settings(settings))
    if not settings.openai_api_key and model != "offline":
        return CheckResult(
            "voice replies", True, f"{detail}; no OPENAI_API_KEY: replies stay text", warning=True
        )
    return CheckResult("voice replies", True, detail)


async def _check_tracing(client: httpx.AsyncClient) -> CheckResult:
    """``tracing: OTLP/HTTP to http://collector:4318/v1/traces (service chatflow, ...)``,
    or why it is off; a warning when message content is captured, or when the
    collector does not take an (empty) export: the bot would drop its spans."""
    env = tracing_environment()
    chosen = tracing_plan(env)
    if chosen.exporter != "otlp" or chosen.endpoint is None:
        return CheckResult("tracing", True, chosen.reason, warning=chosen.capture_content)
    headers = {"content-type": "application/x-protobuf", **_otlp_headers(env)}
    try:
        # An export with no span: answered as any other, it stores nothing.
        answer = await client.post(chosen.endpoint, content=b"", headers=headers)
    except httpx.HTTPError as exc:
        problem = f"nothing answers there ({type(exc).__name__}): spans would be dropped"
    else:
        if answer.is_success:
            return CheckResult("tracing", True, chosen.reason, warning=chosen.capture_content)
        problem = f"the collector refused an export (HTTP {answer.status_code})"
        if answer.status_code in (401, 403):
            problem += ": check OTEL_EXPORTER_OTLP_HEADERS"
    return CheckResult("tracing", True, f"{chosen.reason}; {problem}", warning=True)


def _otlp_headers(env: Mapping[str, str]) -> dict[str, str]:
    """The OTLP exporter's headers as the SDK reads them: ``key=value`` pairs, comma
    separated, URL-encoded; the traces-only variable wins."""
    raw = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS")
    headers: dict[str, str] = {}
    for pair in (raw or "").split(","):
        name, sep, value = pair.partition("=")
        if sep and name.strip():
            headers[unquote(name.strip()).lower()] = unquote(value.strip())
    return headers


async def _check_knowledge(settings: Settings, loaded: LoadedAgents) -> CheckResult:
    """The knowledge base: its size, its search mode, and a warning when agents search an
    empty base or ``EMBEDDING_MODEL`` is set where vectors cannot be stored."""
    from bot.core.knowledge.index import list_sources
    from bot.core.knowledge.service import KnowledgeBase
    from bot.knowledge_cli import knowledge_settings_from

    users = [
        agent.name
        for agent in loaded.starting_agent.reachable_agents()
        if any(t.name == "search_knowledge" for t in agent.function_tools)
    ]
    store = open_store(settings)
    try:
        await store.open()
        base = KnowledgeBase(store, knowledge_settings_from(settings).embedder)
        sources = await list_sources(store)
        vectors = await base.vectors_ready()
    finally:
        await store.close()
    size = f"{len(sources)} sources, {sum(s.chunk_count for s in sources)} passages"
    mode = f"hybrid ({settings.embedding_model})" if vectors else "full text"
    if base.vectors_unavailable:
        return CheckResult(
            "knowledge", True, f"{size}; full text only: {base.vectors_unavailable}", warning=True
        )
    if users and not sources:
        return CheckResult(
            "knowledge",
            True,
            f"{', '.join(users)} search it, but it is empty: "
            "python -m bot knowledge add PATH (make run adds agents/knowledge)",
            warning=True,
        )
    used = f"searched by {', '.join(users)}" if users else "no agent has search_knowledge"
    return CheckResult("knowledge", True, f"{size}; {mode}; {used}")


async def _check_mcp(loaded: LoadedAgents) -> list[CheckResult]:
    agents = loaded.starting_agent.reachable_agents()
    return [await _check_mcp_server(server) for server in servers_of(agents)]


async def _check_telegram(settings: Settings, client: httpx.AsyncClient) -> CheckResult:
    assert settings.telegram_bot_token is not None
    token = settings.telegram_bot_token.get_secret_value()
    try:
        response = await client.post(f"{settings.telegram_api_base_url}{token}/getMe")
    except httpx.HTTPError as exc:
        return CheckResult(
            "telegram",
            False,
            f"Telegram unreachable ({type(exc).__name__}): check the network, or "
            "TELEGRAM_API_BASE_URL; the bot would retry at start",
        )
    if response.status_code != 200:
        return CheckResult(
            "telegram",
            False,
            f"getMe answered HTTP {response.status_code}: check TELEGRAM_BOT_TOKEN",
        )
    username = response.json().get("result", {}).get("username", "?")
    mode = "webhook" if settings.telegram_webhook_url else "long polling"
    return CheckResult("telegram", True, f"@{username}, {mode}")


async def _check_whatsapp(settings: Settings, client: httpx.AsyncClient) -> CheckResult:
    from bot.platforms.whatsapp.adapter import DEFAULT_API_VERSION

    if settings.whatsapp_app_secret is None and not settings.whatsapp_insecure_dev:
        return CheckResult("whatsapp", False, "WHATSAPP_APP_SECRET is not set")
    assert settings.whatsapp_token is not None
    url = (
        f"{settings.whatsapp_api_base_url.rstrip('/')}/v{DEFAULT_API_VERSION}/"
        f"{settings.whatsapp_phone_id}"
    )
    headers = {"Authorization": f"Bearer {settings.whatsapp_token.get_secret_value()}"}
    try:
        response = await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        return CheckResult("whatsapp", False, f"Graph API unreachable ({type(exc).__name__})")
    if response.status_code != 200:
        return CheckResult(
            "whatsapp",
            False,
            f"phone number lookup answered HTTP {response.status_code}: "
            "check WHATSAPP_PHONE_ID and WHATSAPP_TOKEN",
        )
    return CheckResult("whatsapp", True, "phone number found")


def _whatsapp_template(settings: Settings) -> CheckResult:
    """``whatsapp template: reminder_v1 (en_US)``, or what happens without one."""
    name = settings.whatsapp_template_name
    if not name:
        return CheckResult(
            "whatsapp template",
            True,
            "not set: replies after 24 h of silence are abandoned (WHATSAPP_TEMPLATE_NAME)",
            warning=True,
        )
    return CheckResult("whatsapp template", True, f"{name} ({settings.whatsapp_template_language})")


def _access(settings: Settings) -> CheckResult:
    """``access: mode pairing (codes valid 86400 s); rate limit 20 messages / 60 s``."""
    mode = settings.effective_access_mode
    detail = f"mode {mode}"
    if mode == "pairing":
        detail += f" (codes valid {settings.pairing_code_ttl_seconds} s)"
    if mode != "open":
        lists = len(settings.allowed_users), len(settings.allowed_chats)
        detail += f", {lists[0]} allowed users, {lists[1]} allowed chats"
    limit = settings.rate_limit_messages
    window = settings.rate_limit_window_seconds
    detail += (
        "; no rate limit" if limit is None else f"; rate limit {limit} messages / {window:g} s"
    )
    budget = settings.max_tokens_per_sender_per_day
    detail += "" if budget is None else f"; token budget {budget} per sender per UTC day"
    return CheckResult("access", True, detail)


async def _guard(name: str, check: Callable[[], Awaitable[CheckResult]]) -> CheckResult:
    try:
        return await check()
    except ChatflowError as exc:
        return CheckResult(name, False, str(exc))


async def run_checks(settings: Settings) -> int:
    """Run every check, print one line each, return the process exit code."""
    results = [CheckResult("settings", True, "loaded")]
    results += [
        # A misspelt security setting FAILs: `run` refuses to start with it.
        CheckResult("settings", not typo.fatal, typo.message(), warning=not typo.fatal)
        for typo in setting_typos(Settings.model_fields)
    ]
    data_dir = _check_data_dir(settings)
    results += [data_dir, _access(settings)]
    if data_dir.ok or settings.database_dialect == "postgres":
        results.append(await _guard("database", lambda: _check_database(settings)))
    else:
        results.append(CheckResult("database", False, "not checked: DATA_DIR is unusable"))
    results.append(_check_http_port(settings))
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        results.append(await _check_tracing(client))
        loaded: LoadedAgents | None = None
        try:
            loaded = load_agents(settings.agents_module)
        except ChatflowError as exc:
            results.append(CheckResult("agents", False, str(exc)))
        if loaded is not None:
            results.extend(await _check_models(settings, loaded, client))
            results.append(_check_approvals(loaded))
            results.append(_check_voice(settings, loaded))
            if data_dir.ok or settings.database_dialect == "postgres":
                results.append(
                    await _guard("knowledge", lambda: _check_knowledge(settings, loaded))
                )
            results.extend(await _check_mcp(loaded))
        if settings.telegram_enabled:
            results.append(await _guard("telegram", lambda: _check_telegram(settings, client)))
        if settings.whatsapp_enabled:
            results.append(await _guard("whatsapp", lambda: _check_whatsapp(settings, client)))
            results.append(_whatsapp_template(settings))
        if not (settings.telegram_enabled or settings.whatsapp_enabled):
            web = " and the console's web chat" if settings.console_token is not None else ""
            results.append(
                CheckResult(
                    "platforms",
                    True,
                    f"none configured: the terminal chat{web} only (TELEGRAM_BOT_TOKEN or "
                    "the WHATSAPP_* settings connect one)",
                )
            )
    for result in results:
        mark = "FAIL" if not result.ok else "WARN" if result.warning else "ok  "
        print(f"{mark} {result.name}: {result.detail}", file=sys.stdout)
    return 0 if all(r.ok for r in results) else 1
