"""The crash matrix of the plan-then-act example loop (``durable-agent eval crash-matrix
--scenario durable_agent_examples.plan_act_scenario:scenario``)."""

from __future__ import annotations

from durable_agent.testing import Scenario, SmtpInbox


def scenario() -> Scenario:
    """The planner agent emails a note; the SMTP test inbox counts the emails."""
    inbox = SmtpInbox()
    return Scenario(
        name="plan-act",
        message="Email the note 'launch' to ada@example.com",
        modules=["durable_agent_examples.email_tools", "durable_agent_examples.plan_act"],
        agent="planner",
        policy="durable_agent_examples.plan_act_policy:plan_email_policy",
        effects={"send_email": lambda: inbox.count},
        services=[inbox],
        env=lambda: {"SMTP_URL": inbox.smtp_url, "INBOX_URL": inbox.api_url},
        reset=inbox.clear,
    )
