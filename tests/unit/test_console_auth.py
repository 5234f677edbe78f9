"""The console's sign-in cookie and form tokens: signed, bound to the user, expiring."""

from __future__ import annotations

import time

import pytest
from starlette.requests import Request

from durable_agent.web import auth as auth_module
from durable_agent.web.auth import SESSION_COOKIE, Authenticator, Identity, same_origin_problem


def request(headers: dict[str, str]) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


def test_a_session_is_signed_by_this_console_and_ends() -> None:
    auth = Authenticator({"ada": "pw"})
    cookie = auth.new_session("ada")
    seen = auth.identify(request({"Cookie": f"{SESSION_COOKIE}={cookie}"}))
    assert seen is not None and (seen.user, seen.how) == ("ada", "session")
    assert Authenticator({"ada": "pw"}).read_session(cookie) is None  # another console's key
    assert Authenticator({"bob": "pw"}).read_session(cookie) is None
    assert auth.read_session(cookie.replace(cookie.split(".")[0], "Ym9i")) is None  # user "bob"


def test_an_expired_session_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = Authenticator({"ada": "pw"})
    cookie = auth.new_session("ada")
    later = time.time() + auth_module.SESSION_SECONDS + 1
    monkeypatch.setattr(auth_module.time, "time", lambda: later)
    assert auth.read_session(cookie) is None


def test_form_tokens_belong_to_one_session() -> None:
    auth = Authenticator({"ada": "pw"})
    one, two = Identity("ada", "session", "s1"), Identity("ada", "session", "s2")
    assert auth.csrf_token(one) != auth.csrf_token(two)
    same = request({"Host": "c.test", "Origin": "http://c.test"})
    assert auth.csrf_problem(same, one, auth.csrf_token(one)) is None
    assert auth.csrf_problem(same, one, auth.csrf_token(two)) is not None
    assert auth.csrf_problem(same, Identity("token", "token"), "") is None


def test_the_origin_or_referer_must_be_this_host() -> None:
    assert same_origin_problem(request({"Host": "c.test", "Referer": "http://c.test/x"})) is None
    assert same_origin_problem(request({"Host": "c.test", "Origin": "http://c.test.evil"}))
    assert same_origin_problem(request({"Host": "c.test"}))


def test_the_console_logins_are_among_the_redacted_secrets() -> None:
    from durable_agent.redact import redact
    from durable_agent.settings import Settings

    Settings(console_auth="ada:Zq9-very-secret-pass", console_token="tok-0123456789abcdefXYZ")
    said = redact("refused Zq9-very-secret-pass, then tok-0123456789abcdefXYZ")
    assert said == "refused ***, then ***"
