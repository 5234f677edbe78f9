"""Pages of the documentation site that are produced at build time (an MkDocs hook module).

A page asks for generated text with a marker line of its own, ``<!-- generated: NAME -->``:

* ``cli``: every command and subcommand of ``durable-agent``, read from the argparse parser
  (``durable_agent.cli.build_parser``, and ``durable_agent.evals.commands.build_parser`` for
  ``eval`` and ``demo``, which parse their own arguments);
* ``configuration``: every field of ``durable_agent.settings.Settings`` with its variable,
  type, default, bounds and description, and the variables read outside ``Settings``;
* ``bench-*``: the tables of ``docs/bench-results.json`` (``python -m bench --json``).

So the reference cannot drift from the code: it is the code, printed. An unknown marker, a
setting without a description or a missing results file fails the build.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_RESULTS = ROOT / "docs" / "bench-results.json"
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


class GenerationError(Exception):
    """A generated page cannot be produced; the build stops with this message."""


# -- the mkdocs hook -------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each marker line of a page with the text it names."""
    from mkdocs.exceptions import PluginError

    def expand(match: re.Match[str]) -> str:
        name = match.group(1)
        generate = GENERATORS.get(name)
        if generate is None:
            raise PluginError(
                f"{page.file.src_uri}: unknown generated section {name!r} "
                f"(known: {', '.join(sorted(GENERATORS))})"
            )
        try:
            return generate()
        except GenerationError as error:
            raise PluginError(f"{page.file.src_uri}: {error}") from error

    return MARKER.sub(expand, markdown)


# Files at the repository root that pages include (``--8<-- "ARCHITECTURE.md"``) link as
# they must on GitHub, from the root: ``docs/guarantees.md``, ``README.md``. Included in a
# page under docs/, those links would point nowhere; this rewrites them to the site's pages
# after the snippets are in (the snippets preprocessor runs at priority 32).
ROOT_LINK = re.compile(r"\]\((?:\./)?(docs/|README\.md|ARCHITECTURE\.md)")
SITE_PAGE_OF = {"docs/": "", "README.md": "index.md", "ARCHITECTURE.md": "architecture.md"}


def site_link(line: str) -> str:
    """A line of an included root file with its root-relative links made site-relative."""
    return ROOT_LINK.sub(lambda match: "](" + SITE_PAGE_OF[match.group(1)], line)


def on_config(config: Any) -> Any:
    """Add the Markdown preprocessor that makes included root files' links work here."""
    from markdown import Markdown
    from markdown.extensions import Extension
    from markdown.preprocessors import Preprocessor

    # Python-Markdown ships no type hints: its classes are Any to mypy
    class RootLinks(Preprocessor):  # type: ignore[misc]
        def run(self, lines: list[str]) -> list[str]:
            return [site_link(line) for line in lines]

    class RootLinksExtension(Extension):  # type: ignore[misc]
        def extendMarkdown(self, md: Markdown) -> None:
            md.preprocessors.register(RootLinks(md), "root_links", 31)

    config.markdown_extensions.append(RootLinksExtension())
    return config


# -- shared ----------------------------------------------------------------------------------


def cell(text: object) -> str:
    """Text for one cell of a Markdown table: one line, pipes and angle brackets escaped."""
    flat = " ".join(str(text).split())
    return flat.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# -- the command line ------------------------------------------------------------------------


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, one-line help) of each subcommand of ``parser``, in their order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield choice.dest, action.choices[choice.dest], choice.help or ""


