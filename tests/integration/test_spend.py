"""The spend ledger on a real Postgres: tokens from recorded usage, crash waste from the epochs
of interrupted model steps, what the journal saved, prices, and the CLI and Python API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from durable_agent import InvalidArgument
from durable_agent.journal import Claim, JournalStore, Leases
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.testing.harness import settings_env

if TYPE_CHECKING:
    from conftest import DatabaseClock

OWNER = "w"


def _output(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "message": {"role": "assistant", "content": "ok"},
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
    }


def _claim(leases: Leases, turn_id: str) -> int:
    claim = leases.claim(turn_id, OWNER, 30.0)
    assert isinstance(claim, Claim), claim
    return claim.epoch


def _model_step(
    store: JournalStore, turn_id: str, epoch: int, step: int, tokens: tuple[int, int]
) -> None:
    store.insert_intent(turn_id, epoch, step, "model", "llm", {"model": "m-small"}, "safe")
    store.record_outcome(turn_id, epoch, step, _output(*tokens), durable=False)


def _clean_turn(store: JournalStore, leases: Leases, session: str, agent: str = "default") -> str:
    """Two model calls and a tool call, one claim."""
    turn_id = store.create_turn(session, "hi", agent=agent).turn_id
    epoch = _claim(leases, turn_id)
    _model_step(store, turn_id, epoch, 0, (100, 10))
    store.insert_done(turn_id, epoch, 1, "tool", "lookup", {}, "safe", {"content": "x"})
    _model_step(store, turn_id, epoch, 2, (150, 20))
    assert leases.finish(turn_id, epoch, "done") is not None
    return turn_id


def _crashed_turn(store: JournalStore, leases: Leases, session: str) -> str:
    """Step 0 finished by claim 1; step 1 (a model call) interrupted twice (claims 1 and 2
    died inside it), then failed once at the API (claim 3), then finished by claim 4."""
    turn_id = store.create_turn(session, "hi").turn_id
    epoch = _claim(leases, turn_id)
    _model_step(store, turn_id, epoch, 0, (100, 10))
    store.insert_intent(turn_id, epoch, 1, "model", "llm", {"model": "m-small"}, "safe")
    epoch = _claim(leases, turn_id)  # claim 2: died inside the call too
    epoch = _claim(leases, turn_id)  # claim 3: the API kept failing
    store.note_failed_call(turn_id, epoch)
    assert leases.release(turn_id, epoch, 0.0, "model down (will retry)")
    epoch = _claim(leases, turn_id)  # claim 4 finishes it
    assert epoch == 4
    store.record_outcome(turn_id, epoch, 1, _output(300, 40), durable=False)
    assert leases.finish(turn_id, epoch, "done") is not None
    return turn_id


def test_get_turn_carries_its_ledger(runtime: Runtime, store: JournalStore, leases: Leases) -> None:
    """Billed: each finished call once with its usage. Waste: two interrupted runs of step 1,
    prompt known, completion estimated; the failed run is not waste. Saved: step 0 was read
    back by claims 2, 3 and 4; step 1 by none."""
    clean = runtime.get_turn(_clean_turn(store, leases, "a"))
    crashed = runtime.get_turn(_crashed_turn(store, leases, "b"))

    assert clean.spend is not None and crashed.spend is not None
    assert clean.spend.billed.calls == 2
    assert (clean.spend.billed.prompt_tokens, clean.spend.billed.completion_tokens) == (250, 30)
    assert clean.spend.crash_waste.calls == clean.spend.journal_saved.calls == 0

    s = crashed.spend
    assert (s.billed.calls, s.billed.prompt_tokens, s.billed.completion_tokens) == (2, 400, 50)
    waste = s.crash_waste
    assert (waste.calls, waste.prompt_tokens, waste.completion_tokens) == (2, 600, 80)
    assert s.failed_calls == 1
    saved = s.journal_saved
    assert (saved.calls, saved.prompt_tokens, saved.completion_tokens) == (3, 300, 30)
    assert s.billed.cost is None  # no price table
    data = crashed.as_json()["spend"]
    assert data["crash_waste"]["completion_tokens_estimated"] is True
    assert data["failed_calls_not_billed"] == 1 and data["models"] == ["m-small"]


def test_prices_give_costs_and_a_missing_price_gives_none(
    settings: Settings, store: JournalStore, leases: Leases
) -> None:
    turn_id = _crashed_turn(store, leases, "b")
    priced = Runtime(settings.model_copy(update={"prices": "m-small=1.0/4.0, other=2/2"}))
    unpriced = Runtime(settings.model_copy(update={"prices": "other=2/2"}))
    try:
        spend = priced.get_turn(turn_id).spend
        assert spend is not None
        assert spend.billed.cost == pytest.approx((400 * 1.0 + 50 * 4.0) / 1e6)
        assert spend.crash_waste.cost == pytest.approx((600 * 1.0 + 80 * 4.0) / 1e6)
        assert spend.journal_saved.cost == pytest.approx((300 * 1.0 + 30 * 4.0) / 1e6)
        other = unpriced.get_turn(turn_id).spend
        assert other is not None and other.billed.cost is None
    finally:
        priced.close()
        unpriced.close()


def test_spend_by_turn_agent_and_day(runtime: Runtime, store: JournalStore, leases: Leases) -> None:
    first = _clean_turn(store, leases, "a", agent="billing")
    second = _crashed_turn(store, leases, "b")
    empty = store.create_turn("c", "no calls yet").turn_id

    by_turn = runtime.spend("turn")
    by_agent = runtime.spend("agent")
    by_day = runtime.spend("day")

    assert [s.key for s in by_turn] == [second, first]  # newest first; no calls, no row
    assert {s.key: s.billed.calls for s in by_agent} == {"default": 2, "billing": 2}
    assert {s.key: s.crash_waste.calls for s in by_agent} == {"default": 2, "billing": 0}
    assert len(by_day) == 1 and by_day[0].billed.calls == 4
    assert by_day[0].crash_waste.calls == 2 and by_day[0].journal_saved.calls == 3
    assert runtime.get_turn(empty).spend is not None
    with pytest.raises(InvalidArgument, match="turn, agent, day"):
        runtime.spend("model")
    with pytest.raises(InvalidArgument):
        runtime.spend("turn", limit=0)


def _cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The command with its output piped, as a script reads it: no COLUMNS (pytest-xdist's
    workers set one), so the tables keep every column whole."""
    inherited = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "durable_agent", *args],
        env={**inherited, **settings_env(settings), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_spend_and_turns_json(settings: Settings, store: JournalStore, leases: Leases) -> None:
    """`spend --json`, `spend --by day`, the table with prices, and `turns --json` agree."""
    crashed = _crashed_turn(store, leases, "b")
    prices = {"DURABLE_AGENT_PRICES": "m-small=1/4"}

    as_json = _cli(settings, "spend", "--json", **prices)
    by_day = _cli(settings, "spend", "--by", "day", "--json")
    table = _cli(settings, "spend", **prices)
    turns = _cli(settings, "turns", "--json")
    by_agent = _cli(settings, "spend", "--by", "agent", "--json")
    recent = _cli(settings, "spend", "--since", "1h", "--json")
    future = _cli(settings, "spend", "--since", "2999-01-01T00:00:00+00:00", "--json")
    bad_since = _cli(settings, "spend", "--since", "lately")
    bad = _cli(settings, "spend", "--by", "model")
    bad_price = _cli(settings, "spend", DURABLE_AGENT_PRICES="m-small=cheap")

    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [r["turn_id"] for r in rows] == [crashed]
    assert rows[0]["crash_waste"]["calls"] == 2
    assert rows[0]["cost_usd"] == pytest.approx(0.0006)
    assert json.loads(by_day.stdout)[0]["calls"] == 2
    assert by_agent.returncode == 0, by_agent.stderr
    assert [(r["agent"], r["calls"]) for r in json.loads(by_agent.stdout)] == [("default", 2)]
    assert table.returncode == 0 and crashed in table.stdout and "~680" in table.stdout
    listed = json.loads(turns.stdout)
    assert listed[0]["spend"]["journal_saved"]["calls"] == 3
    assert [r["turn_id"] for r in json.loads(recent.stdout)] == [crashed]
    assert json.loads(future.stdout) == []
    assert bad_since.returncode == 2 and bad_since.stderr.startswith("error: --since takes")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    assert bad_price.returncode == 2
    assert bad_price.stderr.startswith("error:") and "PRICES" in bad_price.stderr.upper()


def test_spend_since_an_age_counts_back_from_the_database_clock(
    settings: Settings, store: JournalStore, leases: Leases, clock: DatabaseClock
) -> None:
    """`spend --since 2h` (and `uncertain --since`) take the age from Postgres's clock, by
    which every recorded time is taken, not from the clock of the machine they run on:
    with the database three hours ahead of this machine, a turn recorded at the database's
    "now" is in `--since 2h` and out of it three hours later (database time)."""
    clock.advance(3 * 3600)
    crashed = _crashed_turn(store, leases, "c")
    now = _cli(settings, "spend", "--since", "2h", "--json")
    assert now.returncode == 0, now.stderr
    assert [r["turn_id"] for r in json.loads(now.stdout)] == [crashed]
    clock.advance(3 * 3600)  # the database's clock: the turn is three hours old now
    later = _cli(settings, "spend", "--since", "2h", "--json")
    assert later.returncode == 0, later.stderr
    assert json.loads(later.stdout) == []
