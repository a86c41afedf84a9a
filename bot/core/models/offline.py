"""The built-in demo model: deterministic, no network, no key.

It lets the whole pipeline (platforms, sessions, tools, handoffs, ledger) run
before any API key is configured. Every answer starts with ``[offline demo]``
so nobody mistakes it for a real model. Rules, in order:

1. The last message answers a tool call: summarise that result in a sentence
   (leaving out the notes about attached files, which are meant for a model).
   After a handoff, the new agent instead answers the user's message by rules 2-7.
2. A handoff target's name or description shares a word with the user's
   text (``"refund"`` ~ "Handles refunds"): call that ``transfer_to_`` tool.
   An agent that already held the conversation in this turn is never a target,
   so a message travels on (specialist -> triage -> specialist) but never bounces.
3. A tool fits the text: each required argument can be read from it (an id:
   ``#1234``, ``order 1234``, or the shape of an example in the parameter's
   description, ``"INV-2001"``; an e-mail address; a free-text ``reason`` or
   ``message`` gets the whole text), or the tool takes none. A tool that takes
   none or a free-text one must also be named by the text (a word of its name).
   Of several, the one the text names and that uses the most of it wins:
   "refund for invoice INV-2001" calls ``request_refund``, not ``get_invoice``.
4. The user's message carries media (a photo, a voice note, a document...):
   describe what arrived, plainly (``offline_media``).
5. The text names a tool whose id it does not give: ask for it.
6. An agent with the ``search_knowledge`` tool asked a question (a text ending in
   "?" or starting with a question word) looks it up, and answers with the best
   passage and its source (rule 1 quotes it: ``According to returns.md ...``).
7. An agent with tools of its own that none of rules 2-6 fits hands the
   message back to the agent the conversation started with (the first to answer
   in the history). So a specialist sends a greeting or another team's question
   back to the front desk, which routes it on.
8. Otherwise echo a short helpful answer that names the agent.

A voice note's transcript counts as the user's text for rules 2, 3, 5 and 6.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bot.core.attachments import attachment_note
from bot.core.messages import DocumentPart, ImagePart, Message, Role, ToolCall
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
_FREE_TEXT_PARAMS = frozenset(
    {"reason", "message", "text", "comment", "note", "details", "description", "question"}
)
"""Parameters that take the user's own words: the text as written is their value."""
_ENDS = (".", "!", "?", "…")
_EXAMPLE_RE = re.compile(r'"([^"\s]{2,40})"')
"""A quoted example in a parameter's description: ``e.g. "INV-2001"``."""
_HANDOFF_PREFIX = "transfer_to_"  # bot.core.agent.HANDOFF_PREFIX (importing it would cycle)
_KNOWLEDGE_TOOL = "search_knowledge"  # bot.knowledge_tools (the models know no tool module)
_QUESTION_WORDS_TEXT = (
    "what when where which who whom whose why how can could do does did is are was were will "
    "would should may shall have has"
)
_QUESTION_WORDS = frozenset(_QUESTION_WORDS_TEXT.split())


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


def _is_free_text(param: str, schema: Mapping[str, Any]) -> bool:
    """A parameter that takes the user's words as they are (``reason``, ``message``...)."""
    return param.lower() in _FREE_TEXT_PARAMS and schema.get("type", "string") == "string"


def _example_shapes(schema: Mapping[str, Any]) -> list[tuple[re.Pattern[str], bool]]:
    """What the quoted examples in a parameter's description look like, digits generalised
    (``e.g. "INV-2001"`` -> ``INV-\\d+``), and whether letters make the shape distinctive."""
    shapes = []
    for example in _EXAMPLE_RE.findall(str(schema.get("description") or "")):
        if any(c.isdigit() for c in example):
            pattern = re.sub(r"\d+", r"\\d+", re.escape(example))
            shapes.append((re.compile(pattern, re.IGNORECASE), any(c.isalpha() for c in example)))
    return shapes


def _labelled_elsewhere(text: str, start: int, entity: str) -> bool:
    """Whether the word right before position ``start`` names another kind of id
    (``order #1001`` is no invoice number)."""
    before = _words(text[:start])[-1:]
    if not before or not entity:
        return False
    word = before[0]
    if len(word) < 3 or word in _STOPWORDS or word.isdigit():
        return False
    return not _matches([_stem(word)], _keywords(entity.replace("_", " ")))


