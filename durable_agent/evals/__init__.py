"""The evals of the pattern, as commands (``durable-agent eval ...``, ``demo``): the crash
matrix, heed-note, two workers, and the demo. They start real workers on real (or
embedded) Postgres and Redis with the test servers of :mod:`durable_agent.testing`; their
own SQL is in ``sql/``. Needs the ``evals`` extra; nothing the worker or the client runs
imports this package."""
