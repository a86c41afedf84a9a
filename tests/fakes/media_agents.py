"""Agents for the media-out end-to-end tests (``AGENTS_MODULE=tests.fakes.media_agents``).

One agent with a tool that returns a small JPEG beside its text, as an
operator's chart or receipt tool would.
"""

from __future__ import annotations

from bot import Agent, Attachment, ToolOutput, tool
from tests.fakes.media_files import jpeg_bytes

__all__ = ["CHART_NAME", "starting_agent"]

CHART_NAME = "sales-chart.jpg"
"""The file name the user sees (never logged)."""


@tool
def send_chart(title: str) -> ToolOutput:
    """Draw a chart and send it to the user.

    Args:
        title: What the chart shows.
    """
    return ToolOutput(
        f"The chart of {title} is ready.",
        [Attachment.image(jpeg_bytes(), file_name=CHART_NAME)],
    )


starting_agent = Agent(
    name="Charts",
    instructions="You draw charts with the send_chart tool.",
    tools=[send_chart],
)
"""What ``python -m bot run`` loads."""