def _extract_id(param: str, schema: Mapping[str, Any], text: str) -> str | None:
    entity = param.rsplit("_", 1)[0] if "_" in param else ""
    found = _id_pattern(entity).search(text) if entity else None
    if found is not None:
        return found.group(1)  # labelled by the user: the tool judges it
    shapes = _example_shapes(schema)
    for shape, distinctive in shapes:
        # Only a distinctive shape is searched for: "INV-2001" anywhere, never "1001".
        if distinctive:
            match = re.search(rf"(?<![\w-])(?:{shape.pattern})(?![\w-])", text, re.IGNORECASE)
            if match is not None:
                return match.group(0)
    for match in re.finditer(r"#\s*([A-Za-z0-9-]*\d[A-Za-z0-9-]*)", text):
        value = match.group(1)
        if _labelled_elsewhere(text, match.start(), entity):
            continue
        if shapes and not any(shape.fullmatch(value) for shape, _ in shapes):
            continue
        return value
    return None


def _extract_argument(param: str, schema: Mapping[str, Any], text: str) -> Any | None:
    """Read a value for ``param`` from the user's text, or ``None`` if it cannot."""
    kind = schema.get("type")
    value: str | None = None
    lowered = param.lower()
    if lowered == "email" or lowered.endswith("_email"):
        found = _EMAIL_RE.search(text)
        value = found.group(0) if found else None
    elif lowered == "id" or lowered.endswith("_id") or lowered.endswith("_number"):
        value = _extract_id(lowered, schema, text)
    elif _is_free_text(param, schema):
        value = " ".join(text.split()) or None
    if value is None:
        return None
    if kind == "integer":
        digits = re.sub(r"\D", "", value)
        return int(digits) if digits else None
    return value


def _summarise(tool_name: str | None, content: str | None, notes: Iterable[str] = ()) -> str:
    label = (tool_name or "the tool").replace("_", " ")
    text = (content or "").strip()
    skip = set(notes)
    if skip:
        text = "\n".join(line for line in text.splitlines() if line not in skip).strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and set(data) == {"error"}:
        return f"{OFFLINE_PREFIX}{label} reported a problem: {data['error']}"
    if tool_name == _KNOWLEDGE_TOOL and isinstance(data, dict):
        return _quote_passage(data)
    if isinstance(data, dict):
        text = ", ".join(f"{key}: {value}" for key, value in data.items())
    elif isinstance(data, list):
        text = "; ".join(str(item) for item in data)
    if len(text) > _MAX_SUMMARY:
        text = text[: _MAX_SUMMARY - 1] + "…"
    text = text or "no result"
    return f"{OFFLINE_PREFIX}I checked {label}: {text}{'' if text.endswith(_ENDS) else '.'}"


def _quote_passage(data: Mapping[str, Any]) -> str:
    """The best passage ``search_knowledge`` found, with its source to cite."""
    passages = data.get("passages")
    best = passages[0] if isinstance(passages, list) and passages else None
    if not isinstance(best, dict):
        return f"{OFFLINE_PREFIX}I found nothing about that in our documents."
    text = " ".join(str(best.get("text", "")).split())
    if len(text) > _MAX_SUMMARY:
        text = text[: _MAX_SUMMARY - 1] + "…"
    heading = str(best.get("heading") or "")
    where = f"{best.get('source')}" + (f", {heading}" if heading else "")
    return f"{OFFLINE_PREFIX}According to {where}: {text} (source: {best.get('source')})"


def _is_question(text: str) -> bool:
    words = _words(text)
    return text.strip().endswith("?") or (bool(words) and words[0] in _QUESTION_WORDS)


def _file_notes(message: Message) -> list[str]:
    """The lines a tool result carries for the files it attached (see ``ToolFiles``)."""
    return [
        attachment_note(part)
        for part in message.parts
        if isinstance(part, ImagePart | DocumentPart)
    ]


