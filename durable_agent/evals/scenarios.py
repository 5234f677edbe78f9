"""The built-in crash-matrix scenarios, written on the same public API as yours.

``email`` (the default of ``durable-agent eval crash-matrix``): look up a note (safe), email
it (never) to the SMTP test inbox, which counts the emails. ``refund``: read an order
(safe), refund it (never) in the payments sandbox, which counts the refunds it executed.
"""

from __future__ import annotations

from ..testing.inbox import SmtpInbox
from ..testing.payments import PaymentsSandbox
from ..testing.scenario import Scenario

EMAIL_MESSAGE = "Email the note 'launch' to ada@example.com"
REFUND_MESSAGE = "Refund order A-1001 in full."


def email() -> Scenario:
    """Email a note; counts the emails the inbox received."""
    inbox = SmtpInbox()
    return Scenario(
        name="email",
        message=EMAIL_MESSAGE,
        modules=["durable_agent_examples.email_tools"],
        policy="email",
        effects={"send_email": lambda: inbox.count},
        services=[inbox],
        env=lambda: {"SMTP_URL": inbox.smtp_url, "INBOX_URL": inbox.api_url},
        reset=inbox.clear,
    )


def refund() -> Scenario:
    """Refund an order; counts the refunds the payments sandbox executed."""
    payments = PaymentsSandbox()
    return Scenario(
        name="refund",
        message=REFUND_MESSAGE,
        modules=["durable_agent_examples.payments_tools"],
        policy="refund",
        effects={"refund_order": lambda: payments.refunds_executed},
        services=[payments],
        env=lambda: {"PAYMENTS_URL": payments.url},
        reset=payments.reset,
    )


BUILT_IN = {
    "email": "durable_agent.evals.scenarios:email",
    "refund": "durable_agent.evals.scenarios:refund",
}
