"""The replay-aware step: the one function every model call and tool call goes through.

What it does at a recorded step (read back ``done``, run an interrupted model call or
``safe`` tool again, answer an interrupted ``never`` tool with "may or may not have
happened", or write the intent, run and record) is the table of docs/guarantees.md, "What
happens at a recorded step"; that table is the one description of it.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pydantic

from ..errors import ReplayDiverged, StepLimitReached, TurnFailed
from ..journal import (
    MAX_DEPTH,
    ListDigest,
    Replay,
    Step,
    TurnJournal,
    digest,
    dumps,
    jsonb_order,
    storable,
)
from ..redact import redact
from .call_context import CallContext, bind_call
from .faults import Faults
from .observe import StepNote, StepObserver
from .tools import Tool, ToolRegistry
from .wait_steps import Parking

log = logging.getLogger(__name__)

MODEL_STEP_NAME = "llm"
POSSIBLY_RAN = "may or may not have happened"


class Guard(Protocol):
    """Raises LeaseLost once this worker's claim on the turn is gone."""

    def check(self) -> None: ...

    def still_claimed(self) -> bool: ...


class ApprovalGate(Protocol):
    """Before a new tool call runs: raises TurnParked while a person has not decided, returns
    the result the model reads instead of running a denied call, or None to run it (and
    may note the decision in the intent)."""

    def __call__(self, step: int, tool: Tool, intent: dict[str, Any]) -> dict[str, Any] | None: ...


@dataclass
class Divergence:
    step: int
    detail: str


