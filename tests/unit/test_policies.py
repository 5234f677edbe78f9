"""Walk the scripted policies through every conversation state they handle."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durable_agent.testing import (
    POLICIES,
    careless_refund_policy,
    email_policy,
    refund_policy,
)
from durable_agent.testing.model_server import Policy

Message = dict[str, Any]
AMBIGUOUS = "Error: send was interrupted; it may or may not have happened. Check before retrying."
EMAIL_USER: Message = {"role": "user", "content": "Email the note 'launch' to ada@example.com"}
REFUND_USER: Message = {"role": "user", "content": "Refund order A-1001"}


def ask(policy: Policy, messages: list[Message]) -> Message:
    """The policy's answer to a conversation."""
    return policy({"model": "m", "messages": messages})


def only_call(answer: Message) -> tuple[str, dict[str, Any]]:
    """Name and parsed arguments of the answer's single tool call."""
    calls = answer.get("tool_calls")
    assert calls is not None and len(calls) == 1, answer
    return calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"])


def then(messages: list[Message], answer: Message, result: str) -> list[Message]:
    """The conversation after the answer's tool call returned `result` (ids as the server sets)."""
    call = {**answer["tool_calls"][0], "id": f"call_{len(messages)}_0"}
    return [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": result},
    ]


def final(answer: Message) -> str:
    """The text of a final answer (which must have no tool calls)."""
    assert not answer.get("tool_calls"), answer
    assert isinstance(answer["content"], str)
    return answer["content"]


def email_until_send(user: Message = EMAIL_USER) -> tuple[list[Message], Message]:
    messages = [{"role": "system", "content": "You are helpful."}, user]
    lookup = ask(email_policy, messages)
    messages = then(messages, lookup, "Ship it on Friday.")
    return messages, ask(email_policy, messages)


SEND_ARGS = {"to": "ada@example.com", "subject": "Note: launch", "body": "Ship it on Friday."}


# -- email ------------------------------------------------------------------------------


def test_email_happy_path() -> None:
    messages = [EMAIL_USER]
    first = ask(email_policy, messages)
    assert only_call(first) == ("lookup_note", {"name": "launch"})

    messages, send = email_until_send()
    assert only_call(send) == ("send_email", SEND_ARGS)

    done = ask(email_policy, then(messages, send, "Sent (message id <1@x>)"))
    assert final(done) == "Done: the note 'launch' was sent to ada@example.com."


def test_email_checks_the_outbox_after_an_ambiguous_send() -> None:
    messages, send = email_until_send()
    messages = then(messages, send, AMBIGUOUS)
    check = ask(email_policy, messages)
    assert only_call(check) == ("list_sent_emails", {"to": "ada@example.com"})

    found = json.dumps([{"to": "ada@example.com", "subject": "Note: launch"}])
    confirmed = ask(email_policy, then(messages, check, found))
    assert final(confirmed) == ("Done: the note 'launch' was sent to ada@example.com.")

    resend = ask(email_policy, then(messages, check, "[]"))
    assert only_call(resend) == ("send_email", SEND_ARGS)


def test_email_reports_errors() -> None:
    lookup = ask(email_policy, [EMAIL_USER])
    answer = ask(email_policy, then([EMAIL_USER], lookup, "Error: no note named 'launch'"))
    text = final(answer)
    assert "lookup_note" in text
    assert "no note named 'launch'" in text

    messages, send = email_until_send()
    failed = ask(email_policy, then(messages, send, "Error: SMTP 550 mailbox unavailable"))
    assert "550" in final(failed)


def test_email_parses_name_and_address() -> None:
    text = "Please email the note \u201cq3-plan\u201d to bob@corp.example."
    user = {"role": "user", "content": [{"type": "text", "text": text}]}
    assert only_call(ask(email_policy, [user])) == ("lookup_note", {"name": "q3-plan"})
    _, send = email_until_send(user)
    assert only_call(send)[1]["to"] == "bob@corp.example"
    assert only_call(send)[1]["subject"] == "Note: q3-plan"

    bare = {"role": "user", "content": "email note roadmap to eve@example.org"}
    assert only_call(ask(email_policy, [bare])) == ("lookup_note", {"name": "roadmap"})

    vague = {"role": "user", "content": "Send it, please."}
    assert only_call(ask(email_policy, [vague])) == ("lookup_note", {"name": "launch"})
    _, send = email_until_send(vague)
    assert only_call(send)[1]["to"] == "ada@example.com"


