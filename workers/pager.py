"""An example hook for new uncertain effects (``DURABLE_AGENT_UNCERTAIN_CALLBACK=
durable_agent_examples.pager:page``): appends each one as a JSON line to ``PAGER_FILE``.
A real one would open an incident or a ticket.
"""

from __future__ import annotations

import json
import logging
import os

from durable_agent.operate.uncertain import UncertainEffect

log = logging.getLogger(__name__)


def page(effect: UncertainEffect) -> None:
    """Tell someone: did this call take effect?"""
    line = json.dumps(effect.as_json(), ensure_ascii=False)
    path = os.environ.get("PAGER_FILE")
    if not path:
        log.warning("uncertain effect (set PAGER_FILE to collect them): %s", line)
        return
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")
