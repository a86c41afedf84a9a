"""A ``FakeOpenAIServer`` responder that plays a model with a memory for facts, and summarises.

``server.responder = Summariser()``: a compaction request (its system prompt is
``bot.core.compaction.SUMMARY_INSTRUCTIONS``) is answered with the lines of its
transcript that carry a digit (ids, numbers, amounts), each once, which is what
a good summary keeps. Any other request is answered "Noted.", unless its last message
asks about an "order id": then ``ANSWER_PREFIX`` plus the order ids
(``ORD-<digits>``) found anywhere in the request, so a test can ask at turn 60
what the order id of turn 2 was and see whether the model could still read it.

Usage reports what OpenAI would: prompt tokens of about the body's bytes / 4,
and as cached the part equal to the previous chat request's body (the prefix a
provider's cache would match), rounded down to 64-token blocks.
"""

from __future__ import annotations

import json
import re
from typing import Any

from bot.core.compaction import SUMMARY_INSTRUCTIONS
from tests.fakes.openai_server import FakeOpenAIServer, FakeResponse, RecordedRequest

__all__ = ["ANSWER_PREFIX", "ORDER_ID_RE", "Summariser"]

ORDER_ID_RE = re.compile(r"ORD-\d+")
ANSWER_PREFIX = "Noted. Order ids I can see:"


def _common_prefix(a: bytes, b: bytes) -> int:
    size = min(len(a), len(b))
    index = 0
    while index < size and a[index] == b[index]:
        index += 1
    return index


class Summariser:
    """Answers chat requests with the order ids it can see; summarises compaction requests."""

    def __init__(self) -> None:
        self.summary_requests: list[RecordedRequest] = []
        """The compaction requests received, in order."""
        self.chat_requests: list[RecordedRequest] = []
        """The other requests received, in order."""
        self.body_sizes: list[int] = []
        """Bytes of each chat request's body, in order."""
        self._previous = b""

    @staticmethod
    def is_summary_request(record: RecordedRequest) -> bool:
        """Whether ``record`` asks for a compaction summary."""
        messages = record.messages
        return bool(messages) and messages[0].get("content") == SUMMARY_INSTRUCTIONS

    def __call__(self, record: RecordedRequest) -> FakeResponse:
        raw = json.dumps(record.body, ensure_ascii=False).encode()
        if self.is_summary_request(record):
            self.summary_requests.append(record)
            transcript = str(record.messages[-1].get("content") or "")
            # Each line with a digit once (a merged earlier summary repeats them).
            kept = dict.fromkeys(line for line in transcript.splitlines() if re.search(r"\d", line))
            return self._answer("\n".join(kept) or "Nothing to keep.", raw, cached=0)
        self.chat_requests.append(record)
        self.body_sizes.append(len(raw))
        cached = _common_prefix(raw, self._previous) // 4 // 64 * 64
        self._previous = raw
        question = str(record.messages[-1].get("content") or "") if record.messages else ""
        if "order id" not in question.lower():
            return self._answer("Noted.", raw, cached=cached)
        ids = sorted(set(ORDER_ID_RE.findall(raw.decode())))
        return self._answer(f"{ANSWER_PREFIX} {', '.join(ids) or 'none'}.", raw, cached=cached)

    @staticmethod
    def _answer(text: str, raw: bytes, *, cached: int) -> FakeResponse:
        body: dict[str, Any] = FakeOpenAIServer.completion(
            text, prompt_tokens=max(1, len(raw) // 4), completion_tokens=max(1, len(text) // 4)
        )
        body["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
        return FakeResponse(body=body)
