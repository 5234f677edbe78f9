"""The web console: ``durable-agent console --host H --port P`` (extra ``console``).

Named ``web`` because ``console`` is taken: :mod:`durable_agent.cli.console` is the terminal
output of the command line. This package serves the same data as the CLI over HTTP, from the
same calls (the operator API in :mod:`durable_agent.app.operator`, the :class:`Runtime`'s turns,
spend and live stream), as server-rendered pages with one small script (the live timeline):

* :mod:`.auth`: who is asking (basic auth, the login form's cookie, or a bearer token) and
  the cross-site checks of every POST;
* :mod:`.app`: the application, its routes and its security headers;
* :mod:`.pages`: the pages; :mod:`.actions`: approve, deny, resolve, cancel;
* :mod:`.timeline`: a journal row as the turn page shows it; :mod:`.events`: the live
  timeline (server-sent events from ``stream_turn``);
* :mod:`.charts`: the spend charts, SVG drawn on the server;
* :mod:`.serve`: the command, which refuses to start without authentication.

Every asset (templates, the stylesheet, the script) ships in the package: no CDN.
"""
