"""``python -m durable_agent`` is the ``durable-agent`` command."""

import sys

from .cli import main

sys.exit(main())
