"""The fixed texts the gateway answers with when no turn runs (or a turn failed)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Replies"]


@dataclass(frozen=True)
class Replies:
    """The fixed texts the gateway answers with when no turn runs."""

    apology: str = (
        "Sorry, something went wrong on my side and I could not answer that. "
        "Please try again in a moment."
    )
    """Sent when a turn fails after its retries; the conversation is left as it was."""
    media_only: str = (
        "Sorry, I can't read that kind of message. Text, photos, voice notes and PDFs work."
    )
    """Sent for a video, sticker, poll... (a kind the bot does not read) without a caption."""
    too_long: str = "That message is too long for me. Could you shorten it or split it up?"
    """Sent for a text over ``MAX_INBOUND_CHARS``."""
    reset: str = "Done: I have forgotten this conversation. What can I do for you?"
    """Answer to ``/reset``."""
    reset_jobs: str = "The {count} scheduled message(s) set in it are cancelled too."
    """Added to the ``/reset`` answer when the conversation had scheduled messages waiting."""
    compacted: str = "Done: I have summarised our conversation so far and will go on from there."
    """Answer to ``/compact`` when the older messages were summarised."""
    compact_nothing: str = "Our conversation is still short: there is nothing to summarise yet."
    """Answer to ``/compact`` when there is nothing older than the recent turns."""
    compact_failed: str = (
        "Sorry, I could not summarise our conversation just now; it is unchanged. "
        "Please try again later."
    )
    """Answer to ``/compact`` when the summary failed (the conversation is left as it was)."""
    help: str = (
        "Just write to me. /reset starts our conversation over, /compact summarises a long "
        "conversation, /help shows this message."
    )
    """Answer to ``/help``."""
    greeting: str = "Hello! I'm {agent}. How can I help?"
    """Answer to ``/start``; ``{agent}`` names the agent holding the conversation."""
