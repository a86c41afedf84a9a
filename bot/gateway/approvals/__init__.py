"""Approvals and taps: a keyboard goes out with a reply, a person's tap comes back.

- ``bot.gateway.approvals.taps``: a tap's token resolved to its button, checked
  (whose keyboard it is, used, expired) and turned into a message or handed to
  the interceptor its prefix names;
- ``bot.gateway.approvals.flow``: a gated tool call waits for a person's yes, and
  the decided call continues its turn;
- ``bot.gateway.approvals.table``: the approvals table and the one rule that
  decides a row.

Import the module you need; this package re-exports nothing.
"""
