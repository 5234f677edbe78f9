"""Operating turns: what an application or an operator does beside a turn's path.

``cancel`` (stop a turn at a step boundary), ``approvals`` (a tool call that waits for a
person), ``uncertain`` (the inbox of ``never`` calls whose outcome is unknown, and its
hooks), ``retention`` (prune), ``spend`` (the spend ledger), ``live`` (stream a turn's steps,
wait for its end) and ``replay`` (recompute a turn with the model switched off).
"""
