"""Billing: invoices and refund requests.

Its tools are ``async`` and move file access to a thread themselves
(``asyncio.to_thread``). ``request_refund`` has a side effect, so it takes a
``ToolContext`` and uses the inbound message id as an idempotency key: after a
crash the gateway re-runs an unanswered message, and the refund must not be
requested twice.

``request_refund`` also waits for the customer's yes (``needs_approval=refund_question``):
the check first declines what cannot be refunded (an unknown, unpaid or refunded
invoice: the model reads why, and nobody is asked), else the model's call ends the
turn with "Shall I open a refund request for invoice INV-2001 (59.90 EUR)? ..." and
Approve / Deny buttons, and the request is recorded only once approved (in a new
turn whose inbound id, ``approval:<id>``, is then the idempotency key).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import threading
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter
from pydantic_settings import BaseSettings, SettingsConfigDict

from bot import Agent, Decline, ToolContext, tool

from ._data import SampleDate, read_data_file

__all__ = [
    "BILLING_INSTRUCTIONS",
    "REFUNDS_FILE",
    "Invoice",
    "InvoiceList",
    "RefundRequest",
    "billing",
    "get_invoice",
    "list_invoices",
    "normalise_invoice_id",
    "refunds_path",
    "request_refund",
]

logger = logging.getLogger(__name__)

REFUNDS_FILE = "refund_requests.jsonl"
"""File under ``DATA_DIR`` where refund requests are recorded, one JSON object a line."""

_INVOICE_ID_RE = re.compile(r"^INV[-\s]?(\d{4,8})$", re.IGNORECASE)
_EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_MAX_REASON = 500


class _InvoiceRecord(BaseModel):
    customer_email: str
    order_id: str
    amount: Decimal
    currency: str
    status: Literal["open", "paid", "refunded"]
    issued_on: SampleDate


_INVOICES = TypeAdapter(dict[str, _InvoiceRecord])


class Invoice(BaseModel):
    """An invoice as the model sees it."""

    invoice_id: str
    """``INV-<digits>``."""
    order_id: str
    """The order it bills."""
    customer_email: str
    """Who it was sent to."""
    amount: Decimal
    """Total, in ``currency`` (serialised as a decimal string, never a float)."""
    currency: str
    """ISO 4217 code."""
    status: Literal["open", "paid", "refunded"]
    """``open``: not paid yet; ``paid``; ``refunded``."""
    issued_on: date
    """Issue date."""


class InvoiceList(BaseModel):
    """A customer's invoices, newest first."""

    customer_email: str
    """The address they were looked up by."""
    invoices: list[Invoice]
    """The invoices."""


class RefundRequest(BaseModel):
    """The outcome of a refund request."""

    request_id: str
    """``REF-<hex>``; the same for a repeated request."""
    invoice_id: str
    """The invoice to refund."""
    amount: Decimal
    """Amount to refund."""
    currency: str
    """ISO 4217 code."""
    state: Literal["received", "already_requested"]
    """``received``: recorded by this message; ``already_requested``: an earlier
    message had asked for this invoice, nothing new was recorded."""
    next_step: str
    """What happens now, for the customer."""


def normalise_invoice_id(raw: str) -> str:
    """``"inv-2001"``, ``"INV 2001"`` -> ``"INV-2001"``.

    Raises ``ValueError`` with a message meant for the customer otherwise.
    """
    match = _INVOICE_ID_RE.match(raw.strip())
    if match is None:
        raise ValueError(
            f"{raw.strip()!r} is not an invoice number: invoice numbers look like INV-2001"
        )
    return f"INV-{match.group(1)}"


def _load_invoices() -> dict[str, Invoice]:
    records = _INVOICES.validate_python(read_data_file("invoices.json"))
    return {key: Invoice(invoice_id=key, **record.model_dump()) for key, record in records.items()}