def cli_commands() -> list[tuple[str, argparse.ArgumentParser, str]]:
    """Every command of ``durable-agent``, subcommands included, as (words, parser, help).

    ``eval`` and ``demo`` are parsed by ``durable_agent.evals.commands``, ``model-server`` by
    ``durable_agent.testing``; their parsers come from there, so their options and the evals'
    subcommands are listed too.
    """
    from durable_agent.cli import build_parser
    from durable_agent.evals.commands import build_parser as build_evals_parser
    from durable_agent.testing.__main__ import build_parser as build_test_kit_parser

    handed_on = {name: sub for name, sub, _ in _subcommands(build_evals_parser())}
    # durable-agent model-server is python -m durable_agent.testing model-server
    handed_on.update(
        (name, sub)
        for name, sub, _ in _subcommands(build_test_kit_parser())
        if name == "model-server"
    )
    commands: list[tuple[str, argparse.ArgumentParser, str]] = []

    def walk(words: str, parser: argparse.ArgumentParser, help: str) -> None:
        commands.append((words, parser, help))
        for name, sub, sub_help in _subcommands(parser):
            walk(f"{words} {name}", sub, sub_help)

    commands.append(("durable-agent", build_parser(), ""))
    for name, sub, help in _subcommands(build_parser()):
        walk(f"durable-agent {name}", handed_on.get(name, sub), help)
    return commands


def _usage(parser: argparse.ArgumentParser, words: str) -> str:
    parser.prog = words
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=10_000)
    return parser.format_usage().removeprefix("usage: ").strip()


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    takes_value = action.nargs != 0
    value = ""
    if takes_value:
        if action.choices is not None and action.metavar is None:
            value = " {" + ",".join(str(c) for c in action.choices) + "}"
        else:
            value = f" {action.metavar or action.dest.upper()}"
    return ", ".join(f"`{option}{value}`" for option in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    default = action.default
    if action.nargs == 0 or default in (None, [], argparse.SUPPRESS) or not action.option_strings:
        return ""
    return f"`{default}`"


def _arguments_table(parser: argparse.ArgumentParser) -> str:
    exclusive = {
        id(action): group
        for group in parser._mutually_exclusive_groups
        for action in group._group_actions
    }
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        notes = [action.help or ""] if action.help and action.help != argparse.SUPPRESS else []
        if isinstance(action, argparse._AppendAction) and "repeatable" not in (action.help or ""):
            notes.append("repeatable")
        group = exclusive.get(id(action))
        if group is not None:
            others = [a.option_strings[0] for a in group._group_actions if a is not action]
            required = "one of these is required; " if group.required else ""
            notes.append(f"{required}not with {', '.join(others)}")
        rows.append([_argument(action), cell(_default(action)), cell("; ".join(notes))])
    if not rows:
        return "No arguments."
    return table(["argument", "default", "what it does"], rows)


def cli_reference() -> str:
    """The CLI reference: a section per command, usage, help and arguments."""
    sections = []
    for words, parser, help in cli_commands():
        depth = min(words.count(" ") + 1, 4)
        title = "#" * (depth + 1) + f" `{words}`"
        parts = [title, "", "```text", _usage(parser, words), "```", ""]
        about = help or parser.description or ""
        if about:
            sentence = cell(about[0].upper() + about[1:])
            parts += [sentence if sentence.endswith(".") else sentence + ".", ""]
        parts.append(_arguments_table(parser))
        sections.append("\n".join(parts))
    return "\n\n".join(sections) + "\n"


# -- the configuration -----------------------------------------------------------------------

# Read outside Settings (the worker's fault injection; OpenTelemetry's SDK): one row each,
# kept here.
OTHER_VARIABLES = [
    (
        "CRASH_AT",
        "str",
        "(unset)",
        "`<step or tool>:<before_run or after_run>`, or `delivery:before_claim`: the worker "
        "exits at exactly that point (for the crash matrix and tests; inert when unset), once "
        "per worker (a prefork child that fired is replaced by one that is not armed); a tool "
        "the worker does not have stops its start (exit 2)",
    ),
    (
        "OTEL_*",
        "str",
        "(unset)",
        "with `DURABLE_AGENT_TRACING=true`, OpenTelemetry's own variables say where a worker "
        "exports its spans over OTLP/HTTP: `OTEL_EXPORTER_OTLP_ENDPOINT` (or "
        "`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `OTEL_SERVICE_NAME` (default `durable-agent`), "
        "`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_SCHEDULE_DELAY`, ... (read by the SDK; see "
        "[Traces and metrics](../how-to/observability.md))",
    ),
]
LONG_DEFAULT = 60


def _type_name(annotation: object) -> str:
    """``str``, or ``str, optional`` for ``str | None`` (a pipe would end the table cell)."""
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
        return annotation.__name__
    shown = str(annotation).replace("typing.", "")
    return shown.removesuffix(" | None") + (", optional" if shown.endswith(" | None") else "")


def _bounds(metadata: list[Any]) -> str:
    signs = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}
    found = []
    for constraint in metadata:
        for attribute, sign in signs.items():
            value = getattr(constraint, attribute, None)
            if value is not None:
                found.append(f"{sign} {value:,}")
    return ", ".join(found)


