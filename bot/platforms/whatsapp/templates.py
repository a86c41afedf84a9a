"""The template a reply becomes outside WhatsApp's 24-hour customer-service window.

Meta accepts free-form text only within 24 hours of the person's last message;
after that only an approved template goes out (else error 131047). The operator
names one template (``WHATSAPP_TEMPLATE_NAME``, ``WHATSAPP_TEMPLATE_LANGUAGE``)
whose body has one parameter, ``{{1}}``, and the reply's text fills it.

Meta caps a template's body at 1,024 characters once filled (beyond it:
132005, "text too long"), and a text parameter may hold no newline, no tab and
no run of more than four spaces. ``template_parameter`` folds the whitespace and
cuts the text to ``PARAMETER_LIMIT`` (974 characters: 50 are left for the
template's own words, such as "Update from Acme: {{1}}").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from pywa.types.templates import BaseParams
from pywa_async.types.templates import BodyText, TemplateLanguage

from bot.errors import ConfigurationError

__all__ = [
    "PARAMETER_LIMIT",
    "REENGAGEMENT_CODE",
    "TEMPLATE_ERROR_CODES",
    "WINDOW_CLOSED_REASON",
    "WINDOW_SECONDS",
    "ReplyTemplate",
    "template_parameter",
]

# The adapter's logger: operators filter on one name for WhatsApp.
logger = logging.getLogger("bot.platforms.whatsapp")

WINDOW_SECONDS: Final = 24 * 3600.0
"""Meta's customer-service window: free-form replies this long after the person's
last message."""
REENGAGEMENT_CODE: Final = 131047
"""Meta's refusal of free-form text outside the window."""
PARAMETER_LIMIT: Final = 974
"""Longest text put in the template's ``{{1}}`` (see the module docstring)."""
WINDOW_CLOSED_REASON: Final = "WhatsApp 24-hour window closed; set WHATSAPP_TEMPLATE_NAME"
"""Why a reply outside the window is abandoned when no template is configured."""
TEMPLATE_ERROR_CODES: Final = frozenset(
    {132000, 132001, 132005, 132007, 132008, 132012, 132015, 132016}
)
"""Meta's refusals of a template (parameter count, unknown template, text too long,
policy, parameter value, format, paused, disabled): permanent, the operator must act."""

_ELLIPSIS = "…"


def template_parameter(text: str) -> str:
    """``text`` as Meta accepts it in a body parameter: whitespace folded, cut to the limit."""
    folded = " ".join(text.split())
    if len(folded) <= PARAMETER_LIMIT:
        return folded
    logger.info(
        "WhatsApp template parameter cut from %d to %d characters",
        len(folded),
        PARAMETER_LIMIT,
    )
    return folded[: PARAMETER_LIMIT - len(_ELLIPSIS)].rstrip() + _ELLIPSIS


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

    def params(self, text: str) -> list[BaseParams]:
        """The template's parameters carrying ``text``."""
        # pywa declares ``params`` without ``self`` nor ``@staticmethod``; its documented
        # call is on the class, which its annotation does not allow.
        return [BodyText.params(template_parameter(text))]  # type: ignore[arg-type]
