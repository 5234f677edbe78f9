"""One typed settings object, read from ``DURABLE_AGENT_*`` environment variables."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant that uses tools to act for the user. "
    "When a tool result says a call may or may not have happened, check the current state "
    "with a read-only tool before you try the call again."
)


class Settings(BaseSettings):
    """Everything a process of durable-agent needs to know; pass it explicitly."""

    model_config = SettingsConfigDict(env_prefix="DURABLE_AGENT_", extra="ignore", frozen=True)

    database_url: str = "postgresql://root@127.0.0.1:5432/root"
    broker_url: str = "redis://127.0.0.1:6379/0"
    queue: str = "durable-agent"
    tools: str = Field(default="", description="comma-separated modules that define the tools")
    tool_labels: str = Field(
        default="",
        description="override labels, e.g. 'send_email=safe': only to show what a wrong label does",
    )

    model: str = "gpt-4o-mini"
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    openai_base_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DURABLE_AGENT_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
    )
    openai_api_key: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DURABLE_AGENT_OPENAI_API_KEY", "OPENAI_API_KEY"),
    )
    model_timeout_seconds: float = 120.0
    model_max_retries: int = Field(default=4, ge=0)

    lease_seconds: float = Field(default=6.0, gt=0)
    max_steps: int = Field(default=64, ge=1)
    max_crashes: int = Field(default=5, ge=1, description="worker deaths before a turn fails")
    retry_backoff_max_seconds: float = Field(default=300.0, gt=0)

    sweep_interval_seconds: float = Field(default=1.0, gt=0)
    requeue_after_seconds: float = Field(default=60.0, gt=0)
    run_sweeper: bool = True
    end_dead_local_claims: bool = Field(
        default=True,
        description="end at once a claim whose holder died on this machine (pid gone)",
    )
    visibility_timeout_seconds: int = Field(default=3600, ge=1)

    blob_threshold_bytes: int = Field(default=16 * 1024, ge=256)

    @property
    def tool_modules(self) -> list[str]:
        return [name.strip() for name in self.tools.split(",") if name.strip()]

    @property
    def label_overrides(self) -> dict[str, str]:
        pairs = (item.partition("=") for item in self.tool_labels.split(",") if item.strip())
        return {name.strip(): label.strip() for name, _, label in pairs}
