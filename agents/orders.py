"""Order Tracking: where an order is, when it arrives and who carries it.

Its one tool is a plain (sync) function: the runtime runs sync tools in a
worker thread, so reading the data file here never blocks the event loop.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter

from bot import Agent, search_knowledge, tool

from ._data import SampleDate, read_data_file

__all__ = [
    "ORDER_TRACKING_INSTRUCTIONS",
    "OrderRecord",
    "check_order_status",
    "normalise_order_id",
    "order_tracking",
]

logger = logging.getLogger(__name__)

_ORDER_ID_RE = re.compile(r"^(?:order\s*)?(?:no\.?|number)?\s*#?\s*(\d{4,8})$", re.IGNORECASE)


class OrderRecord(BaseModel):
    """One order as stored in ``data/orders.json`` (keyed by order number)."""

    status: Literal["processing", "shipped", "delayed", "delivered", "cancelled"]
    """Where the order is in its life."""
    carrier: str | None = None
    """Shipping company, once it has the parcel."""
    tracking_number: str | None = None
    """The carrier's tracking number."""
    eta: SampleDate | None = None
    """Expected delivery date, while on its way."""
    delivered_on: SampleDate | None = None
    """Delivery date, once delivered."""
    note: str | None = None
    """A line for the customer about the current state."""


_ORDERS = TypeAdapter(dict[str, OrderRecord])


def normalise_order_id(raw: str) -> str:
    """``"#1001"``, ``"order 1001"``, ``" 1001 "`` -> ``"1001"``.

    Raises ``ValueError`` with a message meant for the customer when ``raw``
    is not an order number (4 to 8 digits).
    """
    match = _ORDER_ID_RE.match(raw.strip())
    if match is None:
        raise ValueError(
            f"{raw.strip()!r} is not an order number: order numbers have 4 to 8 digits, "
            "like #1001 (see the order confirmation e-mail)"
        )
    return match.group(1)


def load_orders() -> dict[str, OrderRecord]:
    """All orders from ``data/orders.json``, validated."""
    return _ORDERS.validate_python(read_data_file("orders.json"))


@tool
def check_order_status(order_id: str) -> dict[str, Any] | str:
    """Look up an order's status, carrier, tracking number and expected delivery date.

    Args:
        order_id: The order number, e.g. "1001" or "#1001".
    """
    number = normalise_order_id(order_id)
    record = load_orders().get(number)
    if record is None:
        logger.debug("order lookup: %s not found", number)
        return (
            f"No order #{number} was found. Ask the customer to check the number "
            "on their order confirmation e-mail."
        )
    # Unset fields are left out so the model never reads "carrier: null" as a fact.
    return {"order_id": number, **record.model_dump(mode="json", exclude_none=True)}


ORDER_TRACKING_INSTRUCTIONS = """\
You help customers find out where their order is.

- You need the order number (4 to 8 digits, like #1001). Ask for it if the
  customer has not given it.
- Call check_order_status and answer from its result only: status, carrier,
  tracking number, expected delivery date, and the note when there is one.
  Never guess a date or a carrier.
- If the order is not found or the number is not valid, say so and ask the
  customer to check the number on their confirmation e-mail.
- For shipping costs, delivery times and other shipping policy, call
  search_knowledge and answer from its passages, citing the file they come
  from, e.g. "(source: shipping.md)".
- For invoices, payments or refunds, or anything that is not about an order's
  delivery, call transfer_to_triage so the front desk can route the customer.

Keep answers short and friendly.
"""

order_tracking = Agent(
    name="Order Tracking",
    instructions=ORDER_TRACKING_INSTRUCTIONS,
    tools=(check_order_status, search_knowledge),
    handoff_description="Tracks orders and shipments: delivery, shipping, carriers and parcels.",
)
"""Specialist for order status; hands back to Triage (wired in ``agents/__init__.py``)."""
