"""The platform adapters, under the names DESIGN.md gives them.

The adapters live in ``bot.platforms``: an install claims no import name but the
engine's. In a source checkout this folder keeps the public module paths
(``platforms.base``, ``platforms.telegram``, ...) importable; each module
re-exports its ``bot.platforms`` counterpart, so the objects are the same.
"""
