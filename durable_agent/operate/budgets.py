"""Model budgets the whole fleet shares: requests and tokens a minute, per model and API key.

Each budget is two token buckets in one Redis hash (requests, tokens) of
``DURABLE_AGENT_BUDGET_BURST_SECONDS`` worth (``cap = limit * burst / 60``), refilled
continuously at ``(limit - cap) / 60`` a second: whatever 60 seconds one looks at, the fleet
spends at most ``cap + (limit - cap) = limit``, so a provider that counts its limit over a
sliding minute never sees it passed (no window of ours empties at the minute's turn, so no
burst at each minute's start either). The price is ``burst / 60`` of the limit (10 % with the
default 6 s). Every change is
one Lua script, atomic across all workers, on Redis' own clock (``TIME``):

- ``reserve``: before a model call, take one request and the call's *estimated* tokens (its
  prompt at four characters a token, plus its ``max_tokens`` or
  ``DURABLE_AGENT_BUDGET_COMPLETION_TOKENS``). A call larger than the whole bucket is let
  through when the bucket is full and leaves it in debt. No room: the script answers how
  long until there is, and the turn waits that long without holding its worker
  (``BudgetExhausted``, the deferral of ``turn_worker.py``; never counted as a failure).
- ``settle``: after the call, the difference between the real usage and the estimate is
  given back (or taken).
- ``rate_limited``: a 429 that still came empties both buckets (the provider knows better),
  so the fleet waits for them to refill.

A worker killed between reserve and settle leaves its estimate spent: the bucket refills it
within one burst (``BUDGET_BURST_SECONDS``, by default one lease), and its entry in the
budget's in-flight set expires after one lease, so ``durable-agent limits`` stops showing it.
The budget of a model is keyed by the model's name and a fingerprint of the API key
(``model@abcd1234``), so two keys are two budgets, as the providers count them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from ..errors import BudgetExhausted
from ..inputs import Limit
from ..settings import Settings

log = logging.getLogger(__name__)

PREFIX = "durable-agent:budget:"
WAIT_IN_PLACE_SECONDS = 0.5
"""A wait for budget this short is waited out holding the worker; a longer one defers."""

__all__ = ["BudgetUse", "Budgets", "ModelBudget", "Reservation", "estimate_tokens"]

# KEYS: the bucket hash, the in-flight set. ARGV: rpm, tpm (0: unlimited), burst seconds,
# tokens wanted, reservation id, lease seconds. Answers {0, 0} (reserved) or {1, wait ms}.
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local burst, want = tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'r', 't', 'ts')
local rcap, tcap = math.max(1, rpm * burst / 60), math.max(1, tpm * burst / 60)
local r = tonumber(state[1]) or rcap
local tk = tonumber(state[2]) or tcap
local ts = tonumber(state[3]) or now
local dt = math.max(0, now - ts)
local rrate, trate = math.max(1e-9, (rpm - rcap) / 60), math.max(1e-9, (tpm - tcap) / 60)
if rpm > 0 then r = math.min(rcap, r + dt * rrate) end
if tpm > 0 then tk = math.min(tcap, tk + dt * trate) end
local need = math.min(want, tcap)
local wait = 0
if rpm > 0 and r < 1 then wait = math.max(wait, (1 - r) / rrate) end
if tpm > 0 and tk < need then wait = math.max(wait, (need - tk) / trate) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if wait > 0 then
  redis.call('HSET', KEYS[1], 'r', r, 't', tk, 'ts', now)
  redis.call('HINCRBY', KEYS[1], 'waits', 1)
  redis.call('EXPIRE', KEYS[1], 86400)
  return {1, math.ceil(wait * 1000)}
end
if rpm > 0 then r = r - 1 end
if tpm > 0 then tk = tk - want end
redis.call('HSET', KEYS[1], 'r', r, 't', tk, 'ts', now)
redis.call('HINCRBY', KEYS[1], 'reserved', 1)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), ARGV[5])
redis.call('EXPIRE', KEYS[1], 86400)
redis.call('EXPIRE', KEYS[2], 86400)
return {0, 0}
"""

