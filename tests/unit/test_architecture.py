"""The shape of the package: no import cycle, no module over 500 lines.

The layers themselves are import-linter's contracts (``[tool.importlinter]`` in
pyproject.toml, run by ``make lint``). A cycle is checked here with grimp, the graph under
import-linter, which counts the imports inside functions and under ``TYPE_CHECKING`` as
well: a cycle that only shows at type-checking time or on first call is still a cycle in
the design.
"""

from __future__ import annotations

from pathlib import Path

import grimp

import durable_agent

PACKAGE_DIR = Path(durable_agent.__file__).parent
MAX_LINES = 500


def import_cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Every strongly connected group of two or more modules of ``package`` (Tarjan)."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    edges = {
        m: sorted(n for n in graph.find_modules_directly_imported_by(m) if n in modules)
        for m in modules
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(start: str) -> None:
        # iterative, so a deep graph cannot hit the recursion limit
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))

    for module in modules:
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycle_counting_type_only_and_in_function_imports() -> None:
    graph = grimp.build_graph("durable_agent", cache_dir=None)
    assert import_cycles(graph, "durable_agent") == []


def test_the_cycle_finder_sees_type_only_and_in_function_imports() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.low", "p.high", "p.other"):
        graph.add_module(module)
    # p.low imports p.high only under TYPE_CHECKING or inside a function: still a cycle
    graph.add_import(importer="p.high", imported="p.low")
    graph.add_import(importer="p.low", imported="p.high")
    graph.add_import(importer="p.other", imported="p.low")
    assert import_cycles(graph, "p") == [["p.high", "p.low"]]


def test_grimp_counts_type_checking_imports(tmp_path: Path) -> None:
    """The check is only as good as the graph: an import under TYPE_CHECKING and one inside
    a function are both edges in it."""
    import sys

    package = tmp_path / "cyclepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclepkg import b\n"
    )
    (package / "b.py").write_text("def f():\n    from cyclepkg import a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        graph = grimp.build_graph("cyclepkg", cache_dir=None)
    finally:
        sys.path.remove(str(tmp_path))
    assert import_cycles(graph, "cyclepkg") == [["cyclepkg.a", "cyclepkg.b"]]


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE_DIR.parent)): lines
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these modules (at most {MAX_LINES} lines each): {long}"
