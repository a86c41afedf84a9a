"""The no-key demo as an operator meets it: ``python -m bot chat`` / ``run`` with piped
stdin in a checkout (its ``agents/`` folder), settings from the environment or ``.env``,
the example agents on the offline model."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORDER = "where is my order #1001?"
REFUND = "I need a refund for invoice INV-2001"


def _bot(tmp_path: Path, *args: str, stdin: str, **env: str) -> subprocess.CompletedProcess[str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "SYSTEMROOT")}
    return subprocess.run(
        [sys.executable, "-m", "bot", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={
            **keep,
            "PYTHONPATH": str(ROOT),
            "DATA_DIR": str(tmp_path / "data"),
            "HTTP_PORT": "0",
            "LOG_FORMAT": "text",
            **env,
        },
        timeout=60,
        check=False,
    )


def _chat(tmp_path: Path, *lines: str, **env: str) -> list[str]:
    result = _bot(tmp_path, "chat", stdin="".join(f"{line}\n" for line in lines), **env)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.fixture(autouse=True)
def checkout(tmp_path: Path) -> None:
    """The working directory holds the repository's ``agents/``, as in ``make run``."""
    shutil.copytree(ROOT / "agents", tmp_path / "agents", ignore=shutil.ignore_patterns("__py*"))


def _refunds(tmp_path: Path) -> list[dict[str, object]]:
    path = tmp_path / "data" / "refund_requests.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# -- D11: the README's two prompts, one conversation --------------------------------------


def test_the_readme_prompts_both_get_tool_answers_in_one_conversation(tmp_path: Path) -> None:
    # Piped like a person typing: "1" answers the refund tool's approval question.
    order, question, blank, approve, deny, approved, refund = _chat(tmp_path, ORDER, REFUND, "1")

    assert order.startswith("[Order Tracking] [offline demo] I checked check order status:")
    assert "status: shipped, carrier: DHL Express" in order
    # Order Tracking hands the refund back to Triage, which routes it on to Billing,
    # whose refund tool asks first, then records the request once approved.
    assert question.startswith(
        "[Billing] Shall I open a refund request for invoice INV-2001 (59.90 EUR)? Your reason: "
    )
    assert (blank, approve, deny, approved) == ("", "1. Approve", "2. Deny", "(Approved.)")
    assert refund.startswith("[Billing] [offline demo] I checked request refund:")
    assert "invoice_id: INV-2001" in refund and "state: received" in refund
    assert [r["invoice_id"] for r in _refunds(tmp_path)] == ["INV-2001"]


def test_the_readme_prompts_also_work_the_other_way_round(tmp_path: Path) -> None:
    lines = _chat(tmp_path, REFUND, "Approve", ORDER)

    assert lines[0].startswith("[Billing] Shall I open a refund request for invoice INV-2001")
    assert lines[5].startswith("[Billing] [offline demo] I checked request refund:")
    # "#1001" after "order" is no invoice number: Billing hands it back to Triage.
    assert lines[6].startswith("[Order Tracking] [offline demo] I checked check order status:")
    assert "order_id: 1001" in lines[6]


def test_a_denied_refund_records_nothing(tmp_path: Path) -> None:
    lines = _chat(tmp_path, REFUND, "2")

    assert lines[4] == "(Denied.)"
    assert lines[5].startswith("[Billing] [offline demo]")
    assert _refunds(tmp_path) == []


def test_a_greeting_to_a_specialist_goes_back_to_the_front_desk(tmp_path: Path) -> None:
    _, hello, again = _chat(tmp_path, ORDER, "hello", "where is order 1004?")

    assert hello.startswith('[Triage] [offline demo] Triage here. You said: "hello".')
    assert again.startswith("[Order Tracking] [offline demo] I checked check order status:")
    assert "status: delayed" in again


def test_start_greets_as_the_agent_holding_the_conversation(tmp_path: Path) -> None:
    first = _chat(tmp_path, "/start", ORDER, "/start")

    assert first[0] == "[Triage] Hello! I'm Triage. How can I help?"
    assert first[2] == "[Order Tracking] Hello! I'm Order Tracking. How can I help?"
    # The next process goes on with the same conversation, on the same agent.
    assert _chat(tmp_path, "/start") == [
        "[Order Tracking] Hello! I'm Order Tracking. How can I help?"
    ]


