"""DBOS stays out of the main install: ``python -m bench.peers`` there is one clear error,
and ``python -m bench`` runs without it (``make bench-peers`` has its own environment)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("dbos") is not None, reason="dbos is installed here")
def test_bench_peers_without_dbos_is_one_error_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.peers", "--json", "unused.json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "error: dbos is not installed in this environment; run `make bench-peers`"
    ]
    assert not (REPO / "unused.json").exists()


def test_bench_help_names_bench_peers_without_importing_dbos() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from bench.__main__ import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()) as o:\n"
        "    main(['--help'])\n"
        "print('dbos' in sys.modules, 'bench.peers' in sys.modules)\n"
        "print(o.getvalue())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    first, _, help_text = done.stdout.partition("\n")
    assert first == "False False"
    assert "makebench-peers" in "".join(help_text.split())  # argparse wraps at hyphens
