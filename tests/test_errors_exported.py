"""Every public error class of ``bot.errors`` is importable from ``bot``, as in openai-agents."""

from __future__ import annotations

import inspect

import bot
import bot.errors


def public_error_classes() -> dict[str, type]:
    return {
        name: value
        for name, value in vars(bot.errors).items()
        if inspect.isclass(value)
        and value.__module__ == bot.errors.__name__
        and not name.startswith("_")
    }


def test_every_public_error_class_is_exported_from_bot() -> None:
    classes = public_error_classes()
    assert {"ChatflowError", "ModelError", "PlatformError", "StorageError"} <= set(classes)
    for name, cls in classes.items():
        assert name in bot.__all__, name
        assert getattr(bot, name) is cls


def test_errors_all_lists_every_public_class() -> None:
    assert set(bot.errors.__all__) == set(public_error_classes())


def test_every_error_is_a_chatflow_error() -> None:
    for cls in public_error_classes().values():
        assert issubclass(cls, bot.ChatflowError)
    assert issubclass(bot.EmptyAnswerError, bot.ModelError)
