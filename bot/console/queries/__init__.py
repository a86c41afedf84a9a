"""What the console reads (conversations, transcripts, the ledger) and the one mark it writes.

Every query is one ``store.run(body, write=False)`` over the stores' own
tables (``chatflow_sessions``/``chatflow_messages`` of ``bot.core.stores.sql``,
the ledger's of ``bot.gateway.ledger.obligations``, the takeover table): no write,
no lock a turn waits on. The conversation list pages by key set
(``updated_at, session_id``), never by offset, so page 2000 costs what page 1 does;
what a line shows besides (its last message, its unread count) is read by
correlated subqueries for the page's rows alone, through the messages'
``(session_id, seq)`` index. The one write is ``mark_read``: where the
operators last read a conversation (table ``chatflow_console_reads``).

The queries live by the pages they serve: ``inbox`` (the conversation list and the
people's inbox, the read mark), ``transcript`` (one conversation), ``ledger`` (the
ledger page and its metrics) and ``common`` (sizes, labels, the schema). Callers import
this package: every public name is re-exported here.
"""

from __future__ import annotations

from bot.console.queries.common import (
    ATTENTION_LIMIT,
    KNOWN_PLATFORMS,
    PAGE_SIZE,
    READS_TABLE,
    SEARCH_WINDOW,
    TRANSCRIPT_LIMIT,
    ConversationState,
    age,
    open_schema,
    part_label,
    platform_label,
)
from bot.console.queries.inbox import (
    ConversationRow,
    conversation,
    conversations_by_id,
    list_conversations,
    mark_read,
    needing_a_person,
)
from bot.console.queries.ledger import (
    ATTENTION,
    IN_FLIGHT,
    UNDELIVERED,
    ledger_counts,
    ledger_rows,
    metric_totals,
)
from bot.console.queries.transcript import TranscriptItem, media_part, recent_changes, transcript

__all__ = [
    "ATTENTION",
    "ATTENTION_LIMIT",
    "IN_FLIGHT",
    "KNOWN_PLATFORMS",
    "PAGE_SIZE",
    "READS_TABLE",
    "SEARCH_WINDOW",
    "TRANSCRIPT_LIMIT",
    "UNDELIVERED",
    "ConversationRow",
    "ConversationState",
    "TranscriptItem",
    "age",
    "conversation",
    "conversations_by_id",
    "ledger_counts",
    "ledger_rows",
    "list_conversations",
    "mark_read",
    "media_part",
    "metric_totals",
    "needing_a_person",
    "open_schema",
    "part_label",
    "platform_label",
    "recent_changes",
    "transcript",
]
