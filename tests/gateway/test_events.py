"""``encodable``: a lone surrogate anywhere in an event becomes U+FFFD, and only there."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bot.gateway.contract import MediaAttachment
from bot.gateway.events import _EVENT_TEXTS, _MEDIA_TEXTS, _SOURCE_TEXTS, encodable
from tests.fakes.adapter import make_event

LONE = "bad\ud800end"


def test_a_clean_event_comes_back_as_the_same_object() -> None:
    event = make_event("hello", media=(MediaAttachment(kind="photo", file_id="f1"),))
    assert encodable(event) is event


@pytest.mark.parametrize("field", _EVENT_TEXTS, ids=str)
def test_every_text_field_of_the_event_is_cleaned(field: str) -> None:
    changes: dict[str, Any] = {field: LONE}
    event = dataclasses.replace(make_event("hello"), **changes)
    cleaned = encodable(event)
    assert getattr(cleaned, field) == "bad\ufffdend"
    (getattr(cleaned, field) or "").encode("utf-8")  # now writable anywhere
    assert cleaned.source == event.source


@pytest.mark.parametrize("field", _SOURCE_TEXTS, ids=str)
def test_every_text_field_of_the_source_is_cleaned(field: str) -> None:
    event = make_event("hello")
    changes: dict[str, Any] = {field: LONE}
    event = dataclasses.replace(event, source=dataclasses.replace(event.source, **changes))
    cleaned = encodable(event)
    assert getattr(cleaned.source, field) == "bad\ufffdend"
    assert cleaned.text == "hello"


@pytest.mark.parametrize("field", _MEDIA_TEXTS, ids=str)
def test_every_text_field_of_an_attachment_is_cleaned(field: str) -> None:
    changes: dict[str, Any] = {field: LONE}
    media = MediaAttachment(kind="document", **changes)
    cleaned = encodable(make_event("hello", media=(media,)))
    assert getattr(cleaned.media[0], field) == "bad\ufffdend"
    assert cleaned.media[0].kind == "document"
