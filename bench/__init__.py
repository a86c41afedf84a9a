"""Chatflow's benchmarks: ``make bench`` (or ``python -m bench``); never part of ``make test``."""
