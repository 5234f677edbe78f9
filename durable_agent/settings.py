"""One typed settings object, read from ``DURABLE_AGENT_*`` environment variables.

Every value is checked when the settings are read: durations are finite and positive,
counts positive, names non-empty, URLs well formed (scheme, port, query parameters), so a
wrong setting stops a command or a worker at once with one line naming the variable.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import ConfigurationError
from .journal import Price, Sealer, StaticKeys, parse_prices, sealer_for
from .redact import remember_secrets, url_password
from .settings_calls import CallSettings

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant that uses tools to act for the user. "
    "When a tool result says a call may or may not have happened, check the current state "
    "with a read-only tool before you try the call again."
)


class Settings(CallSettings, BaseSettings):
    """Everything a process of durable-agent needs to know; pass it explicitly."""

    model_config = SettingsConfigDict(env_prefix="DURABLE_AGENT_", extra="ignore", frozen=True)

    database_url: str = Field(
        default="postgresql://root@127.0.0.1:5432/root",
        description="the journal: a Postgres URL (psycopg 3)",
    )
    broker_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="the Celery broker (redis://, rediss://, amqp://)",
    )
    result_backend: str = Field(
        default="",
        description="Celery's result_backend (e.g. the broker's Redis): agent_turn.delay()"
        ".get() returns the reply ('': none; use wait_for_turn)",
    )
    queue: str = Field(
        default="durable-agent",
        description="the Celery queue of the default agent; a turn stays on the queue it was "
        "recorded with",
    )
    tools: str = Field(default="", description="comma-separated modules that define the tools")
    agents: str = Field(
        default="",
        description="comma-separated modules that define agents (besides the tools modules)",
    )
    serve_agents: str = Field(
        default="",
        description="comma-separated agents a worker serves (empty: every agent it knows)",
    )
    tool_labels: str = Field(
        default="",
        description="override labels, e.g. 'send_email=safe': only to show what a wrong label does",
    )

    model: str = Field(
        default="gpt-4o-mini",
        description="the model name sent to Chat Completions by the default agent",
    )
    system_prompt: str = Field(
        default=DEFAULT_SYSTEM_PROMPT,
        description="the default agent's instructions; the default tells the model to check "
        "after 'may or may not have happened'",
    )
    openai_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DURABLE_AGENT_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
        description="any OpenAI-compatible endpoint (unset: OpenAI's)",
    )
    openai_api_key: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DURABLE_AGENT_OPENAI_API_KEY", "OPENAI_API_KEY"),
        description="the endpoint's API key",
    )
    model_timeout_seconds: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="seconds per model request",
    )
    model_max_retries: int = Field(
        default=4, ge=0, le=50, description="SDK retries of 429, 5xx and timeouts"
    )

    lease_seconds: float = Field(
        default=6.0,
        ge=0.5,
        le=3600,
        allow_inf_nan=False,
        description="claim length; the heartbeat renews the claim every third of it",
    )
    max_steps: int = Field(
        default=64, ge=1, le=100_000, description="step cap of a turn (a runaway loop fails)"
    )
    max_child_depth: int = Field(
        default=3,
        ge=0,
        le=100,
        description="how deep child agents may nest (a turn's child is 1 deep; 0: none)",
    )
    max_crashes: int = Field(
        default=5, ge=1, le=1000, description="worker deaths before a turn fails"
    )
    retry_backoff_max_seconds: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        allow_inf_nan=False,
        description="cap of the backoff while the model API is down",
    )
    max_message_bytes: int = Field(
        default=256 * 1024,
        ge=1,
        le=64 * 1024 * 1024,
        description="the largest user message start_turn accepts (UTF-8 bytes)",
    )

    sweep_interval_seconds: float = Field(
        default=1.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="how often the sweeper looks for turns to send again",
    )
    requeue_after_seconds: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        allow_inf_nan=False,
        description="a queue with nothing sent or received for this long gets its oldest "
        "unreceived turn sent again, as a probe",
    )
    run_sweeper: bool = Field(default=True, description="run the sweeper inside each worker")
    end_dead_local_claims: bool = Field(
        default=True,
        description="end at once a claim whose holder died on this machine (pid gone)",
    )
    visibility_timeout_seconds: int = Field(
        default=3600,
        ge=1,
        le=30 * 86_400,
        description="Redis' visibility timeout (recovery does not wait for it)",
    )

    blob_threshold_bytes: int = Field(
        default=16 * 1024,
        ge=256,
        le=64 * 1024 * 1024,
        description="outputs larger than this go to the blobs table",
    )

    # operating it (operate/cancel.py, uncertain.py, approvals.py)
    approval_required: str = Field(
        default="",
        description="comma-separated tools whose calls wait for a person's approval (a name "
        "that is no tool of the worker stops its start)",
    )
    uncertain_task: str = Field(
        default="",
        description="a Celery task name: each new uncertain effect is sent to it as JSON",
    )
    uncertain_queue: str = Field(
        default="",
        description="the queue DURABLE_AGENT_UNCERTAIN_TASK is sent to (empty: <queue>.uncertain)",
    )
    uncertain_callback: str = Field(
        default="", description="'module:function' called with each new uncertain effect"
    )
    uncertain_hook_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="longest wait for one call of an uncertain-effects hook",
    )
    prices: str = Field(
        default="",
        description="the spend ledger's price table: MODEL=PROMPT/COMPLETION in USD per "
        "million tokens, comma-separated, by the model name sent, e.g. 'gpt-4o-mini=0.15/0.60'",
    )

    tracing: bool = Field(
        default=False,
        description="send OpenTelemetry traces: a span for each delivery of a turn and each "
        "step (needs the 'otel' extra); where to, as the standard OTEL_* variables say "
        "(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, ...)",
    )
    metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="a worker's main process serves its Prometheus counters (sweeper "
        "re-sends, poison messages) on this port (0: not served; needs the 'metrics' extra); "
        "the fleet's figures come from `durable-agent metrics`",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="the address a worker's metrics port listens on (0.0.0.0: every "
        "interface, e.g. in a container)",
    )

    console_auth: str = Field(
        default="",
        repr=False,
        description="the web console's logins: USER:PASSWORD, comma-separated for several "
        "(HTTP basic auth or the login form; never shown)",
    )
    console_token: str = Field(
        default="",
        repr=False,
        description="a bearer token for scripts that call the web console (at least 16 "
        "characters; never shown); actions taken with it are recorded as by 'token'",
    )

    keys: str = Field(
        default="",
        repr=False,
        description="keys that seal payloads at rest (AES-256-GCM): KEY_ID:BASE64_OF_32_BYTES, "
        "comma-separated, newest first; new writes use the first, reads any (never shown)",
    )
    key_provider: str = Field(
        default="",
        description="module:callable giving a KeyProvider (a KMS, a vault) instead of "
        "DURABLE_AGENT_KEYS",
    )

    @field_validator("keys")
    @classmethod
    def _keys(cls, value: str) -> str:
        try:
            StaticKeys.parse(value)
        except ConfigurationError as error:
            raise ValueError(str(error).removeprefix("DURABLE_AGENT_KEYS: ")) from None
        return value

    def sealer(self) -> Sealer:
        """What seals and opens payloads (seals nothing when no key is configured)."""
        return sealer_for(self.keys, self.key_provider)

    @field_validator("console_auth")
    @classmethod
    def _logins(cls, value: str) -> str:
        for entry in filter(None, (part.strip() for part in value.split(","))):
            user, colon, password = entry.partition(":")
            if not colon or not user.strip() or not password:
                raise ValueError("expected USER:PASSWORD (comma-separated for several)")
            if not _NAME.fullmatch(user):
                raise ValueError("a user name has no spaces or control characters")
        return value

    @field_validator("console_token")
    @classmethod
    def _token(cls, value: str) -> str:
        if value and (len(value) < 16 or not _NAME.fullmatch(value)):
            raise ValueError("must be at least 16 characters with no spaces")
        return value

    def model_post_init(self, context: Any, /) -> None:
        # text from outside (a model's error body, a driver's message) may echo a secret
        # that no pattern recognises: every process redacts the ones it was configured with
        # (Runtime does it again for settings made with model_copy, which skips this)
        remember_secrets(self.secrets())

    def secrets(self) -> list[str | None]:
        """The configured credentials: the API key, the database and broker passwords, the
        console's passwords and token, the encryption keys."""
        return [
            self.openai_api_key,
            url_password(self.database_url),
            url_password(self.broker_url),
            url_password(self.token_stream_url) if self.token_stream_url else None,
            url_password(self.budget_url) if self.budget_url else None,
            *self.console_logins.values(),
            self.console_token or None,
            *(key.partition(":")[2].strip() for key in self.keys.split(",")),
        ]

    @field_validator("database_url")
    @classmethod
    def _database_url_is_postgres(cls, url: str) -> str:
        from .journal import conninfo_for

        try:
            conninfo_for(url)
        except ConfigurationError as error:
            raise ValueError(str(error)) from None
        return url

    @field_validator("broker_url")
    @classmethod
    def _broker_url_is_usable(cls, url: str) -> str:
        check_broker_url(url)
        return url

    @property
    def tokens_url(self) -> str:
        """The Redis URL of the token streams ('' when there is none)."""
        return self.token_stream_url or self._broker_if_redis()

    def _broker_if_redis(self) -> str:
        return self.broker_url if self.broker_url.startswith(("redis://", "rediss://")) else ""

    @field_validator("result_backend")
    @classmethod
    def _result_backend_is_redis(cls, url: str) -> str:
        if url:
            check_result_backend(url)
        return url

    @field_validator("queue", "model")
    @classmethod
    def _a_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError("must be 1-200 characters with no spaces or control characters")
        return value

    @field_validator("uncertain_callback")
    @classmethod
    def _callable_path(cls, value: str) -> str:
        if value and not _CALLABLE.fullmatch(value):
            raise ValueError(f"expected 'package.module:function', got {value!r}")
        return value

    @field_validator("uncertain_task", "uncertain_queue")
    @classmethod
    def _optional_name(cls, value: str) -> str:
        if value and not _NAME.fullmatch(value):
            raise ValueError("must be 1-200 characters with no spaces or control characters")
        return value

    @property
    def console_logins(self) -> dict[str, str]:
        """USER -> PASSWORD of ``console_auth``."""
        pairs = (e.strip().partition(":") for e in self.console_auth.split(",") if e.strip())
        return {user.strip(): password for user, _, password in pairs}

    @property
    def approval_tools(self) -> frozenset[str]:
        return frozenset(n.strip() for n in self.approval_required.split(",") if n.strip())

    @field_validator("tool_labels")
    @classmethod
    def _labels(cls, value: str) -> str:
        for item in filter(None, (part.strip() for part in value.split(","))):
            name, sep, label = item.partition("=")
            if not sep or not name.strip() or label.strip() not in ("safe", "never"):
                raise ValueError(f"expected TOOL=safe or TOOL=never, got {item!r}")
        return value

    @field_validator("prices")
    @classmethod
    def _prices(cls, value: str) -> str:
        parse_prices(value)
        return value

    @property
    def budgets_url(self) -> str:
        """The Redis URL of the budgets ('' when there is none)."""
        return self.budget_url or self._broker_if_redis()

    @property
    def price_table(self) -> dict[str, Price]:
        return parse_prices(self.prices)

    @property
    def tool_modules(self) -> list[str]:
        return [name.strip() for name in self.tools.split(",") if name.strip()]

    @property
    def agent_modules(self) -> list[str]:
        return [name.strip() for name in self.agents.split(",") if name.strip()]

    @property
    def served_agents(self) -> list[str]:
        return [name.strip() for name in self.serve_agents.split(",") if name.strip()]

    @property
    def label_overrides(self) -> dict[str, str]:
        pairs = (item.partition("=") for item in self.tool_labels.split(",") if item.strip())
        return {name.strip(): label.strip() for name, _, label in pairs}