def _shown_default(value: object) -> str:
    if value is None:
        return "(unset)"
    if value == "":
        return "(empty)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{value:g}`"
    return f"`{value}`"


def settings_variables() -> list[tuple[str, list[str], str, str, str, str]]:
    """(field, its environment variables, type, default, bounds, description) per setting."""
    from pydantic import AliasChoices

    from durable_agent.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    rows = []
    for name, field in Settings.model_fields.items():
        if not field.description:
            raise GenerationError(
                f"the setting {name!r} has no description: give its Field a description= "
                "(durable_agent/settings.py), which the configuration reference prints"
            )
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            variables = [str(choice) for choice in alias.choices]
        elif isinstance(alias, str):
            variables = [alias]
        else:
            variables = [f"{prefix}{name}".upper()]
        rows.append(
            (
                name,
                variables,
                _type_name(field.annotation),
                field.get_default(call_default_factory=True),
                _bounds(field.metadata),
                field.description,
            )
        )
    return rows


def configuration_reference() -> str:
    rows = []
    long_defaults = []
    for _, variables, type_name, default, bounds, description in settings_variables():
        shown = _shown_default(default)
        if len(shown) > LONG_DEFAULT:
            long_defaults.append((variables[0], default))
            shown = "(below)"
        rows.append(
            [
                "<br>".join(f"`{v}`" for v in variables),
                re.sub(r"^([^,]+)", r"`\1`", type_name),
                shown,
                cell(bounds),
                cell(description),
            ]
        )
    for variable, type_name, default, description in OTHER_VARIABLES:
        rows.append([f"`{variable}`", f"`{type_name}`", default, "", description])
    parts = [table(["variable", "type", "default", "bounds", "meaning"], rows)]
    for variable, default in long_defaults:
        parts.append(f"The default of `{variable}`:\n\n```text\n{default}\n```")
    return "\n\n".join(parts) + "\n"


# -- the benchmarks --------------------------------------------------------------------------


def bench_results() -> dict[str, Any]:
    try:
        results: dict[str, Any] = json.loads(BENCH_RESULTS.read_text())
    except FileNotFoundError:
        raise GenerationError(
            f"{BENCH_RESULTS.relative_to(ROOT)} is missing: run `make bench` (or `python -m "
            "bench --quick --json docs/bench-results.json` for a quick run)"
        ) from None
    return results


def _section(name: str) -> Any:
    results = bench_results()
    if name not in results:
        raise GenerationError(f"{BENCH_RESULTS.name} has no {name!r} results")
    return results[name]


def _median(samples: list[float]) -> float:
    return statistics.median(samples)


def bench_run() -> str:
    """When, where and how the figures below were measured."""
    results = bench_results()
    machine = results.get("machine", {})
    run = results.get("run", {})
    how = (
        "one repetition of each measure (`--quick`)"
        if run.get("quick")
        else f"{run.get('reps', '?')} repetitions of each journal measure, "
        f"{run.get('runs', '?')} kills per recovery row"
    )
    rows = [
        ["measured", cell(run.get("date", "(not recorded)"))],
        ["CPUs", cell(machine.get("cpus", "?"))],
        ["Python", cell(machine.get("python", "?"))],
        ["PostgreSQL", cell(machine.get("postgres", "?"))],
        ["how", cell(how)],
    ]
    return table(["run", ""], rows) + "\n"


