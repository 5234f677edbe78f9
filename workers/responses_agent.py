"""An agent on the Responses API: the email tools, a reasoning model's items kept.

``DURABLE_AGENT_AGENTS=durable_agent_examples.responses_agent`` and
``start_turn(session, message, agent="mailer")``. The built-in loop sends ``store: false``
(the journal is the conversation) and, because the parameters set ``reasoning``, asks for
each reasoning item's ``encrypted_content``: every item the model returns is journalled and
sent back in the next request's input, so a turn resumed on another worker sends the same
requests.
"""

from __future__ import annotations

from durable_agent import Agent

from .email_tools import list_sent_emails, lookup_note, send_email

mailer = Agent(
    "mailer",
    api="responses",
    tools=[lookup_note, send_email, list_sent_emails],
    parameters={"reasoning": {"effort": "low"}},
    # sessions named "<tenant>:<conversation>": the tenant is the turn's concurrency key
    concurrency_key=lambda session_id: session_id.split(":")[0],
)
