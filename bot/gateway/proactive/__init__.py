"""Proactive messages: what the bot sends without being asked in that moment.

- ``bot.gateway.proactive.scheduler``: fires the jobs agents scheduled
  (``bot.core.scheduling``), each once, through the ledger;
- ``bot.gateway.proactive.jobs``: the operator's view of scheduled jobs (list, cancel)
  and the jobs of a conversation or a person cancelled with them;
- ``bot.gateway.proactive.operator_send``: ``python -m bot send``, owed through the
  ledger like any reply;
- ``bot.gateway.proactive.windows``: when each person last wrote, for WhatsApp's
  24-hour customer-service window that decides between free text and a template.

Import the module you need; this package re-exports nothing.
"""