class _Fit:
    """How well one tool fits the user's text."""

    __slots__ = ("arguments", "missing", "named", "needs_name", "spec")

    def __init__(self, spec: ToolSpec, text: str, stems: set[str]) -> None:
        self.spec = spec
        properties: Mapping[str, Any] = spec.parameters.get("properties", {}) or {}
        required = list(spec.parameters.get("required", []) or [])
        self.arguments: dict[str, Any] = {}
        self.missing: list[tuple[str, Mapping[str, Any]]] = []
        for param in required:
            schema = properties.get(param, {}) or {}
            value = _extract_argument(param, schema, text)
            if value is None:
                self.missing.append((param, schema))
            else:
                self.arguments[param] = value
        name_words = _keywords(spec.name.replace("_", " "), extra_stop=_GENERIC_TOOL_WORDS)
        self.named = bool(name_words) and _matches(stems, name_words)
        # Without an id or an address read from the text, only its name says it was meant.
        self.needs_name = not required or any(
            _is_free_text(p, properties.get(p, {}) or {}) for p in required
        )

    @property
    def callable(self) -> bool:
        return not self.missing and (self.named or not self.needs_name)

    @property
    def rank(self) -> tuple[bool, int]:
        return self.named, len(self.arguments)


def _own_tools(tools: Sequence[ToolSpec]) -> list[ToolSpec]:
    return [spec for spec in tools if spec.handoff_target is None]


def _agents_this_turn(messages: Sequence[Message], agent: str) -> set[str] | None:
    """The agents that held the conversation since the user's message; ``None`` when
    a handoff's caller is unknown (then no more handoffs: never risk a bounce)."""
    held = {agent}
    for message in messages:
        if message.role is not Role.MODEL:
            continue
        if any(call.name.startswith(_HANDOFF_PREFIX) for call in message.tool_calls):
            if message.agent is None:
                return None
            held.add(message.agent)
    return held


def _way_back(
    history: Sequence[Message], agent: str, tools: Sequence[ToolSpec], allowed: Sequence[ToolSpec]
) -> ToolSpec | None:
    """Where a specialist sends what is not its job: the agent the conversation started
    with (the first to answer in the history), if it can hand over to it.

    ``None`` for that agent itself, so a front desk with tools never sends a greeting
    on to a specialist, and for an agent without tools of its own: all it can do is talk.
    """
    if not _own_tools(tools):
        return None
    home = next((m.agent for m in history if m.agent is not None), None)
    if home is None or home == agent:
        return None
    return next((spec for spec in allowed if spec.handoff_target == home), None)


def _ask_for(agent: str, fit: _Fit) -> str:
    wanted = []
    for param, schema in fit.missing:
        description = str(schema.get("description") or "").strip().rstrip(".")
        if description:
            wanted.append(description[:1].lower() + description[1:])
        else:
            wanted.append("the " + param.replace("_", " "))
    label = fit.spec.name.replace("_", " ")
    return f"{OFFLINE_PREFIX}{agent} here. To {label} I need {' and '.join(wanted)}."


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
        asked_at = next(
            (i for i in range(len(messages) - 1, -1, -1) if messages[i].role is Role.USER), None
        )
        user = messages[asked_at] if asked_at is not None else None
        user_text = spoken_text(user) if user is not None else ""
        last = messages[-1] if messages else None
        if last is not None and last.role is Role.TOOL:
            call = _find_call(messages, last.tool_call_id)
            if call is None or not call.name.startswith(_HANDOFF_PREFIX):
                return ModelResponse(
                    content=_summarise(
                        call.name if call else last.name, last.content, _file_notes(last)
                    )
                )
        this_turn = messages[asked_at + 1 :] if asked_at is not None else messages
        held = _agents_this_turn(this_turn, agent)
        allowed = [
            spec
            for spec in tools
            if spec.handoff_target is not None and held is not None
            if spec.handoff_target not in held
        ]
        handoff = self._pick_handoff(user_text, allowed)
        if handoff is not None:
            return _call(handoff.name, {})
        stems = _keywords(user_text)
        fits = [_Fit(spec, user_text, stems) for spec in _own_tools(tools)]
        ready = [fit for fit in fits if fit.callable]
        if ready:
            best = max(ready, key=lambda fit: fit.rank)  # the first of equals
            return _call(best.spec.name, best.arguments)
        media = describe_media(user) if user is not None else ""
        if media:
            return ModelResponse(content=f"{OFFLINE_PREFIX}{media}")
        named = next((fit for fit in fits if fit.named and fit.missing), None)
        if named is not None:
            return ModelResponse(content=_ask_for(agent, named))
        if _is_question(user_text) and any(spec.name == _KNOWLEDGE_TOOL for spec in tools):
            return _call(_KNOWLEDGE_TOOL, {"query": " ".join(user_text.split())})
        back = _way_back(messages, agent, tools, allowed) if user_text.strip() else None
        if back is not None:
            return _call(back.name, {})
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