class _DataDir(BaseSettings):
    """``DATA_DIR`` alone, read as the bot reads it: the environment, then ``.env``.

    Only this one field is parsed, so a wrong value of some other setting
    cannot make a refund fail.
    """

    model_config = SettingsConfigDict(env_file=".env", env_file_encoding="utf-8", extra="ignore")

    data_dir: Path = Path("./data")


def refunds_path() -> Path:
    """Where refund requests are recorded: ``<DATA_DIR>/refund_requests.jsonl``.

    The same directory the bot keeps its database in (``DATA_DIR``, default ``./data``).
    """
    return _DataDir().data_dir / REFUNDS_FILE


@tool
async def list_invoices(customer_email: str) -> InvoiceList | str:
    """List the invoices sent to a customer's e-mail address.

    Args:
        customer_email: The e-mail address the customer ordered with.
    """
    email = customer_email.strip().lower()
    if not _EMAIL_RE.match(email):
        raise ValueError(f"{customer_email.strip()!r} is not an e-mail address")
    invoices = await asyncio.to_thread(_load_invoices)
    found = sorted(
        (inv for inv in invoices.values() if inv.customer_email.lower() == email),
        key=lambda inv: (inv.issued_on, inv.invoice_id),
        reverse=True,
    )
    if not found:
        return "There are no invoices for that e-mail address."
    return InvoiceList(customer_email=email, invoices=found)


@tool
async def get_invoice(invoice_id: str) -> Invoice | str:
    """Get one invoice: amount, status (open, paid, refunded), order and issue date.

    Args:
        invoice_id: The invoice number, e.g. "INV-2001".
    """
    key = normalise_invoice_id(invoice_id)
    invoice = (await asyncio.to_thread(_load_invoices)).get(key)
    if invoice is None:
        return f"No invoice {key} was found. Ask the customer to check the number."
    return invoice


# The file is read and appended in worker threads, so a thread lock orders the
# writers of this process whichever event loop called the tool. Several bot
# processes on one DATA_DIR would need a file lock (fcntl) on top.
_refunds_lock = threading.Lock()


async def refund_question(ctx: ToolContext, arguments: dict[str, Any]) -> str | Decline:
    """``request_refund``'s approval check: a refund that cannot happen is declined before
    anyone is asked; otherwise the question the customer reads, in their terms."""
    key = normalise_invoice_id(str(arguments.get("invoice_id", "")))
    invoice = (await asyncio.to_thread(_load_invoices)).get(key)
    if invoice is None:
        return Decline(f"No invoice {key} was found. Ask the customer to check the number.")
    if invoice.status == "open":
        return Decline(f"Invoice {key} has not been paid yet, so there is nothing to refund.")
    if invoice.status == "refunded":
        return Decline(f"Invoice {key} has already been refunded.")
    reason = str(arguments.get("reason", "")).strip()
    question = (
        f"Shall I open a refund request for invoice {key} ({invoice.amount} {invoice.currency})?"
    )
    return f"{question} Your reason: {reason}" if reason else question


@tool(needs_approval=refund_question)
async def request_refund(ctx: ToolContext, invoice_id: str, reason: str) -> RefundRequest | str:
    """Open a refund request for a paid invoice. A billing specialist reviews it.

    Asking again for the same invoice does not open a second request.

    Args:
        invoice_id: The invoice number, e.g. "INV-2001".
        reason: Why the customer wants the refund, in their words (one sentence).
    """
    key = normalise_invoice_id(invoice_id)
    why = " ".join(reason.split())
    if not why:
        raise ValueError("a reason is required: ask the customer why they want a refund")
    if len(why) > _MAX_REASON:
        why = why[: _MAX_REASON - 1] + "…"
    invoice = (await asyncio.to_thread(_load_invoices)).get(key)
    if invoice is None:
        return f"No invoice {key} was found, so no refund was requested."
    if invoice.status == "open":
        return f"Invoice {key} has not been paid yet, so there is nothing to refund."
    if invoice.status == "refunded":
        return f"Invoice {key} has already been refunded."
    return await asyncio.to_thread(_record_refund, ctx, invoice, why)