def bench_journal() -> str:
    journal = _section("journal")
    rows = []
    for key, label, unit, digits in (
        ("write_safe_step", "a model or `safe` step (intent + outcome, fenced)", "µs", 0),
        ("write_never_step", "a `never` step (intent and outcome each flushed, fenced)", "µs", 0),
        ("load", "load a 1,000-step journal (`load_journal` vs one raw ordered SELECT)", "ms", 1),
    ):
        measure = journal[key]
        ours, floor = measure["ours"]["median"], measure["baseline"]["median"]
        rows.append(
            [
                label,
                f"{ours:,.{digits}f} {unit}",
                f"{floor:,.{digits}f} {unit}",
                f"**{ours / floor:.2f}x**",
            ]
        )
    leases = journal["leases"]
    rows.append(
        [
            "claim a turn / renew a lease",
            f"{leases['claim_us']['median']:,.0f} µs / {leases['renew_us']['median']:,.0f} µs",
            "",
            "",
        ]
    )
    return table(["measure", "durable-agent", "floor", "ours / floor"], rows) + "\n"


def bench_throughput() -> str:
    section = _section("throughput")
    rows = []
    for config in section["throughput"]:
        ours, bare = _median(config["ours_turns_per_s"]), _median(config["bare_turns_per_s"])
        rows.append(
            [
                cell(config["pool"]),
                str(config["workers"]),
                f"{ours:.1f}",
                f"{bare:.1f}",
                f"{ours / bare:.2f}x",
            ]
        )
    latency = section["latency_ms"]
    ours, bare = _median(latency["ours"]), _median(latency["bare"])
    rounds = len(section["throughput"][0]["ours_turns_per_s"]) if section["throughput"] else 0
    return (
        table(["pool", "workers", "durable-agent", "bare Celery task", "ours / bare"], rows)
        + f"\n\nTurns/s, median of {rounds} round(s). One turn from submit to done (solo pool, "
        f"one worker, median of {len(latency['ours'])}): {ours:.1f} ms against {bare:.1f} ms "
        f"({ours / bare:.2f}x)."
        + (f" Measured {section['date']}, in a run of its own." if section.get("date") else "")
        + "\n"
    )


def bench_resume() -> str:
    rows = []
    for size in _section("resume"):
        steps = size["steps"]
        resume = _median(size["resume_ms"])
        rows.append(
            [
                f"{steps:,}",
                f"{resume:,.1f} ms",
                f"{resume * 1000 / steps:,.0f} µs",
                f"{_median(size['load_ms']):,.1f} ms",
                f"{_median(size['raw_select_ms']):,.1f} ms",
                f"{resume / _median(size['raw_select_ms']):.1f}x",
            ]
        )
    header = ["steps", "resume", "per step", "`load_journal`", "one raw SELECT", "resume / raw"]
    return table(header, rows) + "\n"


def bench_growth() -> str:
    growth = _section("growth")
    rows = [
        [
            f"{size['journal_rows']:,}",
            f"{_median(size['step_us']):,.0f} µs",
            f"{_median(size['claim_us']):,.0f} µs",
            f"{_median(size['sweep_ms']):,.1f} ms",
        ]
        for size in growth["tables"]
    ]
    backlog = [
        [
            f"{b['turns']:,} open turns, "
            + ("all due (never enqueued)" if b["due"] else "all waiting in their queue"),
            f"{_median(b['sweep_ms']):,.1f} ms",
            f"{b['found']:,}",
        ]
        for b in growth["backlog"]
    ]
    return (
        table(["journal rows", "a step (intent + outcome)", "a claim", "the sweeper's query"], rows)
        + "\n\n"
        + table(["backlog", "the sweeper's query", "turns it returns (batch 500)"], backlog)
        + "\n"
    )


def bench_recovery() -> str:
    recovery = _section("recovery")
    rows = []
    for name, series in recovery["series"].items():
        rows.append(
            [
                cell(name),
                f"**{series['median_seconds']:.2f} s**",
                f"{series['min_seconds']:.2f} s",
                f"{series['max_seconds']:.2f} s",
                str(len(series["runs"])),
            ]
        )
    rows.append(
        [
            "Celery alone: Redis' visibility timeout, then kombu's restore (not measured)",
            f"≈ {recovery['celery_only_seconds']:,} s",
            "",
            "",
            "",
        ]
    )
    return (
        table(["the dead worker ran on", "median", "min", "max", "runs"], rows)
        + f"\n\nLease {recovery['lease_seconds']:g} s, a sweep every "
        f"{recovery['sweep_interval_seconds']:g} s (the defaults).\n"
    )