def test_sample_dates_are_relative_to_today(tmp_path: Path) -> None:
    order, _, invoice = _chat(tmp_path, ORDER, "/reset", "show invoice INV-2001")
    today = date.today()  # a run across midnight may see the bot's day differ by one

    eta = date.fromisoformat(re.findall(r"eta: (\d{4}-\d\d-\d\d)", order)[0])
    issued = date.fromisoformat(re.findall(r"issued_on: (\d{4}-\d\d-\d\d)", invoice)[0])
    assert today <= eta <= today + timedelta(days=15), order
    assert today - timedelta(days=31) <= issued <= today, invoice


AGENT_WITH_A_FILE = '''\
from bot import Agent, Attachment, ToolOutput, tool


@tool
def sales_chart() -> ToolOutput:
    """The sales of May as a CSV file."""
    data = b"month,total\\nMay,12\\n"
    return ToolOutput("Chart of May ready.", [Attachment.file(data, file_name="sales.csv")])


starting_agent = Agent(name="Reports", instructions="Send reports.", tools=[sales_chart])
'''


def test_the_offline_answer_to_a_file_does_not_repeat_the_note_for_the_model(
    tmp_path: Path,
) -> None:
    shutil.rmtree(tmp_path / "agents")
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "__init__.py").write_text(AGENT_WITH_A_FILE)

    lines = _chat(tmp_path, "send me the sales chart")

    assert not [line for line in lines if "the user receives it with your answer" in line]
    assert lines[0] == "[Reports] [offline demo] I checked sales chart: Chart of May ready."
    assert lines[1].startswith('[attached file "sales.csv"')
    assert len(lines) == 2


# -- D12: a terminal user the allow list leaves out ------------------------------------------


@pytest.mark.parametrize("command", ["chat", "run"])
def test_a_terminal_user_left_off_the_allow_list_is_told_why(tmp_path: Path, command: str) -> None:
    (tmp_path / ".env").write_text("ALLOWED_USERS=someone\n")

    result = _bot(tmp_path, command, stdin="hello\n", TELEGRAM_BOT_TOKEN="")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "(not answered: local-user is not in ALLOWED_USERS; "
        "add it there to talk from this terminal)"
    ]


def test_a_listed_terminal_user_gets_answers_and_no_notice(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("ALLOWED_USERS=someone,local-user\n")

    (line,) = _chat(tmp_path, "hello")

    assert line.startswith("[Triage] [offline demo]")


# -- D18: fixed answers without a turn carry no agent label ------------------------------


def test_the_pairing_notice_is_not_labelled_as_an_agent(tmp_path: Path) -> None:
    lines = _chat(tmp_path, "hello", ACCESS_MODE="pairing")

    assert lines[0] == (
        "This assistant is private. To get access, send this pairing code to its operator:"
    )
    assert not any(line.startswith("[") for line in lines)


def test_the_rate_limit_notice_is_not_labelled_as_an_agent(tmp_path: Path) -> None:
    answer, notice = _chat(tmp_path, "hello", "hello again", "and again", RATE_LIMIT_MESSAGES="1")

    assert answer.startswith("[Triage] ")
    assert notice.startswith("You are sending messages faster than I can answer.")


def test_the_demo_answers_a_policy_question_from_agents_knowledge_and_cites_the_file(
    tmp_path: Path,
) -> None:
    """What ``make run`` does: add ``agents/knowledge``, then the offline demo answers."""
    added = _bot(tmp_path, "knowledge", "add", "agents/knowledge", stdin="")
    assert added.returncode == 0, added.stderr

    (answer,) = _chat(tmp_path, "What are your opening hours on Saturday?")

    assert answer.startswith("[Triage] [offline demo] According to opening-hours.md")
    assert "Saturday from 10:00 to 14:00" in answer
    assert answer.endswith("(source: opening-hours.md)")
