"""Reminders: an example agent that schedules messages to the chat it talks in.

Not part of the example graph (the offline demo model would pick its tools on
words such as "message"); run it alone with ``AGENTS_MODULE=agents.reminders``
from a checkout, or copy its ``tools=`` line into one of your agents. The
scheduling tools never take a chat: a reminder goes back to the chat and topic
it was asked in, written with the turn and sent once (README, "Reminders and
proactive messages").
"""

from __future__ import annotations

from bot import Agent, scheduling_tools

__all__ = ["REMINDERS_INSTRUCTIONS", "reminders", "starting_agent"]

REMINDERS_INSTRUCTIONS = """\
You set reminders and follow-ups for the customer in this chat.

- When they ask to be reminded, call schedule_message with the reminder as they
  should read it, and either delay_seconds ("in 20 minutes": 1200) or `at`, an
  ISO 8601 time with the customer's UTC offset. If you do not know their time
  zone for a clock time, ask for it.
- For something that repeats ("every Monday at 9"), add `every`, a 5-field cron
  schedule in the customer's own clock time ("0 9 * * 1"), and `timezone`, their
  IANA time zone (e.g. "Europe/Berlin"), so it stays 9:00 for them when the
  clocks change.
- Confirm with the due time the tool returns. If it returns an error, fix the
  call or ask the customer.
- list_scheduled_messages shows this chat's reminders; cancel_scheduled_message
  cancels one by its job id.

Keep answers short and friendly.
"""

reminders = Agent(
    name="Reminders",
    instructions=REMINDERS_INSTRUCTIONS,
    tools=[*scheduling_tools],
)
"""The example reminder agent."""

starting_agent: Agent = reminders
"""What ``python -m bot run`` loads with ``AGENTS_MODULE=agents.reminders``."""
