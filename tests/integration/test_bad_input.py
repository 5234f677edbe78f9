"""Bad input at every door: one clear error, a typed exception, and nothing changed.

Property-based (Hypothesis) over the Python API (start_turn, get_turn, wait_for_turn) and the
command line, on a real Postgres: whatever values come in, the outcome is a result or an
error from durable-agent's own hierarchy (never a driver's, never one marked retryable when
retrying cannot help), the command line prints no traceback and exits with a documented
code, and a call that fails leaves the database as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_agent import InvalidArgument, TurnNotFound
from durable_agent.cli import main
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings

EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

weird_text = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=st.characters(codec=None, categories=["Cc", "Cs", "Zs"]), max_size=10),
    st.sampled_from(["", " ", "\x00", "\ud800", "a" * 201, "a" * 200, "turn_x", "é" * 150]),
)
any_value = st.one_of(
    weird_text,
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.binary(max_size=10),
    st.lists(st.integers(), max_size=3),
    st.booleans(),
)


def _state(pg: psycopg.Connection) -> tuple[Any, ...]:
    row = pg.execute(
        "SELECT (SELECT count(*) FROM turns), (SELECT count(*) FROM journal), "
        "(SELECT max(updated_at) FROM turns)"
    ).fetchone()
    assert row is not None
    return tuple(row)


@EXAMPLES
@given(session_id=any_value, message=any_value, turn_id=st.one_of(st.none(), any_value))
def test_start_turn_takes_a_turn_or_refuses_with_a_typed_error(
    runtime: Runtime, pg: psycopg.Connection, session_id: Any, message: Any, turn_id: Any
) -> None:
    before = _state(pg)
    try:
        new_id = runtime.start_turn(session_id, message, turn_id=turn_id)
    except InvalidArgument as error:
        assert not error.retryable
        assert _state(pg) == before, "a refused call changed the database"
        return
    assert isinstance(new_id, str)
    assert runtime.get_turn(new_id).message == message


@EXAMPLES
@given(turn_id=any_value, timeout=any_value)
def test_reading_a_turn_refuses_bad_values_with_typed_errors(
    runtime: Runtime, pg: psycopg.Connection, turn_id: Any, timeout: Any
) -> None:
    before = _state(pg)
    for call in (
        lambda: runtime.get_turn(turn_id),
        lambda: runtime.wait_for_turn(turn_id, timeout, poll_seconds=0.01),
    ):
        try:
            call()
        except (InvalidArgument, TurnNotFound) as error:
            assert not error.retryable
        except TimeoutError:
            pass
    assert _state(pg) == before


COMMANDS: dict[str, Callable[[st.DataObject], list[str]]] = {
    "submit": lambda d: [
        "--session",
        d.draw(weird_text),
        *d.draw(st.sampled_from([[], ["--turn-id", d.draw(weird_text)]])),
        d.draw(weird_text),
    ],
    "wait": lambda d: [
        d.draw(weird_text),
        "--timeout",
        d.draw(st.sampled_from(["0", "nan", "-1", "x", "0.01"])),
    ],
    "journal": lambda d: [d.draw(weird_text), *d.draw(st.sampled_from([[], ["--json"]]))],
    "turns": lambda d: [
        *d.draw(st.sampled_from([[], ["--session", d.draw(weird_text)]])),
        "--limit",
        d.draw(st.sampled_from(["1", "0", "-1", "10001", "ten", "99999999999999999999"])),
    ],
    "replay": lambda d: [d.draw(weird_text)],
}


@EXAMPLES
@given(data=st.data(), command=st.sampled_from(sorted(COMMANDS)))
def test_the_command_line_never_shows_a_traceback(
    settings: Settings,
    pg: psycopg.Connection,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    data: st.DataObject,
    command: str,
) -> None:
    monkeypatch.setenv("DURABLE_AGENT_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("DURABLE_AGENT_BROKER_URL", settings.broker_url)
    monkeypatch.setenv("DURABLE_AGENT_QUEUE", settings.queue)
    argv = [command, *COMMANDS[command](data)]
    before = _state(pg)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's usage errors
        code = exit.code if isinstance(exit.code, int) else 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, (argv, err)
    assert code in (0, 1, 2, 3, 4), (argv, code, err)
    if code != 0:
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines and (lines[-1].startswith("error:") or ": error: " in lines[-1]), (argv, err)
        assert _state(pg) == before, (argv, err)


def test_a_turn_id_used_again_with_another_message_is_refused(runtime: Runtime) -> None:
    runtime.start_turn("s", "first", turn_id="turn_mine")
    with pytest.raises(InvalidArgument, match="already used"):
        runtime.start_turn("s", "second", turn_id="turn_mine")
    with pytest.raises(InvalidArgument, match="already used"):
        runtime.start_turn("other", "first", turn_id="turn_mine")
    assert [t.message for t in runtime.list_turns("s")] == ["first"]


def test_a_message_over_the_limit_is_refused_before_it_is_stored(
    settings: Settings, pg: psycopg.Connection
) -> None:
    """A 200 MB message was accepted and then re-sent on every model call."""
    runtime = Runtime(settings.model_copy(update={"max_message_bytes": 1024}))
    before = _state(pg)
    with pytest.raises(InvalidArgument, match="at most 1024"):
        runtime.start_turn("s", "x" * 1025)
    assert _state(pg) == before
    assert runtime.start_turn("s", "x" * 1024)
    runtime.close()


def test_a_20_kb_id_is_not_reported_as_an_outage(runtime: Runtime) -> None:
    """It was 'cannot reach Postgres' (retryable); it is a bad argument (not retryable)."""
    with pytest.raises(InvalidArgument) as caught:
        runtime.get_turn("t" * 20_000)
    assert not caught.value.retryable
