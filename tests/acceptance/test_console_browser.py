"""The web console in a real browser (Debian's Chromium, headless, driven by Selenium)
against a real worker fleet: sign in, find the turn that waits for an approval, approve
it, watch its timeline fill in while a second worker resumes it after the first died right
after the approved send, resolve the uncertain send, and check the database.

Chromium and its driver are looked for at /usr/bin (``DURABLE_AGENT_CHROMIUM``,
``DURABLE_AGENT_CHROMEDRIVER`` to use others); without them the test fails saying what to
install. ``CONSOLE_SCREENSHOTS=docs/images`` saves the pages this test visits as PNGs there (the
screenshots of docs/how-to/console.md).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

from durable_agent import start_turn
from durable_agent.settings import Settings
from durable_agent.testing.harness import settings_env, wait_until

if TYPE_CHECKING:
    from conftest import Spawn, Stack

pytestmark = pytest.mark.acceptance

USER, PASSWORD = "ada", "correct horse battery staple"
APPROVAL = {"DURABLE_AGENT_APPROVAL_REQUIRED": "send_email"}
CHROMIUM = os.environ.get("DURABLE_AGENT_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("DURABLE_AGENT_CHROMEDRIVER", "/usr/bin/chromedriver")
SHOTS = os.environ.get("CONSOLE_SCREENSHOTS", "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ConsoleProcess:
    """``durable-agent console`` in a process of its own."""

    def __init__(self, settings: Settings, log: Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        command = [sys.executable, "-m", "durable_agent", "console", "--port", str(self.port)]
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                command,
                env={**os.environ, **settings_env(settings), **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def answering(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the console exited: {self.log.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.url}/login", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def console(stack: Stack, tmp_path: Path) -> Iterator[ConsoleProcess]:
    server = ConsoleProcess(
        stack.settings,
        tmp_path / "console.log",
        DURABLE_AGENT_CONSOLE_AUTH=f"{USER}:{PASSWORD}",
        **stack.env,
    )
    try:
        wait_until(server.answering, 30, "the console to answer")
        yield server
    finally:
        server.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium; the test fails, saying what to install, when it is missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.fail(
            f"the console's browser test needs {' and '.join(missing)}: "
            "apt-get install -y chromium chromium-driver",
            pytrace=False,
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shot(driver: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1400, min(max(int(height) + 40, 600), 2400))
        driver.save_screenshot(str(Path(SHOTS) / f"console-{name}.png"))
        driver.set_window_size(1400, 1000)


def rows(driver: Any, table: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [
        r.get_attribute("id") for r in driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr")
    ]


def test_an_operator_approves_watches_and_resolves_in_the_browser(
    stack: Stack, spawn: Spawn, console: ConsoleProcess, browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    def see(condition: Any, what: str, timeout: float = 30) -> Any:
        def report() -> str:
            turn = stack.store.find_turn(turn_id)
            claim = turn and (turn.lease_owner, turn.lease_expires_at, turn.enqueued_at)
            return f"claim, lease end, sent: {claim}\n{stack.report(turn_id)}"

        try:
            return wait_until(condition, timeout, what)
        except TimeoutError as error:
            raise AssertionError(f"{error}\n{report()}") from error

    # a worker that parks the turn for approval, and dies right after the approved send
    spawn(CRASH_AT="send_email:after_run", **APPROVAL)
    turn_id = start_turn("s-console", stack.message, settings=stack.settings)
    see(lambda: stack.store.get_turn(turn_id).status == "waiting", "the turn to park")

    # sign in: the console sends a browser to its login form first
    browser.get(f"{console.url}/?status=waiting")
    assert "/login" in browser.current_url
    browser.find_element(By.ID, "user").send_keys(USER)
    browser.find_element(By.ID, "password").send_keys(PASSWORD)
    browser.find_element(By.ID, "sign-in").click()
    see(lambda: browser.current_url == f"{console.url}/?status=waiting", "the turns page")
    links = browser.find_elements(By.CSS_SELECTOR, "#turns a.turn-link")
    assert [a.text for a in links] == [turn_id]
    shot(browser, "turns")

    # the turn says what it waits for; approve it there
    links[0].click()
    assert (
        "Waits for an approval of send_email (step 3)"
        in browser.find_element(By.ID, "waits-for").text
    )
    assert rows(browser, "timeline") == ["step-0", "step-1", "step-2"]
    shot(browser, "turn-waiting")
    browser.execute_script("window.stillTheSamePage = true")  # gone if the page reloads
    browser.find_element(By.ID, f"approve-{turn_id}-3").click()
    notice = see(lambda: browser.find_elements(By.ID, "notice"), "the approval's notice")
    assert "approved step 3" in notice[0].text
    browser.execute_script("window.stillTheSamePage = true")

    # the first worker sends and dies; a second one resumes while the model is held: the
    # timeline fills in on the open page, without a reload
    wait_until(lambda: stack.subjects() == [stack.subject], 30, "the approved send")
    stack.model.hold()
    spawn(**APPROVAL)

    def uncertain_row_shown() -> bool:
        found = browser.find_elements(By.CSS_SELECTOR, "#step-3.done.uncertain")
        return bool(found)

    # a takeover on this machine takes about a second (the dead holder's claim is ended at
    # the next sweep); the window is wide because the machine is shared
    see(uncertain_row_shown, "step 3 to appear done and uncertain on the open page", 60)
    assert browser.execute_script("return window.stillTheSamePage") is True
    assert browser.find_element(By.ID, "turn-status").text == "running"
    assert browser.find_element(By.ID, "crashes").text == "1"  # the takeover, told live
    shot(browser, "turn-live")
    stack.model.release()
    see(
        lambda: (
            browser.execute_script("return window.stillTheSamePage") is None
            and browser.find_element(By.ID, "turn-status").text == "done"
        ),
        "the page to show the turn done",
    )
    assert rows(browser, "timeline") == [f"step-{n}" for n in range(7)]
    assert browser.find_element(By.ID, "reply").text == stack.clean_reply
    assert browser.find_element(By.ID, "crashes").text == "1"
    shot(browser, "turn-done")

    # the uncertain send is in the inbox: the operator checked the outbox, it happened
    browser.find_element(By.LINK_TEXT, "Uncertain").click()
    see(lambda: browser.find_elements(By.ID, f"verdict-{turn_id}-3"), "the uncertain inbox")
    assert rows(browser, "uncertain") and turn_id in browser.find_element(By.ID, "uncertain").text
    shot(browser, "uncertain")
    Select(browser.find_element(By.ID, f"verdict-{turn_id}-3")).select_by_value("happened")
    note = browser.find_element(
        By.CSS_SELECTOR, f"form[action='/uncertain/{turn_id}/3/resolve'] input[name=note]"
    )
    note.send_keys("one email in the outbox")
    browser.find_element(By.ID, f"resolve-{turn_id}-3").click()
    notice = see(lambda: browser.find_elements(By.ID, "notice"), "the resolution's notice")
    assert "resolved: happened" in notice[0].text
    assert (
        "No uncertain effect waits for a verdict" in browser.find_element(By.ID, "uncertain").text
    )

    for page in ("spend", "agents", "workers", "approvals"):
        browser.find_element(By.LINK_TEXT, page.capitalize()).click()
        address = f"{console.url}/{page}"
        see(lambda a=address: browser.current_url.startswith(a), f"the {page} page")
        assert browser.find_element(By.TAG_NAME, "h1").text == page.capitalize()
        if page in ("agents", "approvals"):  # spend and workers: over 100,000 turns instead
            shot(browser, page)

    # the database: who approved, who resolved, the turn done with one email
    with psycopg.connect(stack.settings.database_url) as conn:
        decided = conn.execute(
            "SELECT step, decision, decided_by FROM approvals WHERE turn_id = %s", (turn_id,)
        ).fetchall()
        resolved = conn.execute(
            "SELECT step, verdict, resolved_by, note FROM resolutions WHERE turn_id = %s",
            (turn_id,),
        ).fetchall()
    assert decided == [(3, "approved", USER)]
    assert resolved == [(3, "happened", USER, "one email in the outbox")]
    turn = stack.store.get_turn(turn_id)
    assert (turn.status, turn.reply, turn.crashes) == ("done", stack.clean_reply, 1)
    assert stack.subjects() == [stack.subject]