def test_email_only_looks_at_the_current_turn() -> None:
    messages, send = email_until_send()
    messages = then(messages, send, "Sent")
    messages += [
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Now email the note 'retro' to cy@example.com"},
    ]
    assert only_call(ask(email_policy, messages)) == ("lookup_note", {"name": "retro"})


def test_policies_are_deterministic() -> None:
    messages, send = email_until_send()
    body = {"model": "m", "messages": then(messages, send, AMBIGUOUS)}
    assert email_policy(body) == email_policy(json.loads(json.dumps(body)))


# -- refunds ----------------------------------------------------------------------------


def order(amount: int = 4200, refunded: int = 0) -> str:
    return json.dumps({"order_id": "A-1001", "amount_cents": amount, "refunded_cents": refunded})


REFUND_ARGS = {"order_id": "A-1001", "amount_cents": 4200}


def refund_until_refund(policy: Policy) -> tuple[list[Message], Message]:
    messages = [REFUND_USER]
    get = ask(policy, messages)
    assert only_call(get) == ("get_order", {"order_id": "A-1001"})
    messages = then(messages, get, order())
    return messages, ask(policy, messages)


def test_refund_happy_path() -> None:
    messages, refund = refund_until_refund(refund_policy)
    assert only_call(refund) == ("refund_order", REFUND_ARGS)
    result = json.dumps({"refund_id": "re_1", "amount_cents": 4200, "replayed": False})
    done = ask(refund_policy, then(messages, refund, result))
    assert final(done) == "Refunded 4200 on order A-1001."


def test_refund_rechecks_the_order_after_an_ambiguous_refund() -> None:
    messages, refund = refund_until_refund(refund_policy)
    messages = then(messages, refund, AMBIGUOUS)
    check = ask(refund_policy, messages)
    assert only_call(check) == ("get_order", {"order_id": "A-1001"})

    done = ask(refund_policy, then(messages, check, order(refunded=4200)))
    assert final(done) == "Order A-1001 is already refunded."

    retry = ask(refund_policy, then(messages, check, order(refunded=0)))
    assert only_call(retry) == ("refund_order", REFUND_ARGS)


def test_careless_refund_retries_without_checking() -> None:
    messages, refund = refund_until_refund(careless_refund_policy)
    assert only_call(refund) == ("refund_order", REFUND_ARGS)
    retry = ask(careless_refund_policy, then(messages, refund, AMBIGUOUS))
    assert only_call(retry) == ("refund_order", REFUND_ARGS)


def test_refund_of_a_refunded_or_partly_refunded_order() -> None:
    get = ask(refund_policy, [REFUND_USER])
    done = ask(refund_policy, then([REFUND_USER], get, order(refunded=4200)))
    assert final(done) == "Order A-1001 is already refunded."

    partial = ask(refund_policy, then([REFUND_USER], get, order(refunded=200)))
    assert only_call(partial) == ("refund_order", {"order_id": "A-1001", "amount_cents": 4000})


@pytest.mark.parametrize(
    "result", ["Error: 409 refund exceeds order amount", '{"error": "refund exceeds order amount"}']
)
def test_refund_reports_errors(result: str) -> None:
    messages, refund = refund_until_refund(refund_policy)
    assert "refund exceeds order amount" in final(
        ask(refund_policy, then(messages, refund, result))
    )


def test_refund_reports_unreadable_orders() -> None:
    get = ask(refund_policy, [REFUND_USER])
    assert "could not read order" in final(ask(refund_policy, then([REFUND_USER], get, "???")))
    other = {"role": "user", "content": "Refund order #B-77 please"}
    assert only_call(ask(refund_policy, [other])) == ("get_order", {"order_id": "B-77"})


def test_policies_registry() -> None:
    assert POLICIES["email"] is email_policy
    assert POLICIES["refund"] is refund_policy
    assert POLICIES["careless-refund"] is careless_refund_policy
    assert len(POLICIES) == 3