_NAME = re.compile(r"[^\s\x00-\x1f\x7f]{1,200}")
_CALLABLE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


BROKER_SCHEMES = ("redis", "rediss", "amqp", "amqps", "pyamqp")
_BROKER_QUERY = {
    "redis": {
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
        "socket_timeout",
        "socket_connect_timeout",
        "health_check_interval",
    },
    "amqp": {"ssl", "heartbeat", "connect_timeout", "login_method", "virtual_host"},
}


def settings_error(error: ValidationError) -> ConfigurationError:
    """One line for the first problem pydantic found: the variable and what is wrong."""
    first = error.errors()[0]
    field = ".".join(str(p) for p in first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    return ConfigurationError(f"bad setting DURABLE_AGENT_{field.upper()}: {message}")


def load_settings() -> Settings:
    """Settings from the environment, or ConfigurationError with one line."""
    try:
        return Settings()
    except ValidationError as error:
        raise settings_error(error) from None


def check_result_backend(url: str) -> None:
    """Raise ValueError unless ``url`` is a result backend we store turns' ends in (Redis)."""
    scheme = url.partition("://")[0].lower()
    if scheme not in ("redis", "rediss"):
        raise ValueError(
            "bad result backend: durable-agent stores turns' results in Redis "
            "(redis:// or rediss://, e.g. the broker's URL)"
        )
    try:
        check_broker_url(url)
    except ValueError as error:
        raise ValueError(str(error).replace("bad broker URL", "bad result backend", 1)) from None


def check_broker_url(url: str) -> None:
    """Raise ValueError unless ``url`` is a broker URL a worker can use."""
    shown = re.sub(r"://([^:/@]*):[^@/]*@", r"://\1:***@", url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise ValueError(f"bad broker URL {shown}: {error}") from None
    scheme = parts.scheme.lower()
    if scheme not in BROKER_SCHEMES:
        raise ValueError(
            f"bad broker URL {shown}: the scheme must be one of {', '.join(BROKER_SCHEMES)}"
        )
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"bad broker URL {shown}: port {port} is not a port")
    family = "redis" if scheme.startswith("redis") else "amqp"
    if family == "redis" and parts.path.strip("/") and not parts.path.strip("/").isdigit():
        raise ValueError(f"bad broker URL {shown}: the path must be a database number")
    unknown = sorted(set(urllib.parse.parse_qs(parts.query)) - _BROKER_QUERY[family])
    if unknown:
        raise ValueError(
            f"bad broker URL {shown}: unknown query parameter(s) {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_BROKER_QUERY[family]))})"
        )
