"""The crash matrix of the vouchers agent (``durable-agent eval crash-matrix --scenario
giftshop.scenarios:vouchers``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from durable_agent.testing import Scenario


def vouchers() -> Scenario:
    ledger = Path(tempfile.mkdtemp(prefix="giftshop-")) / "ledger.txt"

    def count() -> int:
        return len(ledger.read_text().splitlines()) if ledger.exists() else 0

    return Scenario(
        name="vouchers",
        message="Give customer c-7 a voucher of 2500 cents.",
        modules=["giftshop.tools", "giftshop.agents"],
        agent="vouchers",
        policy="giftshop.policies:vouchers",
        effects={"issue_voucher": count},
        env={"GIFTSHOP_LEDGER": str(ledger)},
        reset=lambda: ledger.unlink(missing_ok=True),
    )
