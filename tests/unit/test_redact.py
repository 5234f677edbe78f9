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


HEX_KEY = "3f9c2a7be41d08c65a9e7f1b2c3d4e5f"  # 32 hex digits, no sk- prefix
PLAIN_TOKEN = "tok_live_9Hq2LmZx"


@pytest.fixture
def configured() -> object:
    """Settings read with these secrets (every process that reads its settings does this)."""
    from durable_agent.redact import forget_secrets
    from durable_agent.settings import Settings

    forget_secrets()
    settings = Settings(
        openai_api_key=HEX_KEY,
        database_url="postgresql://app:pg%2Fpass%40word@db:5432/app",
        broker_url="redis://:brokerPass-77@cache:6379/0",
    )
    yield settings
    forget_secrets()


@pytest.mark.parametrize(
    ("text", "secrets"),
    [
        (f"Incorrect API key provided: {HEX_KEY}.", [HEX_KEY]),
        (f"invalid key '{HEX_KEY}'", [HEX_KEY]),
        (f"header was authorization: bearer%20{HEX_KEY}", [HEX_KEY]),
        ("auth failed for pg/pass@word and pg%2Fpass%40word", ["pg/pass@word", "pg%2Fpass%40word"]),
        ("NOAUTH brokerPass-77 rejected", ["brokerPass-77"]),
    ],
)
def test_configured_secrets_are_redacted_in_every_form(
    configured: object, text: str, secrets: list[str]
) -> None:
    """The configured API key and passwords, plain and URL-encoded, wherever they are; no
    pattern would have found a 32-hex key, a quoted key or ``bearer%20<key>``."""
    cleaned = redact(text)
    for secret in secrets:
        assert secret not in cleaned, cleaned
    assert "***" in cleaned


def test_a_plain_token_as_the_key_is_redacted() -> None:
    from durable_agent.redact import forget_secrets
    from durable_agent.settings import Settings

    forget_secrets()
    try:
        Settings(openai_api_key=PLAIN_TOKEN)
        assert redact(f'{{"error": "{PLAIN_TOKEN}"}}') == '{"error": "***"}'
    finally:
        forget_secrets()


def test_short_secrets_are_left_to_the_patterns() -> None:
    """A 4-letter password would blank out every word holding it: not remembered."""
    from durable_agent.redact import forget_secrets, remember_secrets

    forget_secrets()
    try:
        remember_secrets(["test", None, ""])
        assert redact("the test passed") == "the test passed"
    finally:
        forget_secrets()


def test_log_records_are_one_line_with_no_secret(configured: object) -> None:
    """A reply holding a newline and escape sequences cannot write a log line of its own,
    and a configured key in a logged error is redacted (the filter the worker installs)."""
    import io
    import logging

    from durable_agent.redact import escape_log_lines

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    escape_log_lines([handler])
    escape_log_lines([handler])  # once only
    assert len(handler.filters) == 1
    log = logging.getLogger("test_redact.forged")
    log.addHandler(handler)
    log.propagate = False
    try:
        reply = "ok\nERROR durable_agent.worker: turn X failed\x1b[2J\r\u2028"
        log.warning("turn %s: done %s", "turn_1", reply)
        log.error("turn %s failed: Incorrect API key provided: %s", "turn_2", HEX_KEY)
    finally:
        log.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0] == (
        "WARNING test_redact.forged: turn turn_1: done "
        "ok\\nERROR durable_agent.worker: turn X failed\\x1b[2J\\r\\u2028"
    )
    assert HEX_KEY not in lines[1] and lines[1].endswith("provided: ***")
