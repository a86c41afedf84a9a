"""The operator's memory commands: ``memory list|forget`` and ``forget-user``.

Kept apart from ``bot.cli`` (which registers them): ``bot.cli`` imports this
module only when one of them runs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable

from bot.config import Settings
from bot.core.long_memory.records import delete_memory, list_memories
from bot.core.stores.base import TransactionalStore
from bot.database import open_store
from bot.gateway.erasure import erase_person
from bot.gateway.keys import PersonRef, parse_person
from bot.gateway.memory_scope import person_ref
from bot.gateway.proactive.operator_send import PLATFORMS

__all__ = ["SecretOf", "forget_user", "memory"]

SecretOf = Callable[[TransactionalStore, Settings], Awaitable[bytes]]
"""Reads the installation secret for a store (``bot.cli``'s, shared by every command)."""


def _person(text: str) -> PersonRef:
    """``parse_person`` for the operator's commands, which also refuse a platform the bot
    does not have: a typo (``telegarm:123``) would match nothing and report success."""
    person = parse_person(text)
    if person.platform not in PLATFORMS:
        raise ValueError(
            f"{text!r}: unknown platform {person.platform!r} (PLATFORM:USER_ID, PLATFORM one "
            f"of: {', '.join(PLATFORMS)})"
        )
    return person


async def memory(settings: Settings, args: argparse.Namespace, secret_of: SecretOf) -> int:
    """``memory list [--user PLATFORM:ID]`` and ``memory forget ID``."""
    store = open_store(settings)
    try:
        if args.action == "forget":
            if not await delete_memory(store, args.memory_id):
                print(f"chatflow: memory: no memory {args.memory_id}", file=sys.stderr)
                return 2
            print(f"forgot {args.memory_id}")
            return 0
        platform = person = None
        if args.user is not None:
            try:
                who = _person(args.user)
            except ValueError as exc:
                print(f"chatflow: memory: {exc}", file=sys.stderr)
                return 2
            secret = await secret_of(store, settings)
            platform, person = who.platform, person_ref(who.user_id, secret)
        memories = await list_memories(store, platform, person)
    finally:
        await store.close()
    if not memories:
        print("No memories.")
        return 0
    for item in memories:
        whom = f"{item.platform}:{item.person}" if item.about == "me" else "chat"
        print(f"{item.memory_id}  {item.date}  {whom:<27} {item.text}")
    return 0


async def forget_user(settings: Settings, args: argparse.Namespace, secret_of: SecretOf) -> int:
    """``forget-user PLATFORM:ID [--yes]``: asks first on a terminal, prints the counts."""
    try:
        person = _person(args.person)
    except ValueError as exc:
        print(f"chatflow: forget-user: {exc}", file=sys.stderr)
        return 2
    if not args.yes and sys.stdin.isatty():
        question = f"Remove everything the bot holds about {args.person}? [y/N] "
        answer = await asyncio.to_thread(input, question)
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    store = open_store(settings)
    try:
        secret = await secret_of(store, settings)
        erasure = await erase_person(
            store,
            person,
            secret,
            media_dir=settings.data_dir / "media",
            transcription_model=settings.transcription_model,
        )
    finally:
        await store.close()
    print(f"removed what the bot held about {args.person}:")
    for line in erasure.lines():
        print(f"  {line}")
    return 0