def bench_waits() -> str:
    waits = _section("waits")
    sleep = waits["sleep"]
    events, children = waits["event_to_turn_ms"], waits["child_end_to_parent_ms"]

    def late(key: str) -> str:
        q = sleep[key]
        return f"{q['p50']:.2f} / **{q['p99']:.2f}** / {q['max']:.2f} s"

    def p99(samples: list[float]) -> float:
        ordered = sorted(samples)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]

    idle, busy = sleep["idle_quick_turns_per_s"], sleep["quick_turns_per_s_while_sleeping"]
    rows = [
        [
            "short turns/s on the worker, idle and while they sleep",
            f"{idle:.1f} and {busy:.1f} (**{sleep['rate_ratio']:.2f}x**)",
        ],
        ["messages in Redis for the parked turns", str(sleep["messages_in_redis_while_parked"])],
        ["woken after the due time, p50 / p99 / max", late("woken_late_s")],
        ["resumed after the due time, p50 / p99 / max", late("resumed_late_s")],
        ["done, once each", f"{sleep['done_once']:,} of {sleep['sleepers']:,}"],
        [
            "event sent to the waiting turn's outcome, median / p99",
            f"**{_median(events):.1f}** / {p99(events):.1f} ms ({len(events)} samples)",
        ],
        [
            "child's end to the parent's outcome, median / p99",
            f"**{_median(children):.1f}** / {p99(children):.1f} ms ({len(children)} samples)",
        ],
    ]
    return (
        table(["measure", "figure"], rows)
        + f"\n\nMeasured {waits.get('run', {}).get('date', '(with the run above)')}: "
        f"{sleep['sleepers']:,} turns sleeping {sleep['sleep_seconds']:g} s on one worker "
        f"(prefork, 2 children), a sweep every {sleep['sweep_interval_seconds']:g} s; the goal: "
        f"woken within one sweep interval plus 1 s (p99), events and child ends within "
        f"{waits['goal_latency_ms']:g} ms on an idle worker.\n"
    )


def bench_mcp() -> str:
    """MCP tool calls: the plain MCP client, our tool without the journal, journaled."""
    section = bench_results().get("mcp")
    if section is None:
        return (
            f"Not in the committed run ({BENCH_RESULTS.name} has no `mcp` results yet): "
            "`python -m bench mcp` measures it.\n"
        )
    per_call = section["us_per_call"]
    plain = per_call["plain client"]["median"]
    rows = [
        [way, f"{figures['median']:,.0f} µs", f"{figures['median'] / plain:.2f}x"]
        for way, figures in per_call.items()
    ]
    journal = section["journal_us_per_call"]
    return (
        table(["way", "median per call", "x plain client"], rows)
        + f"\n\nThe journal's cost per call: **{journal['safe']:,.0f} µs** (`safe`), "
        f"**{journal['never']:,.0f} µs** (`never`); {section['reps']} reps of "
        f"{section['calls_per_rep']} calls.\n"
    )


def bench_telemetry() -> str:
    section = _section("telemetry")
    tracing = section["tracing"]
    off, on = tracing["off"]["median"], tracing["on"]["median"]
    rows = [
        [
            f"a {section['steps']}-step turn, real Postgres, in-process model",
            f"{off:.2f} ms",
            f"{on:.2f} ms",
            f"**{tracing['ratio']:.3f}x**",
        ]
    ]
    scrapes = []
    for key in ("scrape_small", "scrape_big"):
        if key in section:
            found = section[key]
            scrapes.append([f"{found['turns']:,}", f"{_median(found['ms']):.1f} ms"])
    return (
        table(["per turn", "tracing off", "tracing on", "on / off"], rows)
        + f"\n\nMedian of {len(tracing['on']['samples'])} alternating repetitions of "
        f"{section['turns_per_rep']} turns each; on: the SDK's batch processor, spans "
        "dropped by its exporter. Metrics cost a turn nothing (nothing is counted on its "
        "path); a scrape of `durable-agent metrics` costs:\n\n"
        + table(["turns in Postgres", "a scrape (median)"], scrapes)
        + "\n"
    )


