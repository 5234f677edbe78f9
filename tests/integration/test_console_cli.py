"""``durable-agent console``: it refuses to start without a login (one line, exit 2), serves
without one only on loopback when told to, and never prints a password."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

from inprocess import run_cli

from durable_agent.settings import Settings
from durable_agent.testing.harness import settings_env, wait_until


def test_it_refuses_to_start_without_a_login(settings: Settings) -> None:
    result = run_cli(settings, "console", "--port", "1", timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "error: the console needs a login"
    )


def test_no_login_only_on_loopback(settings: Settings) -> None:
    result = run_cli(settings, "console", "--host", "0.0.0.0", "--insecure-no-auth", timeout=30)
    assert result.returncode == 2
    assert result.stderr == (
        "error: --insecure-no-auth serves only a loopback address (127.0.0.1, ::1), not '0.0.0.0'\n"
    )


def test_a_bad_login_setting_is_one_line_that_hides_the_password(settings: Settings) -> None:
    result = run_cli(
        settings, "console", timeout=30, DURABLE_AGENT_CONSOLE_AUTH="ada:pw,bob-without-password"
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        "error: bad setting DURABLE_AGENT_CONSOLE_AUTH: expected USER:PASSWORD"
    )
    assert "pw" not in result.stderr.replace("PASSWORD", "")
    short = run_cli(settings, "console", timeout=30, DURABLE_AGENT_CONSOLE_TOKEN="short")
    assert short.returncode == 2 and "at least 16 characters" in short.stderr


def test_insecure_no_auth_on_loopback_serves_as_anonymous(settings: Settings) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "durable_agent",
            "console",
            "--insecure-no-auth",
            "--port",
            str(port),
        ],
        env={**os.environ, **settings_env(settings)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def page() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/workers", timeout=2) as r:
                    return str(r.read().decode())
            except (urllib.error.URLError, ConnectionError):
                assert process.poll() is None, "the console exited"
                return None

        text = wait_until(page, 30, "the console to answer")
        assert '<span class="user">anonymous</span>' in text
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(10)
