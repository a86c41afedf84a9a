"""The built-in demo model: deterministic, no network, no key.

It lets the whole pipeline (platforms, sessions, tools, handoffs, ledger) run
before any API key is configured. Every answer starts with ``[offline demo]``
so nobody mistakes it for a real model. Rules, in order:

1. The last message answers a tool call: summarise that result in a sentence.
   (After a handoff, the new agent instead answers the user's message by
   rules 3-4, so agents never bounce the conversation back and forth.)
2. A handoff target's name or description shares a word with the user's
   text (``"refund"`` ~ "Handles refunds"): call that ``transfer_to_`` tool.
3. A tool fits the text: its ``*_id`` parameter can be read from it (``#1234``,
   ``order 1234``), or it takes no required arguments and a word of its name
   appears in the text: call it.
4. The user's message carries media (a photo, a voice note, a document...):
   describe what arrived, plainly (``offline_media``).
5. Otherwise echo a short helpful answer that names the agent.

A voice note's transcript counts as the user's text for rules 2 and 3.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bot.core.messages import Message, Role, ToolCall
from bot.core.models.base import ModelResponse, OnText, ToolSpec, Usage, current_agent_name
from bot.core.models.offline_media import describe_media, spoken_text

__all__ = ["OFFLINE_PREFIX", "OfflineModel"]

OFFLINE_PREFIX = "[offline demo] "
"""Every offline answer starts with this label."""

_STOPWORDS_TEXT = """
a an and are as at be but by can do does for from hand handle handles help helps how i in into
is it its me my of on or our over please question questions that the their them this to us we
what when where which who why will with you your agent agents conversation anything something
about other others any all some request requests user users
"""
_GENERIC_TOOL_WORDS_TEXT = (
    "get set fetch find lookup look up check list show read query search tool"
)
_STOPWORDS = frozenset(_STOPWORDS_TEXT.split())
_GENERIC_TOOL_WORDS = frozenset(_GENERIC_TOOL_WORDS_TEXT.split())
_SUFFIXES = ("ing", "es", "s", "ed")
_WORD_RE = re.compile(r"[^\W_]+", re.UNICODE)
_PIECE_RE = re.compile(r"\s*\S+\s*|\s+")
_EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")
_MAX_SUMMARY = 300
_HANDOFF_PREFIX = "transfer_to_"  # bot.core.agent.HANDOFF_PREFIX (importing it would cycle)


def _stem(word: str) -> str:
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD_RE.findall(text)]


def _keywords(text: str, *, extra_stop: frozenset[str] = frozenset()) -> set[str]:
    return {
        _stem(w)
        for w in _words(text)
        if len(w) >= 3 and w not in _STOPWORDS and w not in extra_stop and not w.isdigit()
    }


def _matches(text_stems: Iterable[str], keywords: Iterable[str]) -> bool:
    """True if a word of the text and a keyword share a stem (one a prefix of the other)."""
    keys = list(keywords)
    for stem in text_stems:
        for key in keys:
            short, long = sorted((stem, key), key=len)
            if len(short) >= 4 and long.startswith(short):
                return True
            if short == long and len(short) >= 3:
                return True
    return False


def _id_pattern(entity: str) -> re.Pattern[str]:
    words = [re.escape(w) for w in entity.split("_") if w]
    name = r"[\s_-]*".join(words)
    return re.compile(
        rf"\b{name}s?\b\s*(?:id|number|no\.?|num|nr)?\s*[:#]?\s*([A-Za-z0-9-]*\d[A-Za-z0-9-]*)",
        re.IGNORECASE,
    )


def _extract_argument(param: str, schema: Mapping[str, Any], text: str) -> Any | None:
    """Read a value for ``param`` from the user's text, or ``None`` if it cannot."""
    kind = schema.get("type")
    value: str | None = None
    lowered = param.lower()
    if lowered == "email" or lowered.endswith("_email"):
        found = _EMAIL_RE.search(text)
        value = found.group(0) if found else None
    elif lowered == "id" or lowered.endswith("_id") or lowered.endswith("_number"):
        entity = lowered.rsplit("_", 1)[0] if "_" in lowered else ""
        found = _id_pattern(entity).search(text) if entity else None
        if found is None:
            found = re.search(r"#\s*([A-Za-z0-9-]*\d[A-Za-z0-9-]*)", text)
        value = found.group(1) if found else None
    if value is None:
        return None
    if kind == "integer":
        digits = re.sub(r"\D", "", value)
        return int(digits) if digits else None
    return value


