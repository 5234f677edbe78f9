"""The application's doors: how a program outside the fleet starts, reads and steers turns.

``client`` (start_turn, get_turn, wait_for_turn, stream_turn, send_event, list_events),
``operator`` (cancel, prune, approvals, the uncertain inbox, rekey, the audit trail),
``transaction`` (start_turn(connection=...): the turn recorded in the application's own
transaction) and ``wakes`` (send_event / approve / deny in that transaction). The public
names are exported from :mod:`durable_agent`; import them from there.
"""
