"""The timeline benchmark's arithmetic: own times of nested intervals, phases of a delivery."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/ is not installed

from bench.timeline import cut, exclusive


def test_own_time_is_the_length_less_the_direct_children() -> None:
    outer = ("T", "task", "t", 0, 100)
    child = ("T", "sql", "a", 10, 30)
    grandchild = ("T", "redis", "r", 12, 20)
    sibling = ("T", "http", "/v1", 40, 90)
    own = {i[2]: o for i, o in exclusive([sibling, grandchild, outer, child])}
    assert own == {"t": 100 - 20 - 50, "a": 20 - 8, "r": 8, "/v1": 50}


def test_a_delivery_is_cut_into_phases_in_ms() -> None:
    ms = 1_000_000
    submit = ("MainThread", "submit", "ours", 0, 4 * ms)
    app = [submit, ("MainThread", "sql", "insert_turn", 1 * ms, 3 * ms),
           ("MainThread", "redis", "pipeline", 3 * ms, 4 * ms)]  # fmt: skip
    worker = [
        ("MainThread", "message", "message", 5 * ms, 40 * ms),
        ("MainThread", "sql", "record_receipt", 6 * ms, 7 * ms),
        ("MainThread", "task", "run_turn", 8 * ms, 38 * ms),
        ("MainThread", "sql", "claim_turn", 9 * ms, 11 * ms),
        ("MainThread", "http", "/v1/chat/completions", 12 * ms, 20 * ms),
        ("MainThread", "tool", "send_email", 21 * ms, 31 * ms),
        ("MainThread", "sql", "end_turn", 32 * ms, 35 * ms),
        # the ack, from the consumer's loop after the handler returned
        ("MainThread", "ack", "ack", 41 * ms, 42 * ms),
        ("heartbeat", "sql", "renew_lease", 15 * ms, 16 * ms),
    ]
    d = cut(submit, worker, app)
    assert d.phases["submit: SQL"] == 2 and d.phases["submit: Redis"] == 1
    assert d.phases["broker to worker"] == 1
    assert d.phases["Celery before the task: SQL"] == 1
    assert d.phases["Celery before the task: Python"] == 2
    assert d.phases["the task: SQL"] == 5 and d.statements == {"claim_turn": 2, "end_turn": 3}
    assert d.phases["the task: model (HTTP)"] == 8 and d.phases["the task: tools"] == 10
    assert d.phases["the task: Python"] == 30 - 5 - 8 - 10
    assert d.phases["Celery after the task: ack"] == 1
    assert d.phases["Celery after the task: Python"] == 42 - 38 - 1
    assert d.phases["total, submit to the end of the delivery"] == 42
    assert d.other_threads == {"heartbeat": 1}
