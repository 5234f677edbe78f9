"""Operating turns: what an application or an operator does beside a turn's path.

``cancel`` (stop a turn at a step boundary), ``approvals`` (a tool call that waits for a
person), ``uncertain`` (the inbox of ``never`` calls whose outcome is unknown), ``paging`` (its
hooks), ``retention`` (prune), ``spend`` (the spend ledger), ``live`` (stream a turn's steps,
wait for its end) and ``replay`` (recompute a turn with the model switched off).
Each function takes the stores and callables it uses (the ``OperatorStore``, a
``get_turn``, an ``enqueue``); :mod:`durable_agent.app.operator` and the command line wire them from
a runtime.
"""
