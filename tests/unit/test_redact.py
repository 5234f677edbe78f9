"""Credentials never reach turns.error or a log line."""

from __future__ import annotations

import pytest

from durable_agent.redact import printable, redact


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Incorrect API key provided: sk-proj-AbC123xyz789.", "AbC123xyz789"),
        ("header was Authorization: Bearer eyJhbGciOi.J9.abc", "eyJhbGciOi"),
        ("cannot reach http://admin:s3cret@10.0.0.5:8000/v1", "s3cret"),
        ("redis://:hunter2@cache:6379/0 refused", "hunter2"),
        ('{"api_key": "abcd1234efgh"}', "abcd1234efgh"),
        ("retry with password=letmein&user=x", "letmein"),
    ],
)
def test_credentials_are_replaced(text: str, secret: str) -> None:
    cleaned = redact(text)
    assert secret not in cleaned
    assert "***" in cleaned


def test_ordinary_text_is_left_alone() -> None:
    text = "the model API answered 503: The server is overloaded (turn_abc123, step 4)"
    assert redact(text) == text


def test_control_characters_are_shown_not_sent_to_the_terminal() -> None:
    """An ANSI escape or a bell from a model's reply is printed as text; lines stay lines."""
    assert printable("a\x1b[31mred\x07\r ok\nnext\ttab") == "a\\x1b[31mred\\x07\\x0d ok\nnext\ttab"
    assert printable("\x9b2J") == "\\x9b2J"