def _summarise(tool_name: str | None, content: str | None) -> str:
    label = (tool_name or "the tool").replace("_", " ")
    text = (content or "").strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and set(data) == {"error"}:
        return f"{OFFLINE_PREFIX}{label} reported a problem: {data['error']}"
    if isinstance(data, dict):
        text = ", ".join(f"{key}: {value}" for key, value in data.items())
    elif isinstance(data, list):
        text = "; ".join(str(item) for item in data)
    if len(text) > _MAX_SUMMARY:
        text = text[: _MAX_SUMMARY - 1] + "…"
    return f"{OFFLINE_PREFIX}I checked {label}: {text or 'no result'}."


class OfflineModel:
    """A deterministic rule-based ``ChatModel`` for demos and for running without a key."""

    def __repr__(self) -> str:
        return "OfflineModel()"

    async def complete(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
    ) -> ModelResponse:
        """Answer by the rules in this module's docstring; never touches the network."""
        response = self._answer(messages, tools)
        spent_in = sum(len(_words(m.content or "")) for m in messages) + len(_words(system))
        spent_out = len(_words(response.content or "")) + len(response.tool_calls)
        response.usage = Usage(input_tokens=spent_in, output_tokens=spent_out)
        return response

    async def stream(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        on_text: OnText,
    ) -> ModelResponse:
        """``complete``, with the answer handed to ``on_text`` word by word."""
        response = await self.complete(model=model, system=system, messages=messages, tools=tools)
        for piece in _PIECE_RE.findall(response.content or ""):
            on_text(piece)
        return response

    def _answer(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ModelResponse:
        agent = current_agent_name.get() or "assistant"
        user = next((m for m in reversed(messages) if m.role is Role.USER), None)
        user_text = spoken_text(user) if user is not None else ""
        allow_handoff = True
        last = messages[-1] if messages else None
        if last is not None and last.role is Role.TOOL:
            call = _find_call(messages, last.tool_call_id)
            if call is None or not call.name.startswith(_HANDOFF_PREFIX):
                return ModelResponse(
                    content=_summarise(call.name if call else last.name, last.content)
                )
            # Just handed off: answer the user as the new agent, never bounce back.
            allow_handoff = False
        if allow_handoff:
            handoff = self._pick_handoff(user_text, tools)
            if handoff is not None:
                return _call(handoff.name, {})
        picked = self._pick_tool(user_text, tools)
        if picked is not None:
            return _call(*picked)
        media = describe_media(user) if user is not None else ""
        if media:
            return ModelResponse(content=f"{OFFLINE_PREFIX}{media}")
        return ModelResponse(content=_echo(agent, user_text))

    @staticmethod
    def _pick_handoff(text: str, tools: Sequence[ToolSpec]) -> ToolSpec | None:
        stems = _keywords(text)
        for spec in tools:
            if spec.handoff_target is None:
                continue
            description = spec.description
            keywords = _keywords(spec.handoff_target) | _keywords(description)
            if _matches(stems, keywords):
                return spec
        return None

    @staticmethod
    def _pick_tool(text: str, tools: Sequence[ToolSpec]) -> tuple[str, dict[str, Any]] | None:
        stems = _keywords(text)
        for spec in tools:
            if spec.handoff_target is not None:
                continue
            properties: Mapping[str, Any] = spec.parameters.get("properties", {}) or {}
            required = list(spec.parameters.get("required", []) or [])
            if required:
                arguments: dict[str, Any] = {}
                for param in required:
                    value = _extract_argument(param, properties.get(param, {}), text)
                    if value is None:
                        break
                    arguments[param] = value
                else:
                    return spec.name, arguments
                continue
            name_words = _keywords(spec.name.replace("_", " "), extra_stop=_GENERIC_TOOL_WORDS)
            if name_words and _matches(stems, name_words):
                return spec.name, {}
        return None


def _find_call(messages: Sequence[Message], call_id: str | None) -> ToolCall | None:
    for message in reversed(messages):
        for call in message.tool_calls:
            if call.id == call_id:
                return call
    return None


def _call(name: str, arguments: dict[str, Any]) -> ModelResponse:
    call = ToolCall(id=f"call_offline_{uuid.uuid4().hex[:12]}", name=name, arguments=arguments)
    return ModelResponse(content=None, tool_calls=[call])


def _echo(agent: str, text: str) -> str:
    quoted = text.strip()
    if len(quoted) > 200:
        quoted = quoted[:199] + "…"
    said = f' You said: "{quoted}".' if quoted else ""
    return (
        f"{OFFLINE_PREFIX}{agent} here.{said} I am the built-in offline demo model; "
        "set DEFAULT_MODEL and an API key for real answers."
    )
