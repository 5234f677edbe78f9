"""The baseline of the throughput benchmark: the same turn as a bare Celery task.

What a team without durable-agent would write: a Celery task (``acks_late``, JSON, prefetch
1, the same broker) that walks the same agent loop with the same ``openai`` client, the same
scripted model and the same example tools (``lookup_note``, ``send_email`` over SMTP), and
keeps nothing anywhere. It counts finished turns in Redis so the benchmark can see them.

    celery -A bench.bare_app worker --pool solo -Q <queue>

Configured from the same ``DURABLE_AGENT_*`` variables as our workers.
"""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import redis
from celery import Celery

from durable_agent.settings import Settings
from durable_agent.step.tools import load_tools

settings = Settings()
app = Celery("bench_bare", set_as_current=False)
app.conf.update(
    broker_url=settings.broker_url,
    task_default_queue=settings.queue,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    result_backend=None,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
)
tools = load_tools(settings.tool_modules)
schemas = tools.openai_schemas()
client = openai.OpenAI(base_url=settings.openai_base_url, api_key="bare", max_retries=0)
counter = redis.Redis.from_url(settings.broker_url)


@app.task(name="bench.bare_turn", acks_late=True, ignore_result=True)
def bare_turn(session_id: str, message: str, run: str) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": settings.system_prompt},
        {"role": "user", "content": message},
    ]
    for step in range(settings.max_steps):
        response = client.chat.completions.create(
            model=settings.model, messages=messages, tools=schemas
        )
        reply = response.choices[0].message
        calls = reply.tool_calls or []
        messages.append(
            {
                "role": "assistant",
                "content": reply.content,
                **({"tool_calls": [c.model_dump() for c in calls]} if calls else {}),
            }
        )
        if not calls:
            break
        for call in calls:
            t = tools.get(call.function.name)
            assert t is not None
            arguments = json.loads(call.function.arguments or "{}")
            result = t.invoke(arguments, f"bare-{session_id}-{step}")
            content = result if isinstance(result, str) else json.dumps(result)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    ended = repr(time.time())
    with counter.pipeline(transaction=False) as count:  # one round trip
        count.hset(f"bench:bare:{run}:ended", session_id, ended)  # each turn's latency
        count.incr(f"bench:bare:{run}")
        count.set(f"bench:bare:{run}:last", ended)
        count.execute()
