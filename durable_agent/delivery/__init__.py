"""Delivery: how a turn reaches a worker and is run there, on Celery.

``celery_app`` (the app, its configuration, the worker's start hooks), ``celery_tasks``
(``run_turn``, ``agent_turn``, ``sweep``), ``doorbell`` (publishing a turn's ids),
``broker`` (the Redis transport), ``poison`` (malformed messages dead-lettered),
``turn_worker`` (one delivery: claim, run, finish), ``heartbeat`` (keeping a claim),
``outage`` (waiting out Postgres) and ``sweeper`` (re-sending turns whose message was lost).
Redis only rings the doorbell; Postgres holds the truth.
"""