class StepRunner:
    """Numbers the calls of one turn and journals each one (see the module table)."""

    def __init__(
        self,
        journal: TurnJournal,
        *,
        tools: ToolRegistry,
        guard: Guard,
        faults: Faults | None = None,
        max_steps: int = 64,
        strict: bool = False,
        approval_gate: ApprovalGate | None = None,
        parking: Parking | None = None,
        observer: StepObserver | None = None,
    ) -> None:
        self.journal = journal
        self.turn_id = journal.turn_id
        self.tools = tools
        self.guard = guard
        self.faults = faults or Faults()
        self.max_steps = max_steps
        self.strict = strict
        self.approval_gate = approval_gate
        self.parking = parking  # None: this run cannot wait (a replay, a unit test)
        self.observer = observer  # the tracer (step/observe.py), when tracing is on
        self.recorded = {row.step: row for row in journal.steps()}
        self.next_step = 0
        self.read_back: list[int] = []
        self.executed: list[int] = []
        self.divergences: list[Divergence] = []
        self._uncertain_keys: dict[tuple[str, str], str] = {}
        self._conversation = ListDigest()  # the loop appends: hash only what is new
        self._tools_digest: tuple[object, str] | None = None

    # -- model calls -----------------------------------------------------------------------

    def model_step(
        self, request: dict[str, Any], call: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Run (or read back) one model call; returns the recorded response."""
        if self.observer is None:
            return self._model_step(request, call)
        note = StepNote(self.next_step, "model", MODEL_STEP_NAME, "safe", request.get("model"))
        with self.observer.observe(note):
            note.output = self._model_step(request, call)
            note.ran = note.step in self.executed[-1:]
        return note.output

    def _model_step(
        self, request: dict[str, Any], call: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        step = self._take_step()
        # Chat Completions' messages, or the Responses API's input items
        conversation = request["messages"] if "messages" in request else request["input"]
        intent = {
            "model": request.get("model"),
            "messages": len(conversation),
            "messages_sha256": self._conversation.of(conversation),
            "tools_sha256": self._tools_sha256(request.get("tools") or []),
        }
        row = self._recorded(step, "model", MODEL_STEP_NAME)
        if row is not None and row.status == "done":
            if row.input.get("messages_sha256") != intent["messages_sha256"]:
                self._diverged(
                    step,
                    "the conversation sent to the model differs from the recorded one "
                    f"({row.input.get('messages')} messages recorded, {intent['messages']} now; "
                    "did the system prompt or an earlier turn change?)",
                )
            self.read_back.append(step)
            recorded: dict[str, Any] = row.output  # in jsonb's key order, as recorded
            return recorded
        if row is None:
            self.guard.check()
            self.journal.insert_intent(step, "model", MODEL_STEP_NAME, intent, "safe")
        else:
            self.guard.check()
        self.faults.maybe_crash(step, "before_run")
        output = _canonical(call(request))
        self.faults.maybe_crash(step, "after_run")
        self.journal.record_outcome(step, output)
        self.executed.append(step)
        return output

    def _tools_sha256(self, schemas: list[dict[str, Any]]) -> str:
        # The loop sends the same schema list at every model call: hash it once.
        if self._tools_digest is None or self._tools_digest[0] is not schemas:
            self._tools_digest = (schemas, digest(schemas))
        return self._tools_digest[1]

    # -- tool calls ------------------------------------------------------------------------

    def tool_step(self, tool_call: dict[str, Any]) -> str:
        """Run (or read back) one tool call of the model; returns the text the model sees."""
        if self.observer is None:
            return str(self._tool_step(tool_call)["content"])
        name = str((tool_call.get("function") or {}).get("name") or "")
        row, t = self.recorded.get(self.next_step), self.tools.get(name)
        replay = row.replay if row is not None else (t.replay if t is not None else None)
        note = StepNote(self.next_step, "tool", name, replay, None, str(tool_call.get("id") or ""))
        with self.observer.observe(note):
            note.output = self._tool_step(tool_call)
            note.ran = note.step in self.executed[-1:]
        return str(note.output["content"])

    def _tool_step(self, tool_call: dict[str, Any]) -> dict[str, Any]:
        """The recorded output of the call (its ``content`` is what the model sees)."""
        step = self._take_step()
        function = tool_call.get("function") or {}
        name = str(function.get("name") or "")
        call_id = str(tool_call.get("id") or "")
        t = self.tools.get(name)
        if t is not None and t.wait is not None:  # a waiting tool: its call is a wait step
            return self._waiting_tool(step, t, tool_call, call_id)
        row = self._recorded(step, "tool", name)
        if row is not None and row.status == "done":
            self.read_back.append(step)
            self._remember_uncertain(name, row.input, row.output)
            recorded: dict[str, Any] = row.output
            return recorded

        if row is not None and (row.replay == "never" or (t is not None and t.replay == "never")):
            # An interrupted never tool: it may have acted, so it never runs again, even if
            # the tool has since been removed or its schema changed.
            intent = dict(row.input)
            output = _canonical(_uncertain_result(name, intent))
            self.guard.check()
            self.journal.record_outcome(step, output)
            self.executed.append(step)
            self._remember_uncertain(name, intent, output)
            return output

        arguments, problem = _parse_arguments(t, name, tool_call)
        if problem is not None:
            output = _canonical({"content": problem, "error": True})
            intent = _canonical({"arguments": function.get("arguments"), "tool_call_id": call_id})
            self._record_refusal(step, row, name, intent, t.replay if t else None, output)
            return output
        assert t is not None and arguments is not None

        if row is not None:  # an interrupted safe tool: run it again
            intent = dict(row.input)
            self.guard.check()
        else:
            key = self._idempotency_key(step, name, arguments)
            intent = _canonical(
                {"arguments": arguments, "tool_call_id": call_id, "idempotency_key": key}
            )
            self.guard.check()
            if self.approval_gate is not None:  # approvals.py: park, refuse, or go on
                denial = self.approval_gate(step, t, intent)
                if denial is not None:
                    output = _canonical(denial)
                    self._record_refusal(step, None, name, intent, t.replay, output)
                    return output
            self.journal.insert_intent(step, "tool", name, intent, t.replay)
            if t.replay == "never":
                self.guard.check()  # the intent is durable; the claim must still hold to act

        self.faults.maybe_crash(step, "before_run", name)
        output = _canonical(self._invoke(t, step, intent))
        self.faults.maybe_crash(step, "after_run", name)
        self.journal.record_outcome(step, output)
        self.executed.append(step)
        self._remember_uncertain(name, intent, output)
        return output

    # -- waits (step/wait_steps.py) ---------------------------------------------------------------

    def wait_step(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Wait (a step of kind ``wait``): the recorded outcome, or park the turn until it
        comes (TurnParked)."""
        step = self._take_step()
        row = self._recorded(step, "wait", name)
        if row is not None and row.status == "done":
            self.read_back.append(step)
            recorded: dict[str, Any] = row.output
            return recorded
        return self._wait(step, name, row, spec)

    def _waiting_tool(
        self, step: int, t: Tool, tool_call: dict[str, Any], call_id: str
    ) -> dict[str, Any]:
        row = self._recorded(step, "wait", t.name)
        if row is not None and row.status == "done":
            self.read_back.append(step)
            recorded: dict[str, Any] = row.output
            return recorded
        if row is None:
            arguments, problem = _parse_arguments(t, t.name, tool_call)
            spec: dict[str, Any] | None = None
            if arguments is not None and t.wait is not None:
                try:
                    spec = t.wait(arguments)
                except ValueError as error:  # InvalidArgument: a value out of range
                    problem = f"Error: invalid arguments for {t.name}: {error}. Try again."
            if problem is not None or spec is None:
                output = _canonical({"content": problem, "error": True})
                raw = (tool_call.get("function") or {}).get("arguments")
                intent = _canonical({"arguments": raw, "tool_call_id": call_id})
                self.guard.check()
                self.journal.insert_done(step, "wait", t.name, intent, None, output)
                self.executed.append(step)
                return output
            spec = {**spec, "arguments": arguments, "tool_call_id": call_id}
        else:
            spec = {}
        return self._wait(step, t.name, row, spec)

    def _wait(self, step: int, name: str, row: Step | None, spec: dict[str, Any]) -> dict[str, Any]:
        if self.parking is None:
            raise TurnFailed(
                f"turn {self.turn_id} step {step}: {name} waits, and this run cannot park a "
                "turn (a replay or a test journal): run it on a worker"
            )
        self.guard.check()
        if row is None:
            intent = _canonical(self.parking.prepare(step, spec))
            self.journal.insert_intent(step, "wait", name, intent, None)
        else:
            intent = dict(row.input)
        self.faults.maybe_crash(step, "before_run", name)
        parked = lambda: self.faults.maybe_crash(step, "after_run", name)  # noqa: E731
        output = _canonical(self.parking.wait(step, intent, parked))
        self.faults.maybe_crash(step, "after_run", name)
        self.guard.check()
        self.journal.record_outcome(step, output)
        self.executed.append(step)
        return output

    def _invoke(self, t: Tool, step: int, intent: dict[str, Any]) -> dict[str, Any]:
        key = intent.get("idempotency_key")
        context = CallContext(self.turn_id, step, t.name, key, self.guard.still_claimed)
        try:
            with bind_call(context):
                value = t.invoke(intent["arguments"], key)
        except Exception as error:  # a tool's failure is a result the model reads
            log.warning("tool %s raised at step %d of %s: %r", t.name, step, self.turn_id, error)
            text = f"Error: {t.name} raised {type(error).__name__}: {redact(str(error))}"
            if t.replay == "never":
                text += (
                    f". The call {POSSIBLY_RAN}: check the current state before you try it again"
                    f" (idempotency key {key})."
                )
                return {"content": text, "error": True, "uncertain": True}
            return {"content": text, "error": True}
        try:
            text, problems = _as_text(value)
        except Exception as error:  # it ran: what it returned must not leave it at intent
            text = f"{t.name} returned a {type(value).__name__} that could not be recorded"
            problems = [f"the result could not be recorded ({type(error).__name__})"]
        return {"content": text, "sanitized": problems} if problems else {"content": text}

    def _record_refusal(
        self,
        step: int,
        row: Step | None,
        name: str,
        intent: dict[str, Any],
        replay: Replay | None,
        output: dict[str, Any],
    ) -> None:
        self.guard.check()
        if row is None:
            self.journal.insert_done(step, "tool", name, intent, replay, output)
        else:
            self.journal.record_outcome(step, output)
        self.executed.append(step)

    def _idempotency_key(self, step: int, name: str, arguments: dict[str, Any]) -> str:
        """Stable per (turn, step); a retry of an uncertain call reuses that call's key."""
        reused = self._uncertain_keys.get((name, digest(arguments)))
        if reused is not None:
            return reused
        return "da-" + digest([self.turn_id, step])[:40]

    def _remember_uncertain(self, name: str, intent: dict[str, Any], output: Any) -> None:
        if isinstance(output, dict) and output.get("uncertain") and intent.get("idempotency_key"):
            self._uncertain_keys[(name, digest(intent.get("arguments")))] = intent[
                "idempotency_key"
            ]

    # -- bookkeeping -----------------------------------------------------------------------

    def _take_step(self) -> int:
        step = self.next_step
        if step >= self.max_steps:
            raise StepLimitReached(
                f"turn {self.turn_id} reached its limit of {self.max_steps} steps "
                "(DURABLE_AGENT_MAX_STEPS) without a final reply"
            )
        self.next_step += 1
        return step

    def _recorded(self, step: int, kind: str, name: str) -> Step | None:
        row = self.recorded.get(step)
        if row is not None and (row.kind != kind or row.name != name):
            recorded, current = f"{row.kind} {row.name}", f"{kind} {name}"
            raise ReplayDiverged(
                self.turn_id,
                step,
                f"the journal records {recorded!r} but this run calls {current!r}; the code "
                "or the tools changed since this turn started: finish it with the version "
                "that started it",
                recorded=recorded,
                current=current,
            )
        return row

    def _diverged(self, step: int, detail: str) -> None:
        if self.strict:
            raise ReplayDiverged(self.turn_id, step, detail)
        log.warning("turn %s step %d: %s; using the recorded reply", self.turn_id, step, detail)
        self.divergences.append(Divergence(step, detail))


def _parse_arguments(
    t: Tool | None, name: str, tool_call: dict[str, Any]
) -> tuple[dict[str, Any] | None, str | None]:
    """The validated arguments, or the error text the model sees instead."""
    kind = tool_call.get("type", "function")
    if kind != "function":
        return None, (
            f"Error: a tool call of type {str(kind)!r} is not supported here; call one of the "
            "functions you were given."
        )
    raw = (tool_call.get("function") or {}).get("arguments")
    if t is None:
        return (
            None,
            f"Error: there is no tool named {name!r}. Call one of the tools you were given.",
        )
    try:
        parsed = json.loads(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
    except json.JSONDecodeError as error:
        return None, f"Error: the arguments for {name} are not valid JSON ({error.msg}). Try again."
    except ValueError:  # an integer longer than Python reads (4,300 digits)
        return None, (
            f"Error: the arguments for {name} hold a number too long to read "
            f"(more than {sys.get_int_max_str_digits()} digits). Try again."
        )
    except RecursionError:
        return None, f"Error: the arguments for {name} are nested too deeply. Try again."
    if not isinstance(parsed, dict):
        return None, f"Error: the arguments for {name} must be a JSON object. Try again."
    if _depth_over(parsed, MAX_DEPTH):
        return None, (
            f"Error: the arguments for {name} are nested more than {MAX_DEPTH} levels deep. "
            "Try again."
        )
    try:
        recorded, _ = storable(t.recorded_arguments(parsed))
    except pydantic.ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
            for e in error.errors()
        )
        return None, f"Error: invalid arguments for {name}: {problems}. Try again."
    return recorded, None


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` levels (no recursion)."""
    level: list[Any] = [value]
    for _ in range(limit + 1):
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return False
    return True


def _uncertain_result(name: str, intent: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": (
            f"The call {name}({dumps(intent.get('arguments'))}) was interrupted before its outcome "
            f"was recorded: it {POSSIBLY_RAN}. Check the current state before you try it again "
            f"(idempotency key {intent.get('idempotency_key')})."
        ),
        "uncertain": True,
    }


def _canonical(value: dict[str, Any]) -> dict[str, Any]:
    """What is recorded, and what this run goes on with, exactly as a replay will read it
    back: plain JSON values, storable whatever came in (what had to change is listed in
    "sanitized"), keys in jsonb's order (a read-back step is returned as Postgres gives it)."""
    clean, problems = storable(value)
    result: dict[str, Any] = json.loads(dumps(clean))
    if problems:
        log.warning("recording a value that had to be changed: %s", "; ".join(problems))
        result["sanitized"] = sorted(set(result.get("sanitized", [])) | set(problems))
    ordered: dict[str, Any] = jsonb_order(result)
    return ordered


def _as_text(value: Any) -> tuple[str, list[str]]:
    """A tool's result as the text the model reads, and what had to change to store it."""
    if isinstance(value, str):
        return value, []
    clean, problems = storable(value)
    return json.dumps(clean, ensure_ascii=False), problems
