"""Messaging platform adapters: Telegram, WhatsApp Cloud and the local console."""
