"""The step machinery: how one turn's calls are made and journalled.

``runner`` (the replay table: read back, run again, "may or may not have happened",
record), ``loop`` (the public loop API, :class:`TurnContext`), ``chat`` (the built-in Chat
Completions loop, written on it), ``tools`` (``@tool`` and its replay label), ``agents``
(agent definitions and their digests), ``model`` (the ``openai`` client), ``call_context``
(what a running tool may ask about its call) and ``faults`` (the ``CRASH_AT`` points).
Nothing here knows Celery; the runner knows the journal only through its protocol.
"""
