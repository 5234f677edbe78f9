"""Unit tests of the named crash points (CRASH_AT)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from durable_agent import ConfigurationError
from durable_agent.step.faults import Faults, parse


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("4:after_run", (4, "after_run")),
        ("0:before_run", (0, "before_run")),
        (" 12:before_run ", (12, "before_run")),
        ("send_email:after_run", ("send_email", "after_run")),
        ("delivery:before_claim", ("delivery", "before_claim")),
        ("doorbell:after_commit", ("doorbell", "after_commit")),
        ("", None),
        (None, None),
    ],
)
def test_parse_valid_specs(spec: str | None, expected: tuple[int, str] | None) -> None:
    """<step|tool>:<point> parses to a tuple; empty or unset means unarmed."""
    assert parse(spec) == expected


@pytest.mark.parametrize(
    "spec", ["4", "4:", "after_run", "4:during_run", ":before_run", "4:after", "4:AFTER_RUN"]
)
def test_parse_bad_specs(spec: str) -> None:
    """Anything else is a ConfigurationError that quotes the spec and shows the format."""
    with pytest.raises(ConfigurationError) as caught:
        parse(spec)
    assert "CRASH_AT" in str(caught.value)
    assert repr(spec) in str(caught.value)
    assert "before_run|after_run" in str(caught.value)


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faults.from_env reads CRASH_AT; without it nothing is armed."""
    monkeypatch.setenv("CRASH_AT", "3:before_run")
    assert Faults.from_env().armed == (3, "before_run")
    monkeypatch.delenv("CRASH_AT")
    assert Faults.from_env().armed is None


def test_unarmed_and_other_points_are_inert() -> None:
    """maybe_crash returns normally when unarmed or at any other step or point."""
    Faults().maybe_crash(0, "before_run")
    armed = Faults((2, "after_run"))
    armed.maybe_crash(2, "before_run")
    armed.maybe_crash(1, "after_run")
    armed.maybe_crash(3, "after_run")


def test_the_doorbell_point_fires_only_at_the_doorbell() -> None:
    """CRASH_AT=doorbell:after_commit is for an application's commit hook: a worker's steps
    and deliveries pass it by, and an unarmed doorbell returns."""
    armed = Faults(parse("doorbell:after_commit"))
    armed.maybe_crash(0, "before_run", "doorbell")
    armed.maybe_crash_before_claim()
    Faults().maybe_crash_before_doorbell()
    Faults(parse("delivery:before_claim")).maybe_crash_before_doorbell()


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_armed_point_exits_with_code_1_right_there() -> None:
    """At the armed point the process ends with exit code 1; nothing after it runs."""
    result = _run(
        """
        import atexit
        from durable_agent.step.faults import Faults
        atexit.register(lambda: print("ATEXIT RAN", flush=True))
        faults = Faults((4, "after_run"))
        faults.maybe_crash(3, "after_run")
        faults.maybe_crash(4, "before_run")
        print("REACHED THE POINT", flush=True)
        try:
            faults.maybe_crash(4, "after_run")
        finally:
            print("FINALLY RAN", flush=True)
        print("AFTER THE POINT", flush=True)
        """
    )
    assert result.returncode == 1, result.stderr
    assert "REACHED THE POINT" in result.stdout
    assert "AFTER THE POINT" not in result.stdout
    assert "FINALLY RAN" not in result.stdout  # os._exit: no cleanup at all
    assert "ATEXIT RAN" not in result.stdout


def test_tool_name_target_is_inert_for_other_tools() -> None:
    """A point armed for a tool name ignores other tools, and the step number alone."""
    armed = Faults(("send_email", "before_run"))
    armed.maybe_crash(0, "before_run")
    armed.maybe_crash(0, "before_run", "lookup_note")
    armed.maybe_crash(0, "after_run", "send_email")


def test_tool_name_target_exits_at_that_tool() -> None:
    """Armed for a tool name, the process exits with code 1 at that tool's point."""
    result = _run(
        """
        from durable_agent.step.faults import Faults, parse
        faults = Faults(parse("send_email:before_run"))
        faults.maybe_crash(1, "before_run", "lookup_note")
        print("lookup passed", flush=True)
        faults.maybe_crash(2, "before_run", "send_email")
        print("send passed", flush=True)
        """
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == ["lookup passed"]


def test_armed_from_env_in_a_subprocess() -> None:
    """CRASH_AT in the environment arms the point for Faults.from_env()."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from durable_agent.step.faults import Faults\n"
            "f = Faults.from_env()\n"
            "f.maybe_crash(0, 'before_run')\n"
            "print('step 0 done', flush=True)\n"
            "f.maybe_crash(1, 'before_run')\n"
            "print('step 1 done', flush=True)\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_base_env(), "CRASH_AT": "1:before_run"},
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == ["step 0 done"]


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "CRASH_AT"}


def test_a_crash_point_fires_once_per_worker_across_forked_children() -> None:
    """The first forked child to reach the point exits; a child forked after it from the
    same parent (a prefork replacement) is not armed again."""
    result = _run(
        """
        import os
        from durable_agent.step.faults import Faults
        codes = []
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                Faults((0, "before_run")).maybe_crash(0, "before_run")
                os._exit(0)
            codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        print(codes, flush=True)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[1, 0]"
