"""Between platforms and agents: events, session keys, inbox, delivery ledger, the loop."""
