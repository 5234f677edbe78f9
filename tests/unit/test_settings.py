"""Unit tests of Settings: the DURABLE_AGENT_ prefix, URL normalisation, aliases, lists."""

from __future__ import annotations

import os

import pydantic
import pytest

from durable_agent import ConfigurationError, Settings
from durable_agent.journal.db import conninfo_for
from durable_agent.settings import load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test from an environment with no setting of ours in it."""
    for name in list(os.environ):
        if name.upper().startswith(("DURABLE_AGENT_", "OPENAI_")):
            monkeypatch.delenv(name)


def test_defaults_without_environment() -> None:
    """With nothing set, the documented defaults apply."""
    settings = Settings()
    assert settings.database_url == "postgresql://root@127.0.0.1:5432/root"
    assert settings.broker_url == "redis://127.0.0.1:6379/0"
    assert settings.queue == "durable-agent"
    assert settings.openai_base_url is None and settings.openai_api_key is None
    assert settings.tool_modules == []


def test_env_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    """DURABLE_AGENT_* variables set the fields, with types converted; bare names do not."""
    monkeypatch.setenv("DURABLE_AGENT_QUEUE", "turns-a")
    monkeypatch.setenv("DURABLE_AGENT_LEASE_SECONDS", "3.5")
    monkeypatch.setenv("DURABLE_AGENT_MAX_STEPS", "7")
    monkeypatch.setenv("DURABLE_AGENT_RUN_SWEEPER", "false")
    monkeypatch.setenv("DURABLE_AGENT_MODEL", "gpt-test")
    monkeypatch.setenv("MAX_CRASHES", "99")

    settings = Settings()

    assert settings.queue == "turns-a"
    assert settings.lease_seconds == 3.5
    assert settings.max_steps == 7
    assert settings.run_sweeper is False
    assert settings.model == "gpt-test"
    assert settings.max_crashes == 5


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://root@127.0.0.1:5432/db", "postgresql://root@127.0.0.1:5432/db"),
        ("postgres://u:p@host/db", "postgresql://u:p@host/db"),
        ("postgresql+psycopg://u@h/db", "postgresql://u@h/db"),
        ("postgresql+psycopg2://u@h/db", "postgresql://u@h/db"),
    ],
)
def test_database_urls_of_every_spelling_reach_postgres_through_psycopg(
    given: str, expected: str
) -> None:
    """postgresql://, postgres:// and SQLAlchemy's postgresql+driver:// all name Postgres."""
    assert conninfo_for(given) == expected


def test_openai_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    """OPENAI_BASE_URL and OPENAI_API_KEY are read when the prefixed names are not set."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9999/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-plain")
    settings = Settings()
    assert settings.openai_base_url == "http://127.0.0.1:9999/v1"
    assert settings.openai_api_key == "sk-plain"


def test_prefixed_openai_names_win(monkeypatch: pytest.MonkeyPatch) -> None:
    """DURABLE_AGENT_OPENAI_* take precedence over the plain OPENAI_* names."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://plain/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-plain")
    monkeypatch.setenv("DURABLE_AGENT_OPENAI_BASE_URL", "http://prefixed/v1")
    monkeypatch.setenv("DURABLE_AGENT_OPENAI_API_KEY", "sk-prefixed")
    settings = Settings()
    assert settings.openai_base_url == "http://prefixed/v1"
    assert settings.openai_api_key == "sk-prefixed"


def test_openai_fields_by_name_in_code() -> None:
    """In code, the aliased fields are set by their field names."""
    settings = Settings(openai_base_url="http://x/v1", openai_api_key="k")
    assert (settings.openai_base_url, settings.openai_api_key) == ("http://x/v1", "k")


