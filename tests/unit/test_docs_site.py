"""The generated pages of the documentation site (docs/hooks.py) cover what they claim to:
every command and option of the CLI, every setting, every benchmark of the results file."""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import Field

import durable_agent.settings
from durable_agent.cli import build_parser
from durable_agent.evals.commands import build_parser as build_evals_parser
from durable_agent.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def commands(
    parser: argparse.ArgumentParser, words: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every (command words, parser) below ``parser``, found by walking argparse's tree."""
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{words} {name}")


def every_command() -> dict[str, argparse.ArgumentParser]:
    found = dict(commands(build_parser(), "durable-agent"))
    # eval and demo parse their own arguments: their options and subcommands count too
    found.update(dict(commands(build_evals_parser(), "durable-agent")))
    return found


def section_of(reference: str, words: str) -> str:
    heading = re.search(rf"^#+ `{re.escape(words)}`$", reference, re.MULTILINE)
    assert heading, f"no section for `{words}` in the CLI reference"
    rest = reference[heading.end() :]
    following = re.search(r"^#+ `", rest, re.MULTILINE)
    return rest[: following.start()] if following else rest


def test_the_cli_reference_has_every_command_and_every_option(hooks: ModuleType) -> None:
    reference = hooks.cli_reference()
    found = every_command()
    assert {"durable-agent eval crash-matrix", "durable-agent demo", "durable-agent cancel"} <= set(
        found
    )
    for words, parser in found.items():
        section = section_of(reference, words)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            names = action.option_strings or [action.metavar or action.dest]
            for name in names:
                assert f"`{name}" in section, f"{words}: {name} is missing from its section"


def test_every_cli_argument_says_what_it_does(hooks: ModuleType) -> None:
    for words, parser in every_command().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            name = action.option_strings or [action.dest]
            assert action.help, f"{words} {name[0]} has no help= (the CLI reference prints it)"


def test_the_configuration_reference_has_every_setting_and_the_other_variables(
    hooks: ModuleType,
) -> None:
    reference = hooks.configuration_reference()
    for name, field in Settings.model_fields.items():
        assert field.description, f"the setting {name} has no description"
        assert f"`DURABLE_AGENT_{name.upper()}`" in reference
        assert field.description.split()[0] in reference
    for alias in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "CRASH_AT"):
        assert f"`{alias}`" in reference
    assert durable_agent.settings.DEFAULT_SYSTEM_PROMPT in reference


def test_a_setting_without_a_description_fails_the_build(
    hooks: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    class WithAnUndescribedSetting(Settings):
        shiny_new_knob: int = Field(default=3)

    monkeypatch.setattr(durable_agent.settings, "Settings", WithAnUndescribedSetting)
    with pytest.raises(hooks.GenerationError, match="shiny_new_knob"):
        hooks.configuration_reference()


def test_the_benchmarks_page_shows_every_benchmark_of_the_results_file(
    hooks: ModuleType,
) -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    bench_markers = {name for name in hooks.GENERATORS if name.startswith("bench-")}
    for name in bench_markers:
        assert f"<!-- generated: {name} -->" in page
        assert hooks.GENERATORS[name]().strip()
    results = hooks.bench_results()
    assert {"journal", "throughput", "resume", "growth", "recovery", "waits"} <= set(results)
    run = hooks.bench_run()
    assert results["run"]["date"] in run
    assert results["machine"]["postgres"] in run
    assert results["machine"]["python"] in run


def test_every_marker_in_the_docs_names_a_generator(hooks: ModuleType) -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        for name in hooks.MARKER.findall(page.read_text()):
            assert name in hooks.GENERATORS, f"{page.relative_to(ROOT)}: unknown marker {name}"


def test_links_of_an_included_root_file_point_at_the_site_pages(hooks: ModuleType) -> None:
    line = (
        "See [the sweeper](docs/guarantees.md#the-sweeper), [README](./README.md), "
        "[x](ARCHITECTURE.md)."
    )
    assert hooks.site_link(line) == (
        "See [the sweeper](guarantees.md#the-sweeper), [README](index.md), [x](architecture.md)."
    )
    untouched = "[a test](tests/unit/test_docs_site.py) and [docs](https://example.org/docs/x)"
    assert hooks.site_link(untouched) == untouched
