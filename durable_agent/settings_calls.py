"""The settings of model calls: streaming, the fleet's budgets, concurrency keys.

A part of :class:`durable_agent.settings.Settings` (which inherits them, with its
``DURABLE_AGENT_`` prefix), kept in a module of its own so that each stays short.
"""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from .inputs import Limit, parse_limits


class CallSettings(BaseSettings):
    """``DURABLE_AGENT_STREAM``, ``..._TOKEN_STREAM_*``, ``..._MODEL_LIMITS``,
    ``..._BUDGET_*`` and ``..._CONCURRENCY_PER_KEY``."""

    stream: bool = Field(
        default=True,
        description="the built-in loops stream the model's answers (their text reaches "
        "stream_turn(tokens=True) as it is written; the journal records the finished answer)",
    )
    token_stream_url: str = Field(
        default="",
        description="the Redis of streamed answers' tokens ('': the broker's, if it is Redis)",
    )
    token_stream_maxlen: int = Field(
        default=20_000,
        ge=100,
        le=10_000_000,
        description="the most entries kept in one turn's token stream (older ones are trimmed)",
    )
    token_stream_ttl_seconds: int = Field(
        default=3600,
        ge=10,
        le=30 * 86_400,
        description="how long a turn's token stream is kept after its last token",
    )

    model_limits: str = Field(
        default="",
        description="budgets all workers share, per model (and API key): MODEL=rpm:N/tpm:N, "
        "comma-separated, e.g. 'gpt-4o-mini=rpm:500/tpm:200000' (a call waits for room "
        "without holding a worker)",
    )
    budget_url: str = Field(
        default="",
        description="the Redis that holds the budgets ('': the broker's, if it is Redis)",
    )
    budget_burst_seconds: float = Field(
        default=6.0,
        gt=0,
        le=30,
        allow_inf_nan=False,
        description="how many seconds of a budget may be spent at once (its bucket's size; "
        "the bucket refills at the limit less this share, so no minute passes the limit)",
    )
    budget_completion_tokens: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="tokens reserved for the answer of a call without max_tokens (settled after)",
    )

    concurrency_per_key: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="the most turns of one concurrency key (start_turn(concurrency_key=...)) "
        "running at once across the fleet; the others wait, in order (0: no limit)",
    )

    @field_validator("token_stream_url", "budget_url")
    @classmethod
    def _a_redis(cls, url: str) -> str:
        if url and not url.startswith(("redis://", "rediss://")):
            raise ValueError("must be a redis:// or rediss:// URL")
        return url

    @field_validator("model_limits")
    @classmethod
    def _limits(cls, value: str) -> str:
        parse_limits(value)
        return value

    @property
    def limits(self) -> dict[str, Limit]:
        return parse_limits(self.model_limits)
