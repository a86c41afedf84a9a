"""The template a reply becomes outside WhatsApp's 24-hour customer-service window.

Meta accepts free-form text only within 24 hours of the person's last message;
after that only an approved template goes out (else error 131047). The operator
names one template (``WHATSAPP_TEMPLATE_NAME``, ``WHATSAPP_TEMPLATE_LANGUAGE``)
whose body has one parameter, ``{{1}}``, and the reply's text fills it.

Meta caps a template's body at 1,024 characters once filled (beyond it:
132005, "text too long"), and a text parameter may hold no newline, no tab and
no run of more than four spaces. ``template_parts`` folds the whitespace and,
when the text is longer than ``PARAMETER_LIMIT`` (974 characters: 50 are left
for the template's own words, such as "Update from Acme: {{1}}"), splits it at
word boundaries into numbered parts (``(1/3) ...``), sent as that many templates
in order. Nothing is cut silently: a text that would need more than
``MAX_TEMPLATE_PARTS`` templates (each one is paid) is refused before anything
is sent, with ``TooLongForTemplate`` naming the sizes, and the ledger row ends
with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pywa.types.templates import BaseParams
from pywa_async.types.templates import BodyText, TemplateLanguage

from bot.errors import ConfigurationError

__all__ = [
    "MAX_TEMPLATE_PARTS",
    "PARAMETER_LIMIT",
    "REENGAGEMENT_CODE",
    "TEMPLATE_ERROR_CODES",
    "WINDOW_CLOSED_REASON",
    "WINDOW_SECONDS",
    "ReplyTemplate",
    "template_parameter",
    "template_parts",
    "too_long_reason",
]

WINDOW_SECONDS: Final = 24 * 3600.0
"""Meta's customer-service window: free-form replies this long after the person's
last message."""
REENGAGEMENT_CODE: Final = 131047
"""Meta's refusal of free-form text outside the window."""
PARAMETER_LIMIT: Final = 974
"""Longest text put in the template's ``{{1}}`` (see the module docstring)."""
MAX_TEMPLATE_PARTS: Final = 4
"""Most templates one reply becomes (each is a paid message); a longer text is refused."""
WINDOW_CLOSED_REASON: Final = "WhatsApp 24-hour window closed; set WHATSAPP_TEMPLATE_NAME"
"""Why a reply outside the window is abandoned when no template is configured."""
TEMPLATE_ERROR_CODES: Final = frozenset(
    {132000, 132001, 132005, 132007, 132008, 132012, 132015, 132016}
)
"""Meta's refusals of a template (parameter count, unknown template, text too long,
policy, parameter value, format, paused, disabled): permanent, the operator must act."""


def template_parameter(text: str) -> str:
    """``text`` as Meta accepts it in a body parameter: its whitespace folded."""
    return " ".join(text.split())


def template_parts(text: str) -> list[str]:
    """``text`` folded and split into the parameters of consecutive templates, in order.

    One part when it fits ``PARAMETER_LIMIT``; else parts of whole words (a word
    longer than a part is split), each numbered ``(i/n) `` and within the limit.
    """
    folded = template_parameter(text)
    if len(folded) <= PARAMETER_LIMIT:
        return [folded]
    for digits in range(1, 4):
        room = PARAMETER_LIMIT - len(f"({'9' * digits}/{'9' * digits}) ")
        chunks = _chunks(folded, room)
        if len(str(len(chunks))) <= digits:
            return [f"({i}/{len(chunks)}) {chunk}" for i, chunk in enumerate(chunks, 1)]
    raise ValueError("text too long to number its template parts")


def _chunks(folded: str, room: int) -> list[str]:
    chunks: list[str] = []
    current = ""
    for word in folded.split(" "):
        while len(word) > room:  # a "word" longer than a part (a URL, a code): split it
            if current:
                chunks.append(current)
                current = ""
            chunks.append(word[:room])
            word = word[room:]
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= room:
            current += " " + word
        else:
            chunks.append(current)
            current = word
    if current:
        chunks.append(current)
    return chunks


def too_long_reason(text: str, parts: int) -> str:
    """Why a text is refused as templates (for the ledger row; sizes only, no text)."""
    return (
        f"too long for the WhatsApp template outside the 24-hour window: "
        f"{len(template_parameter(text))} characters would take {parts} templates "
        f"(at most {MAX_TEMPLATE_PARTS}); nothing was sent"
    )


@dataclass(frozen=True, slots=True)
class ReplyTemplate:
    """The operator's template for replies outside the window."""

    name: str
    language: TemplateLanguage

    @classmethod
    def configured(cls, name: str | None, language: str) -> ReplyTemplate | None:
        """The template the settings name, ``None`` when unset; an unknown language code
        is a ``ConfigurationError``."""
        if name is None or not name.strip():
            return None
        try:
            code = TemplateLanguage(language)
        except ValueError:
            raise ConfigurationError(
                f"WHATSAPP_TEMPLATE_LANGUAGE {language!r} is not a WhatsApp template language",
                setting="WHATSAPP_TEMPLATE_LANGUAGE",
            ) from None
        return cls(name.strip(), code)

    def params(self, part: str) -> list[BaseParams]:
        """The template's parameters carrying ``part`` (one of ``template_parts``)."""
        if len(part) > PARAMETER_LIMIT:
            raise ValueError("a template part longer than PARAMETER_LIMIT")
        # pywa declares ``params`` without ``self`` nor ``@staticmethod``; its documented
        # call is on the class, which its annotation does not allow.
        return [BodyText.params(part)]  # type: ignore[arg-type]