@pytest.mark.parametrize(
    ("value", "modules"),
    [
        ("", []),
        ("durable_agent_examples.email_tools", ["durable_agent_examples.email_tools"]),
        (
            " durable_agent_examples.email_tools, ,durable_agent_examples.payments_tools ,",
            ["durable_agent_examples.email_tools", "durable_agent_examples.payments_tools"],
        ),
    ],
)
def test_tool_modules_split(
    monkeypatch: pytest.MonkeyPatch, value: str, modules: list[str]
) -> None:
    """DURABLE_AGENT_TOOLS is a comma-separated list; blanks and spaces are dropped."""
    monkeypatch.setenv("DURABLE_AGENT_TOOLS", value)
    assert Settings().tool_modules == modules


def test_label_overrides_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """DURABLE_AGENT_TOOL_LABELS gives name=label pairs."""
    monkeypatch.setenv("DURABLE_AGENT_TOOL_LABELS", "send_email=safe, refund_order = never,")
    assert Settings().label_overrides == {"send_email": "safe", "refund_order": "never"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DURABLE_AGENT_LEASE_SECONDS", "abc"),
        ("DURABLE_AGENT_LEASE_SECONDS", "0"),
        ("DURABLE_AGENT_MAX_STEPS", "0"),
        ("DURABLE_AGENT_MODEL_MAX_RETRIES", "-1"),
    ],
)
def test_bad_values_are_rejected(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """A malformed or out-of-range value fails validation, naming the field."""
    monkeypatch.setenv(name, value)
    with pytest.raises(pydantic.ValidationError) as caught:
        Settings()
    field = name.removeprefix("DURABLE_AGENT_").lower()
    assert [e["loc"] for e in caught.value.errors()] == [(field,)]


def test_settings_are_frozen() -> None:
    """Settings cannot be changed after creation (model_copy makes a changed copy)."""
    settings = Settings()
    with pytest.raises(pydantic.ValidationError):
        settings.queue = "other"
    assert settings.model_copy(update={"queue": "other"}).queue == "other"
    assert settings.queue == "durable-agent"


NUMBERS = [
    "lease_seconds",
    "sweep_interval_seconds",
    "requeue_after_seconds",
    "retry_backoff_max_seconds",
    "model_timeout_seconds",
    "max_steps",
    "max_crashes",
    "visibility_timeout_seconds",
    "blob_threshold_bytes",
    "max_message_bytes",
]


@pytest.mark.parametrize("name", NUMBERS)
@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "-inf", "1e300", "abc", ""])
def test_every_number_is_checked(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    """No negative, zero, NaN, infinite or absurd lease, timeout, interval or count."""
    monkeypatch.setenv(f"DURABLE_AGENT_{name.upper()}", value)
    with pytest.raises(pydantic.ValidationError):
        Settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("QUEUE", ""),
        ("QUEUE", "two words"),
        ("QUEUE", "x" * 201),
        ("MODEL", ""),
        ("TOOL_LABELS", "send_email=maybe"),
        ("TOOL_LABELS", "=safe"),
        ("BROKER_URL", "kafka://host:9092"),
        ("BROKER_URL", "redis://host:99999/0"),
        ("BROKER_URL", "redis://host:port/0"),
        ("BROKER_URL", "redis://host/zero"),
        ("BROKER_URL", "redis://host/0?visibility=1"),
        ("DATABASE_URL", "postgresql://u@h:0/db"),
        ("DATABASE_URL", "postgresql://u@h/db?sslmode=x&nonsense=1"),
        ("DATABASE_URL", "mysql://u@h/db"),
    ],
)
def test_names_and_urls_are_checked(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(f"DURABLE_AGENT_{name}", value)
    with pytest.raises(pydantic.ValidationError):
        Settings()


def test_load_settings_gives_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_AGENT_BROKER_URL", "redis://:s3cret@host:99999/0")
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    text = str(caught.value)
    assert text.startswith("bad setting DURABLE_AGENT_BROKER_URL: bad broker URL")
    assert "\n" not in text and "s3cret" not in text


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0", "rediss://h:6380/1?ssl_cert_reqs=required", "amqp://g:g@h//"],
)
def test_usable_broker_urls_pass(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("DURABLE_AGENT_BROKER_URL", url)
    assert Settings().broker_url == url
