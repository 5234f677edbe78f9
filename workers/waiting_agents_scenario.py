"""The crash matrix of an agent that delegates, sleeps and waits for an event
(``durable-agent eval crash-matrix --scenario
durable_agent_examples.waiting_agents_scenario:scenario``).

The ``courier`` agent asks the ``research`` agent (a child turn), sleeps, has the event
``go`` sent to itself through the broker and waits for it, then emails the answer: every
wait step is crashed before it parks and right after; the SMTP test inbox counts the emails.
"""

from __future__ import annotations

from durable_agent.testing import Scenario, SmtpInbox


def scenario() -> Scenario:
    """courier: a child agent, a sleep, an event, then one email."""
    inbox = SmtpInbox()
    return Scenario(
        name="waits",
        message="Send the launch note to ada@example.com",
        modules=["durable_agent_examples.email_tools", "durable_agent_examples.waiting_agents"],
        agent="courier",
        policy="durable_agent_examples.waiting_agents_policy:waits_policy",
        effects={"send_email": lambda: inbox.count},
        services=[inbox],
        env=lambda: {"SMTP_URL": inbox.smtp_url, "INBOX_URL": inbox.api_url},
        reset=inbox.clear,
    )