def bench_sealing() -> str:
    """Encryption at rest: sealed against clear, per step and per resume."""
    sealing = _section("sealing")
    rows = []
    for label, key, unit, fmt in (
        ("a model or `safe` step (intent + outcome)", "step", "us", "{:,.0f} µs"),
        ("control: no key on either side", "control", "us", "{:,.0f} µs"),
    ):
        part = sealing[key]
        clear, sealed = _median(part[f"clear_{unit}"]), _median(part[f"sealed_{unit}"])
        rows.append([label, fmt.format(clear), fmt.format(sealed), f"{sealed / clear:.2f}x"])
    resume = sealing["resume"]
    clear, sealed = _median(resume["clear_ms"]), _median(resume["sealed_ms"])
    rows.append(
        [
            f"resume of {resume['steps'] - 1:,} steps",
            f"{clear:,.1f} ms",
            f"{sealed:,.1f} ms",
            f"{sealed / clear:.2f}x",
        ]
    )
    run = bench_results().get("sealing_run", {})
    when = f" Measured {run['date']}, {run['reps']} repetitions, in a run of its own" if run else ""
    return table(["measure", "clear", "sealed", "sealed / clear"], rows) + (
        f"\n\n{when.strip()} (`python -m bench sealing`).\n" if when else "\n"
    )


def bench_timeline() -> str:
    timeline = _section("timeline")
    rows = [
        [cell(p["phase"]), f"{p['ours_ms']:.2f}", f"{p['bare_ms']:.2f}",
         f"{p['ours_ms'] - p['bare_ms']:+.2f}"]
        for p in timeline["phases"]
    ]  # fmt: skip
    statements = ", ".join(f"`{s['statement']}` {s['ms']:.2f}" for s in timeline["statements"])
    when = timeline.get("date")
    return (
        table(
            [
                "phase (median ms over " + str(timeline["turns"]) + " turns)",
                "durable-agent",
                "bare Celery task",
                "difference",
            ],
            rows,
        )
        + f"\n\nThe task's {timeline['statements_per_turn']:.0f} statements per turn, median ms: "
        + statements
        + (f". Measured {when}, in a run of its own (`python -m bench timeline`)." if when else ".")
        + "\n"
        + _timeline_sequences(timeline.get("sequences") or {})
    )


def _timeline_sequences(sequences: dict[str, list[dict[str, Any]]]) -> str:
    """One delivery of each side (the one of median total), in order."""
    text = ""
    for side, title in (("ours", "durable-agent"), ("bare", "the bare Celery task")):
        rows = [
            [f"{r['at_ms']:.2f}", f"{r['ms']:.2f}" if r["ms"] else "", cell(r["what"])]
            for r in sequences.get(side, [])
        ]
        if rows:
            text += (
                f"\n{title}: the delivery of median total, in order (ms from the submit):\n\n"
                + table(["at", "ms", "what"], rows)
                + "\n"
            )
    return text


def bench_streaming() -> str:
    streaming = _section("streaming")
    first, every = streaming["first_token_ms"], streaming["token_ms"]
    plain, streamed = _median(streaming["plain_ms"]), _median(streaming["streamed_ms"])
    rows = [
        [
            "the first piece: written by the model, then at the watcher",
            f"**{_median(first):.1f} ms**",
            f"{max(first):.1f} ms",
        ],
        ["every piece", f"{_median(every):.1f} ms", f"{max(every):.1f} ms"],
        [
            f"a turn not streamed ({streaming['reply_chars']:,} characters of reply)",
            f"{plain:.1f} ms",
            "",
        ],
        [
            "the same turn streamed, its pieces sent nowhere (the SDK's and the server's part)",
            f"{_median(streaming['streamed_nowhere_ms']):.1f} ms"
            if "streamed_nowhere_ms" in streaming
            else "-",
            "",
        ],
        [
            f"the same turn streamed ({streaming['pieces_per_reply']} pieces through Redis)",
            f"{streamed:.1f} ms",
            f"**{streaming['ratio']:.2f} times** the unstreamed turn",
        ],
    ]
    return table(["measure", "median", "max / ratio"], rows) + "\n"