# KEYS: the bucket hash, the in-flight set. ARGV: tpm, burst seconds, tokens to give back
# (negative: to take), reservation id, 1 if the call was answered 429.
_SETTLE = """
local tpm, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local back, limited = tonumber(ARGV[3]), ARGV[5] == '1'
redis.call('ZREM', KEYS[2], ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local state = redis.call('HMGET', KEYS[1], 'r', 't', 'ts')
if not state[3] then return 0 end
local tcap = math.max(1, tpm * burst / 60)
local tk = tonumber(state[2])
local ts = tonumber(state[3])
local r = tonumber(state[1])
local trate = math.max(1e-9, (tpm - tcap) / 60)
if tpm > 0 then tk = math.min(tcap, tk + math.max(0, now - ts) * trate) end
if limited then
  tk = math.min(tk, 0)
  r = math.min(r, 0)
  redis.call('HINCRBY', KEYS[1], 'rate_limited', 1)
elseif tpm > 0 then
  tk = math.min(tcap, tk + back)
end
redis.call('HSET', KEYS[1], 'r', r, 't', tk, 'ts', now)
redis.call('HINCRBY', KEYS[1], 'settled', 1)
return 1
"""


def estimate_tokens(request: dict[str, Any], completion_default: int) -> int:
    """The tokens a call will likely use: its prompt at about four characters a token (the
    way OpenAI's tokenizers count English), plus the completion it allows."""
    keys = ("messages", "input", "instructions", "tools", "model")
    prompt = {key: request[key] for key in keys if key in request}
    text = json.dumps(prompt, separators=(",", ":"), ensure_ascii=False)
    completion = next(
        (
            int(request[key])
            for key in ("max_completion_tokens", "max_tokens", "max_output_tokens")
            if isinstance(request.get(key), int)
        ),
        completion_default,
    )
    return max(1, len(text) // 4) + completion


@dataclass(frozen=True, slots=True)
class BudgetUse:
    """What ``durable-agent limits`` shows of one budget."""

    name: str
    rpm: int | None
    tpm: int | None
    requests_free: float | None
    tokens_free: float | None
    in_flight: int
    reserved: int
    waits: int
    rate_limited: int

    def as_json(self) -> dict[str, Any]:
        return {
            "budget": self.name,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "requests_free": self.requests_free,
            "tokens_free": self.tokens_free,
            "in_flight": self.in_flight,
            "reserved": self.reserved,
            "waits": self.waits,
            "rate_limited": self.rate_limited,
        }


class Budgets:
    """The fleet's budgets on one Redis, from ``DURABLE_AGENT_MODEL_LIMITS``."""

    def __init__(self, settings: Settings) -> None:
        self.url = settings.budgets_url
        self.limits = settings.limits
        self.burst = settings.budget_burst_seconds
        self.lease = settings.lease_seconds
        self.completion = settings.budget_completion_tokens
        key = settings.openai_api_key or ""
        self.fingerprint = hashlib.sha256(key.encode()).hexdigest()[:8]
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> redis.Redis:
        with self._lock:
            if self._client is None:
                self._client = redis.Redis.from_url(
                    self.url, socket_connect_timeout=2, socket_timeout=5
                )
            return self._client

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._client = None

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def name(self, model: str) -> str:
        return f"{model}@{self.fingerprint}"

    def for_model(self, model: str) -> ModelBudget | None:
        """The budget of calls to ``model`` (None when it has no limit)."""
        limit = self.limits.get(model)
        if limit is None:
            return None
        return ModelBudget(self, self.name(model), limit)

    def use(self) -> list[BudgetUse]:
        """Each configured budget as it is now (refilled to now)."""
        seconds, micros = self.client.time()  # Redis' clock, as the scripts use
        now = seconds + micros / 1e6
        uses = []
        for model, limit in sorted(self.limits.items()):
            name = self.name(model)
            raw: Any = self.client.hgetall(PREFIX + name)
            state = {_text(k): float(v) for k, v in raw.items()}
            in_flight = self.client.zcount(PREFIX + name + ":inflight", now, "+inf")
            dt = max(0.0, now - state.get("ts", now))
            uses.append(
                BudgetUse(
                    name=name,
                    rpm=limit.rpm,
                    tpm=limit.tpm,
                    requests_free=_refilled(state.get("r"), limit.rpm, self.burst, dt),
                    tokens_free=_refilled(state.get("t"), limit.tpm, self.burst, dt),
                    in_flight=int(in_flight),
                    reserved=int(state.get("reserved", 0)),
                    waits=int(state.get("waits", 0)),
                    rate_limited=int(state.get("rate_limited", 0)),
                )
            )
        return uses


def _refilled(level: float | None, per_minute: int | None, burst: float, dt: float) -> float | None:
    if per_minute is None:
        return None
    cap = max(1.0, per_minute * burst / 60)
    if level is None:
        return cap
    return round(min(cap, level + dt * max(1e-9, per_minute - cap) / 60), 1)


class ModelBudget:
    """The budget of one model: reserve before a call, settle after."""

    def __init__(self, budgets: Budgets, name: str, limit: Limit) -> None:
        self.budgets = budgets
        self.name = name
        self.limit = limit
        self.keys = [PREFIX + name, PREFIX + name + ":inflight"]

    def reserve(self, request: dict[str, Any]) -> Reservation:
        """Take the call's estimated tokens and one request, or raise BudgetExhausted. If
        Redis cannot be reached the call goes ahead unbudgeted (logged): a budget is a
        courtesy to the provider, never a reason for a turn to stop."""
        budgets = self.budgets
        tokens = estimate_tokens(request, budgets.completion)
        reservation = Reservation(self, uuid.uuid4().hex, tokens)
        waited = 0.0
        while True:
            try:
                answer: Any = budgets.client.eval(
                    _RESERVE,
                    2,
                    *self.keys,
                    self.limit.rpm or 0,
                    self.limit.tpm or 0,
                    budgets.burst,
                    tokens,
                    reservation.id,
                    budgets.lease,
                )
            except redis.RedisError as error:
                log.warning("budget %s not checked (%s): the call goes ahead", self.name, error)
                reservation.open = False
                return reservation
            if int(answer[0]) == 0:
                return reservation
            wait = int(answer[1]) / 1000
            if waited + wait <= WAIT_IN_PLACE_SECONDS:
                time.sleep(wait)
                waited += wait
                continue
            raise BudgetExhausted(
                f"the budget of {self.name} (rpm {self.limit.rpm or '-'}, tpm "
                f"{self.limit.tpm or '-'}) has no room for {tokens} tokens for {wait:.1f}s",
                retry_after=wait,
            )


class Reservation:
    """One call's reservation: settled once, with the real usage or a 429."""

    def __init__(self, budget: ModelBudget, reservation_id: str, tokens: int) -> None:
        self.budget = budget
        self.id = reservation_id
        self.tokens = tokens
        self.open = True

    def settle(self, usage: dict[str, Any] | None) -> None:
        """Give back what the call did not use (its usage's total; without usage, keep all)."""
        used = _total(usage)
        self._settle(self.tokens - used if used is not None else 0, limited=False)

    def rate_limited(self) -> None:
        """The call was answered 429: empty the buckets."""
        self._settle(0, limited=True)

    def release(self) -> None:
        """The call was never made (or failed without a bill): give it all back."""
        self._settle(self.tokens, limited=False)

    def _settle(self, back: int, *, limited: bool) -> None:
        if not self.open:
            return
        self.open = False
        budget = self.budget
        try:
            budget.budgets.client.eval(
                _SETTLE,
                2,
                *budget.keys,
                budget.limit.tpm or 0,
                budget.budgets.burst,
                back,
                self.id,
                1 if limited else 0,
            )
        except redis.RedisError as error:  # the bucket refills by itself
            log.warning("budget %s not settled (%s)", budget.name, error)


def _total(usage: dict[str, Any] | None) -> int | None:
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    return sum(p for p in parts if isinstance(p, int)) if any(parts) else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
