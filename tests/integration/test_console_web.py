"""The web console over HTTP against a real Postgres (Starlette's test client): who may
see and do what, cross-site POSTs refused, no credential on any page, the turn list's
filters and pages, the live timeline's events, and what each action records."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from starlette.testclient import TestClient

from durable_agent.journal import Claim, new_key
from durable_agent.runtime import Runtime
from durable_agent.settings import Settings
from durable_agent.web.app import create_app
from durable_agent.web.auth import Authenticator

BASE = "http://console.test"
USER, PASSWORD = "ada", "s3cret-pass"
TOKEN = "tok-0123456789abcdef"
DB_PASSWORD = "hunter2-db-password"  # Postgres trusts this machine: any password connects
API_KEY = "sk-live-abcdef0123456789"
BASIC = {"Authorization": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}
SAME_ORIGIN = {**BASIC, "Origin": BASE}
PAGES = ["/", "/approvals", "/uncertain", "/spend", "/agents", "/workers", "/login"]


@pytest.fixture
def console_runtime(settings: Settings) -> Iterator[Runtime]:
    url = settings.database_url.replace("postgresql://root@", f"postgresql://root:{DB_PASSWORD}@")
    runtime = Runtime(
        settings.model_copy(
            update={
                "database_url": url,
                "openai_api_key": API_KEY,
                "console_auth": f"{USER}:{PASSWORD}",
            }
        )
    )
    yield runtime
    runtime.close()


@pytest.fixture
def client(console_runtime: Runtime) -> TestClient:
    auth = Authenticator(console_runtime.settings.console_logins, TOKEN)
    return TestClient(create_app(console_runtime, auth), base_url=BASE, follow_redirects=False)


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form token"
    return found.group(1)


def claimed_turn(runtime: Runtime, session: str = "s") -> tuple[str, int]:
    turn = runtime.journal.create_turn(session, "hello")
    claim = runtime.leases.claim(turn.turn_id, "host:1:2#tok", 30.0)
    assert isinstance(claim, Claim)
    return turn.turn_id, claim.epoch


def test_nothing_is_shown_without_a_login(client: TestClient) -> None:
    for path in ["/", "/turns/x", "/approvals", "/spend", "/workers", "/turns/x/events"]:
        response = client.get(path)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"].startswith("Basic ")
    browser = client.get("/spend?days=3", headers={"Accept": "text/html"})
    assert (browser.status_code, browser.headers["location"]) == (
        303,
        "/login?next=%2Fspend%3Fdays%3D3",
    )
    wrong = {"Authorization": "Basic " + base64.b64encode(b"ada:nope").decode()}
    assert client.get("/", headers=wrong).status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer not-the-token"}).status_code == 401
    assert client.get("/", headers=BASIC).status_code == 200
    assert client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_no_page_shows_a_credential(client: TestClient, console_runtime: Runtime) -> None:
    turn_id, _ = claimed_turn(console_runtime)
    for path in [*PAGES, f"/turns/{turn_id}", "/nope", "/?status=bogus"]:
        text = client.get(path, headers=BASIC).text
        for secret in (DB_PASSWORD, API_KEY, PASSWORD, TOKEN):
            assert secret not in text, (path, secret)
    assert "root:***@" in client.get("/", headers=BASIC).text


def test_what_turns_carry_is_shown_as_text(client: TestClient, console_runtime: Runtime) -> None:
    turn = console_runtime.journal.create_turn(
        "s", "<script>alert(1)</script> key sk-abcdef0123456789"
    )
    for path in ["/", f"/turns/{turn.turn_id}"]:
        text = client.get(path, headers=BASIC).text
        assert "<script>alert" not in text and "&lt;script&gt;alert(1)" in text


def test_the_login_form_signs_in_and_out(client: TestClient) -> None:
    refused = client.post(
        "/login", data={"user": USER, "password": "wrong"}, headers={"Origin": BASE}
    )
    assert refused.status_code == 401 and "wrong user name or password" in refused.text
    cross = client.post(
        "/login", data={"user": USER, "password": PASSWORD}, headers={"Origin": "http://evil.test"}
    )
    assert cross.status_code == 403 and "set-cookie" not in cross.headers
    signed = client.post(
        "/login",
        data={"user": USER, "password": PASSWORD, "next": "/workers"},
        headers={"Origin": BASE},
    )
    assert (signed.status_code, signed.headers["location"]) == (303, "/workers")
    assert (
        "HttpOnly" in signed.headers["set-cookie"]
        and "SameSite=strict" in signed.headers["set-cookie"]
    )
    page = client.get("/workers")
    assert page.status_code == 200 and ">ada<" in page.text
    cookie = client.cookies["durable_agent_console"]
    client.cookies.clear()
    client.cookies.set(
        "durable_agent_console", cookie[:-2] + ("yy" if cookie.endswith("xx") else "xx")
    )
    assert client.get("/workers").status_code == 401


def test_cross_site_posts_change_nothing(client: TestClient, console_runtime: Runtime) -> None:
    turn_id, _ = claimed_turn(console_runtime)
    token = csrf_of(client.get(f"/turns/{turn_id}", headers=BASIC).text)
    url = f"/turns/{turn_id}/cancel"
    attempts = [
        ({"reason": "x"}, SAME_ORIGIN),  # no form token
        ({"reason": "x", "csrf": "forged"}, SAME_ORIGIN),
        ({"reason": "x", "csrf": token}, {**BASIC, "Origin": "http://evil.test"}),
        ({"reason": "x", "csrf": token}, {**BASIC, "Origin": "null"}),
        ({"reason": "x", "csrf": token}, BASIC),  # neither Origin nor Referer
        ({"reason": "x", "csrf": token}, {**BASIC, "Referer": "http://evil.test/page"}),
    ]
    for form, headers in attempts:
        response = client.post(url, data=form, headers=headers)
        assert response.status_code == 403, (form, headers)
    assert console_runtime.journal.get_turn(turn_id).status == "running"
    with psycopg.connect(console_runtime.settings.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM cancellations").fetchone() == (0,)

    done = client.post(
        url,
        data={"reason": "wrong recipient", "csrf": token, "next": f"/turns/{turn_id}"},
        headers={**BASIC, "Referer": f"{BASE}/turns/{turn_id}"},
    )
    assert done.status_code == 303 and done.headers["location"].startswith(
        f"/turns/{turn_id}?notice="
    )
    with psycopg.connect(console_runtime.settings.database_url) as conn:
        row = conn.execute("SELECT requested_by, reason FROM cancellations").fetchone()
    assert row == (USER, "wrong recipient")
    # a bearer token is never sent by a browser on its own: no form token needed
    again = client.post(url, data={}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert again.status_code == 303


def test_a_mistaken_action_says_why_and_changes_nothing(
    client: TestClient, console_runtime: Runtime
) -> None:
    turn_id, _ = claimed_turn(console_runtime)
    token = csrf_of(client.get(f"/turns/{turn_id}", headers=BASIC).text)
    response = client.post(
        f"/approvals/{turn_id}/3/approve", data={"csrf": token}, headers=SAME_ORIGIN
    )
    assert response.status_code == 400 and "error: " in response.text
    deny = client.post(f"/approvals/{turn_id}/3/deny", data={"csrf": token}, headers=SAME_ORIGIN)
    assert deny.status_code == 400 and "needs a reason" in deny.text
    resolve = client.post(
        f"/uncertain/{turn_id}/0/resolve",
        data={"csrf": token, "verdict": "maybe"},
        headers=SAME_ORIGIN,
    )
    assert resolve.status_code == 400 and "verdict must be one of" in resolve.text
    assert client.get("/?since=yesterday", headers=BASIC).status_code == 400
    assert client.get("/spend?days=0", headers=BASIC).status_code == 400
    assert client.get("/turns/no-such-turn", headers=BASIC).status_code == 404


def test_turns_are_filtered_and_paged_newest_first(
    client: TestClient, console_runtime: Runtime
) -> None:
    store = console_runtime.journal
    made = [
        store.create_turn(f"s{i % 3}", f"m{i}", agent="billing" if i % 2 else "default")
        for i in range(130)
    ]
    newest_first = sorted(made, key=lambda t: (t.created_at, t.turn_id), reverse=True)

    def walk(query: str) -> list[str]:
        seen: list[str] = []
        url: str | None = f"/?{query}"
        while url is not None:
            page = client.get(url, headers=BASIC)
            assert page.status_code == 200, page.text
            seen += re.findall(r'class="turn-link">([^<]+)<', page.text)
            older = re.search(r'href="(/\?[^"]*)" id="older"', page.text)
            url = older.group(1).replace("&amp;", "&") if older else None
        return seen

    assert walk("") == [t.turn_id for t in newest_first]  # 3 pages, nothing twice
    assert walk("agent=billing&session=s1") == [
        t.turn_id for t in newest_first if t.agent == "billing" and t.session_id == "s1"
    ]
    later = (newest_first[9].created_at + timedelta(microseconds=1)).astimezone(UTC)
    assert walk(f"since={later.replace(tzinfo=None).isoformat()}") == [
        t.turn_id for t in newest_first[:9]
    ]
    assert walk("status=done") == []
    assert walk("queue=elsewhere") == []


def test_the_timeline_and_its_live_events(client: TestClient, console_runtime: Runtime) -> None:
    turn_id, epoch = claimed_turn(console_runtime)
    store = console_runtime.journal
    usage = {"prompt_tokens": 12, "completion_tokens": 3}
    for step in (0, 1):
        store.insert_intent(turn_id, epoch, step, "model", "llm", {"n": step}, "safe")
        store.record_outcome(
            turn_id, epoch, step, {"message": {"content": f"s{step}"}, "usage": usage}
        )
    store.insert_intent(turn_id, epoch, 2, "tool", "send_email", {}, "never")
    page = client.get(f"/turns/{turn_id}", headers=BASIC).text
    assert 'id="step-1"' in page and "12 + 3" in page and 'data-live="1"' in page
    # the stream goes on after the last done step: the intent's outcome comes live
    assert 'id="step-2"' in page and f"/turns/{turn_id}/events?after=1" in page
    store.record_outcome(turn_id, epoch, 2, {"content": "sent"})
    assert "host:1:2#tok" in page  # the lease holder
    console_runtime.leases.finish(turn_id, epoch, "all done")

    with client.stream("GET", f"/turns/{turn_id}/events?after=0", headers=BASIC) as events:
        assert events.headers["content-type"].startswith("text/event-stream")
        text = "".join(events.iter_text())
    assert "id: 0\n" not in text and "id: 1\nevent: step\n" in text and "id: 2\n" in text
    assert 'id=\\"step-1\\"' in text and text.rstrip().endswith(
        'event: end\ndata: {"status": "done"}'
    )
    with client.stream(
        "GET", f"/turns/{turn_id}/events", headers={**BASIC, "Last-Event-ID": "2"}
    ) as events:
        resumed = "".join(events.iter_text())
    assert "event: step" not in resumed and "event: end" in resumed
    done = client.get(f"/turns/{turn_id}", headers=BASIC).text
    assert 'data-live="0"' in done and "all done" in done


def test_workers_and_agents_as_postgres_sees_them(
    client: TestClient, console_runtime: Runtime
) -> None:
    for session in ("a", "b"):
        claimed_turn(console_runtime, session)
    workers = client.get("/workers", headers=BASIC).text
    assert "<code>host:1#tok</code>" in workers  # the thread is cut off: one process
    assert re.search(r"host:1#tok</code></td><td class=\"num\">2</td>", workers)
    agents = client.get("/agents", headers=BASIC).text
    assert re.search(r'>default</a></td><td>\(not run yet\)</td>\s*<td class="num">2</td>', agents)


def test_the_spend_chart_is_drawn_on_the_server(
    client: TestClient, console_runtime: Runtime
) -> None:
    turn_id, epoch = claimed_turn(console_runtime)
    store = console_runtime.journal
    store.insert_intent(turn_id, epoch, 0, "model", "llm", {"model": "m"}, "safe")
    store.record_outcome(
        turn_id,
        epoch,
        0,
        {"message": {"content": "x"}, "usage": {"prompt_tokens": 900, "completion_tokens": 100}},
    )
    page = client.get("/spend", headers=BASIC).text
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    assert page.count("<svg") == 2 and f"<title>{today}: 1,000 default</title>" in page
    assert "<title>default: 900 prompt tokens</title>" in page
    assert "<script" not in page


def test_spend_figures_are_read_once_a_minute_and_then_again(console_runtime: Runtime) -> None:
    """A window's figures are kept (the page answers from them), shown once more when
    stale while a thread reads them again, then the new ones are shown."""
    from durable_agent.testing.harness import wait_until
    from durable_agent.web.spend_view import SpendCache

    turn_id, epoch = claimed_turn(console_runtime)
    store = console_runtime.journal

    def call(step: int) -> None:
        store.insert_intent(turn_id, epoch, step, "model", "llm", {"model": "m"}, "safe")
        store.record_outcome(
            turn_id, epoch, step, {"usage": {"prompt_tokens": 10, "completion_tokens": 1}}
        )

    call(0)
    cache = SpendCache(console_runtime, fresh_seconds=3600)
    first = cache.figures(7)
    assert [(s.key, s.billed.calls) for s in first.by_agent] == [("default", 1)]
    assert first.by_day_agent[0].key.endswith(" default")
    call(1)
    assert cache.figures(7) is first  # kept
    cache.fresh_seconds = 0
    assert cache.figures(7) is first  # stale: shown once more, read again meanwhile
    wait_until(lambda: cache.figures(7).by_agent[0].billed.calls == 2, 10, "the new figures")


def test_a_row_that_does_not_open_is_marked_not_a_503(
    client: TestClient, console_runtime: Runtime, settings: Settings
) -> None:
    """The list and the turn page show every turn, a message sealed with a key the console
    lacks or tampered in its place marked (before: 503 for the whole list); a turn nobody
    can read is cancelled from its page."""
    key = new_key()
    sealed_runtime = Runtime(settings.model_copy(update={"keys": f"k1:{key}"}))
    try:
        readable = console_runtime.journal.create_turn("clear", "said in clear")
        sealed = sealed_runtime.journal.create_turn("sealed", "said under k1")
        moved = sealed_runtime.journal.create_turn("moved", "replaced")
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE turns SET message = (SELECT message FROM turns WHERE turn_id = %s) "
                "WHERE turn_id = %s",
                (sealed.turn_id, moved.turn_id),
            )
        listing = client.get("/", headers=BASIC)
        assert listing.status_code == 200, listing.text[:500]
        assert "said in clear" in listing.text and readable.turn_id in listing.text
        assert listing.text.count("[sealed: key k1 unavailable]") == 2
        claim = sealed_runtime.leases.claim(sealed.turn_id, "host:1:2#tok", 30.0)
        assert isinstance(claim, Claim)
        assert sealed_runtime.operator_store.park_for_approval(
            sealed.turn_id, claim.epoch, 0, "send_email", {"to": "ada@example.com"}, None
        )
        page = client.get(f"/turns/{sealed.turn_id}", headers=BASIC)
        assert page.status_code == 200 and "[sealed: key k1 unavailable]" in page.text
        assert "unknown or retired" in page.text  # why, in the mark's title
        assert "Not shown, it does not open here: approvals: turn" in page.text
        # a clear turn whose step a worker with k1 sealed: the live timeline says the step
        # does not open here, once, and the browser stops asking (before: the stream broke
        # and the browser reconnected every second)
        claim = sealed_runtime.leases.claim(readable.turn_id, "host:1:2#tok", 30.0)
        assert isinstance(claim, Claim)
        journal = sealed_runtime.journal.for_claim(readable.turn_id, claim.epoch, empty=True)
        journal.insert_intent(0, "tool", "lookup_note", {"name": "launch"}, "safe")
        journal.record_outcome(0, {"content": "the launch note"})
        journal.flush()
        page = client.get(f"/turns/{readable.turn_id}", headers=BASIC)
        assert page.status_code == 200 and "input [sealed: key k1 unavailable]" in page.text
        live = client.get(f"/turns/{readable.turn_id}/events?after=-1", headers=BASIC)
        assert live.status_code == 200 and "event: unreadable" in live.text, live.text
        assert "step 0 input is sealed with key 'k1'" in live.text

        keyed = TestClient(create_app(sealed_runtime, Authenticator({}, TOKEN)), base_url=BASE)
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        listing = keyed.get("/", headers=bearer)
        assert listing.status_code == 200 and "said under k1" in listing.text
        assert listing.text.count("[does not open: tampered]") == 1
        page = keyed.get(f"/turns/{moved.turn_id}", headers=bearer)
        assert page.status_code == 200 and "[does not open: tampered]" in page.text

        cancelled = client.post(
            f"/turns/{moved.turn_id}/cancel", data={"reason": "unreadable"}, headers=bearer
        )
        assert cancelled.status_code == 303
        assert console_runtime.journal.find_turn(moved.turn_id, marked=True).status == (  # type: ignore[union-attr]
            "cancelled"
        )
    finally:
        sealed_runtime.close()