def bench_budgets() -> str:
    budgets = _section("budgets")
    rows = []
    for name, label in (
        ("budgeted", "the budget, 10,000 tokens a minute"),
        ("unbudgeted", "no budget"),
    ):
        series = budgets.get(name)
        if series is None:
            continue
        rows.append(
            [
                label,
                f"**{series['rate_limited']:,}**",
                f"{series['done']:,} of {budgets['turns']:,}",
                f"{series['failed']:,}",
                f"{series['seconds']:.0f} s",
                f"{series['least_seconds']:.0f} s",
                f"{series['tokens_per_minute']:,.0f}",
            ]
        )
    header = ["", "429s", "done", "failed", "took", "the limit allows", "tokens a minute"]
    text = table(header, rows)
    cost = budgets.get("reserve_us")
    if cost:
        text += (
            f"\n\nOne reservation and its settlement: {cost['redis_lua']:,.0f} µs as a Lua "
            f"script on Redis, {cost['postgres_row']:,.0f} µs as the same bucket in a Postgres "
            "row."
        )
    return text + "\n"


def bench_fairness() -> str:
    fairness = _section("fairness")
    rows = []
    for name, label in (("keyed", "2 per tenant"), ("unkeyed", "no concurrency key")):
        series = fairness.get(name)
        if series is None:
            continue
        rows.append(
            [
                label,
                f"**{series['bolt_first_seconds']:.2f} s** ({series['first_in_turns']:.1f} turns)",
                f"{series['bolt_all_seconds']:.2f} s",
                f"{series['turn_seconds']:.2f} s",
            ]
        )
    header = ["", "the other tenant's first start", "its last start", "one turn"]
    return table(header, rows) + "\n"


def bench_fleet() -> str:
    section = _section("fleet")
    rows = []
    for c in section["fleet"]:
        ours, bare = c["ours"], c["bare"]
        cpu = _median(ours["postgres_cpu_ms_per_step"])
        rows.append(
            [
                f"{c['workers']} x {c['slots_per_worker']}",
                "on" if c["group_commit"] else "off",
                f"{_median(ours['turns_per_s']):.1f}",
                f"{_median(bare['turns_per_s']):.1f}",
                f"**{c['ratio']:.2f}x**",
                f"{ours['latency_ms']['p50']:.0f} / {ours['latency_ms']['p99']:.0f}",
                f"{bare['latency_ms']['p50']:.0f} / {bare['latency_ms']['p99']:.0f}",
                f"{cpu:.3f}",
                f"{1000 / cpu:,.0f}" if cpu > 0 else "n/a",
            ]
        )
    header = ["workers x slots", "group commit", "ours turns/s", "bare turns/s", "ours / bare",
              "ours p50 / p99 ms", "bare p50 / p99 ms", "Postgres CPU ms per step",
              "steps/s per Postgres core"]  # fmt: skip
    when = section.get("date")
    return (
        table(header, rows)
        + f"\n\nThe model answers in {section['model_ms']:.0f} ms."
        + (f" Measured {when}, in a run of its own (`python -m bench fleet`)." if when else "")
        + "\n"
    )


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "configuration": configuration_reference,
    "bench-run": bench_run,
    "bench-journal": bench_journal,
    "bench-throughput": bench_throughput,
    "bench-resume": bench_resume,
    "bench-growth": bench_growth,
    "bench-recovery": bench_recovery,
    "bench-telemetry": bench_telemetry,
    "bench-sealing": bench_sealing,
    "bench-timeline": bench_timeline,
    "scaling-fleet": bench_fleet,
    "bench-streaming": bench_streaming,
    "bench-budgets": bench_budgets,
    "bench-fairness": bench_fairness,
    "bench-waits": bench_waits,
    "bench-mcp": bench_mcp,
}