def _record_refund(ctx: ToolContext, invoice: Invoice, reason: str) -> RefundRequest:
    """Append the request unless this message or an earlier one already made it.

    Runs in a worker thread; the check and the append hold the refunds lock together.
    """
    with _refunds_lock:
        return _record_refund_locked(ctx, invoice, reason)


def _record_refund_locked(ctx: ToolContext, invoice: Invoice, reason: str) -> RefundRequest:
    # Keyed by inbound message *and* invoice: one message may ask for two invoices.
    idem_key = (
        f"{ctx.inbound_message_id}|{invoice.invoice_id}"
        if ctx.inbound_message_id is not None
        else None
    )
    path = refunds_path()
    existing = _read_records(path)
    for record in existing:
        if idem_key is not None and record.get("idempotency_key") == idem_key:
            # The same message re-run (crash recovery): give the same answer again.
            return _outcome(invoice, str(record["request_id"]), "received")
    for record in existing:
        if record.get("invoice_id") == invoice.invoice_id:
            return _outcome(invoice, str(record["request_id"]), "already_requested")
    # Only one request per invoice is ever recorded, so this seed is unique too.
    seed = idem_key or f"{ctx.session_id}|{invoice.invoice_id}"
    request_id = "REF-" + hashlib.sha256(seed.encode()).hexdigest()[:10].upper()
    record = {
        "request_id": request_id,
        "idempotency_key": idem_key,
        "invoice_id": invoice.invoice_id,
        "amount": str(invoice.amount),
        "currency": invoice.currency,
        "reason": reason,
        "session_id": ctx.session_id,
        "agent": ctx.agent_name,
        "created_at": datetime.now(UTC).isoformat(),
    }
    _append_record(path, record)
    logger.info("refund request %s recorded for %s", request_id, invoice.invoice_id)
    return _outcome(invoice, request_id, "received")


def _outcome(
    invoice: Invoice, request_id: str, state: Literal["received", "already_requested"]
) -> RefundRequest:
    return RefundRequest(
        request_id=request_id,
        invoice_id=invoice.invoice_id,
        amount=invoice.amount,
        currency=invoice.currency,
        state=state,
        next_step="A billing specialist reviews refund requests within 2 business days "
        "and replies by e-mail.",
    )


def _read_records(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            # A line torn by a crash mid-write: skip it, the rest is intact.
            logger.warning("%s line %d is not valid JSON; skipped", path.name, number)
            continue
        if isinstance(value, dict):
            records.append(value)
    return records


def _append_record(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, ensure_ascii=False) + "\n"
    with path.open("a+b") as handle:
        handle.seek(0, os.SEEK_END)
        if handle.tell() > 0:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                # The last write was torn: start on a fresh line so ours stays whole.
                line = "\n" + line
        handle.write(line.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


BILLING_INSTRUCTIONS = """\
You handle billing questions: invoices, payments, charges and refunds.

- To find a customer's invoices, ask for the e-mail address they ordered with
  and call list_invoices. For one invoice, call get_invoice with its number
  (like INV-2001).
- To request a refund you need the invoice number and the reason, in the
  customer's words. Call request_refund once: the customer is then asked to
  approve it with a button. Tell them the request id and the next step from its
  result; if they declined or did not answer, say no refund was requested.
  Only paid invoices can be refunded; explain what the tool says otherwise.
- Answer from tool results only; never promise an amount or a date the tools
  did not give you.
- For the delivery of an order, or anything that is not billing, call
  transfer_to_triage so the front desk can route the customer.

Keep answers short and friendly.
"""

billing = Agent(
    name="Billing",
    instructions=BILLING_INSTRUCTIONS,
    tools=(get_invoice, list_invoices, request_refund),
    handoff_description="Billing: invoices, payments, charges and refunds.",
)
"""Specialist for invoices and refunds; hands back to Triage (wired in ``agents/__init__.py``)."""
