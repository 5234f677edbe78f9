"""Your own loop: the public API every loop, ours included, journals its calls through.

A *loop* is a function that takes a :class:`TurnContext` and returns the reply text::

    def plan_then_act(ctx: TurnContext) -> str:
        plan = ctx.model({"messages": [...], "tools": []})      # step 0, journalled
        for call in parse(plan):
            ctx.tool(call["name"], call["arguments"])           # steps 1, 2, ...
        return ctx.model({"messages": [...]})["message"]["content"]

Name it in an :class:`~durable_agent.Agent` (``Agent("planner", loop=plan_then_act)``) and
the workers run it like the built-in Chat Completions loop
(:func:`durable_agent.step.chat.chat_completions`, written on this same API): every
``ctx.model()`` and ``ctx.tool()`` is one step of the turn, numbered in the order the loop
makes them, and goes through the step runner (:mod:`durable_agent.step.runner`): a finished step
is read back instead of run, an interrupted ``never`` tool is answered with the "may or may
not have happened" text, every write is fenced by the worker's claim, the heartbeat and
the ``CRASH_AT`` points apply.

What a loop must keep to, as ours does: build every request only from what the context
gives (the turn's message, the session's history, the results of earlier steps), never
from the clock or random ids, so that a redelivered turn makes the same calls in the same
order; and call nothing with side effects except through ``ctx.tool()``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..errors import InvalidArgument, ModelRateLimited, TurnFailed
from .tools import ToolRegistry
from .wait_steps import (
    SLEEP,
    EventResult,
    child_reply,
    child_spec,
    event_result,
    event_spec,
    sleep_spec,
)

if TYPE_CHECKING:
    from .runner import StepRunner

ModelCall = Callable[[dict[str, Any]], dict[str, Any]]
Loop = Callable[["TurnContext"], str]
"""A loop: gets the turn's context, makes its calls through it, returns the reply text."""
Api = Literal["chat", "responses"]


class StepTokens(Protocol):
    """Where the text of one attempt of one streamed model call goes as it arrives."""

    def delta(self, text: str) -> None: ...

    def finish(self) -> None: ...

    def abandon(self) -> None: ...


class Reservation(Protocol):
    """A model call's share of its budget (``operate/budgets.py``)."""

    def settle(self, usage: dict[str, Any] | None) -> None: ...

    def rate_limited(self) -> None: ...

    def release(self) -> None: ...


class ModelBudget(Protocol):
    def reserve(self, request: dict[str, Any]) -> Reservation: ...


class BudgetBook(Protocol):
    """The fleet's budgets: the one of a model, or None when it has no limit."""

    def for_model(self, model: str) -> ModelBudget | None: ...


class TokenSink(Protocol):
    """The transport of a turn's tokens (``operate/tokens.py``): ``begin(step)`` marks the
    start of an attempt of that step's model call."""

    def begin(self, step: int) -> StepTokens: ...


_SET_BY_CONTEXT = ("tools",)


@dataclass(frozen=True)
class TurnInput:
    """What a turn starts from: its ids, the user's message and the session's history."""

    turn_id: str
    session_id: str
    message: str
    history: list[tuple[str, str]] = field(default_factory=list)


def initial_messages(
    system_prompt: str, history: list[tuple[str, str]], user_message: str
) -> list[dict[str, Any]]:
    """The conversation before this turn's first model call: the instructions, the
    session's earlier (message, reply) pairs, this turn's message."""
    messages: list[dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    for earlier_message, earlier_reply in history:
        messages.append({"role": "user", "content": earlier_message})
        messages.append({"role": "assistant", "content": earlier_reply})
    messages.append({"role": "user", "content": user_message})
    return messages


class TurnContext:
    """One turn as a loop sees it: the input, the agent's settings, and the two journalled
    calls (``model`` and ``tool``). Built by the worker (or a replay) for each delivery."""

    def __init__(
        self,
        runner: StepRunner,
        *,
        call_model: ModelCall,
        turn: TurnInput,
        agent: str = "default",
        model: str,
        instructions: str,
        tools: ToolRegistry,
        parameters: Mapping[str, Any] | None = None,
        api: Api = "chat",
        streaming: bool = False,
        tokens: TokenSink | None = None,
        budgets: BudgetBook | None = None,
        events: tuple[str, ...] | None = None,
    ) -> None:
        self._runner = runner
        self.events = events  # the agent's declared event names (None: any)
        self._call_model = call_model
        self.api = api
        self.streaming = streaming  # the built-in loops stream when this is set
        self._tokens = tokens
        self._budgets = budgets
        self.turn = turn
        self.agent = agent
        self.model_name = model
        self.instructions = instructions
        self.tools = tools
        self.parameters = dict(parameters or {})

    # -- what the turn starts from ----------------------------------------------------------

    @property
    def turn_id(self) -> str:
        return self.turn.turn_id

    @property
    def session_id(self) -> str:
        return self.turn.session_id

    @property
    def message(self) -> str:
        """This turn's user message."""
        return self.turn.message

    @property
    def history(self) -> list[tuple[str, str]]:
        """(user message, reply) of the session's earlier done turns, in order."""
        return list(self.turn.history)

    @property
    def step(self) -> int:
        """The number the next call will get."""
        return self._runner.next_step

    def messages(self) -> list[dict[str, Any]]:
        """The Chat Completions conversation before the first call: the agent's
        instructions as the system message, the session's history, the user's message."""
        return initial_messages(self.instructions, self.turn.history, self.turn.message)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The agent's tools as a Chat Completions ``tools`` list."""
        return self.tools.openai_schemas()

    # -- the journalled calls ---------------------------------------------------------------

    def model(self, request: Mapping[str, Any], *, stream: bool = False) -> dict[str, Any]:
        """One model call (a step): a Chat Completions request body (``messages``), or for
        an agent on the Responses API a Responses body (``input``), completed with the
        agent's model name, its parameters (``temperature``...) and its tools where the
        request does not set them (``"tools": []`` sends none). Returns the recorded
        response: ``{"message": {"role": "assistant", "content": ..., "tool_calls": [...]},
        "finish_reason": ..., "model": ..., "usage": ...}`` (Responses: also ``output``, the
        items to append to the next call's input).

        ``stream=True`` streams the answer: its text goes to the turn's watchers as it
        arrives (``stream_turn(..., tokens=True)``); the journal records the finished answer
        only, the same as unstreamed."""
        key = "input" if self.api == "responses" else "messages"
        if not isinstance(request, Mapping) or not isinstance(request.get(key), list):
            raise InvalidArgument(f"ctx.model() takes a request with a {key!r} list")
        body: dict[str, Any] = {"model": self.model_name, **self.parameters}
        if self.api == "responses":
            body["store"] = False  # the journal holds the conversation, not the provider
            if self.instructions:
                body["instructions"] = self.instructions
            if "reasoning" in self.parameters:  # reasoning items must come back whole
                body["include"] = ["reasoning.encrypted_content"]
        body.update(request)
        if "tools" not in request:
            schemas = self.tool_schemas()
            if schemas:
                body["tools"] = function_tools(schemas) if self.api == "responses" else schemas
        elif not body["tools"]:
            del body["tools"]  # OpenAI refuses an empty tools list
        call = self._call_model
        if stream:
            body["stream"] = True
            if self._tokens is not None and getattr(call, "streams", False):
                call = self._streamed(self._runner.next_step, self._tokens)
        budget = self._budget_of(body)
        if budget is None:
            return self._runner.model_step(body, call)
        # before the intent is written: a call that waits for budget has not started
        reservation = budget.reserve(body)
        try:
            return self._runner.model_step(body, _settled(call, reservation))
        finally:
            reservation.release()  # nothing when settled: the call was never made

    def _budget_of(self, body: dict[str, Any]) -> ModelBudget | None:
        """The budget this call is taken from (None: no budget, or a step read back)."""
        if self._budgets is None:
            return None
        row = self._runner.recorded.get(self._runner.next_step)
        if row is not None and row.status == "done":
            return None
        return self._budgets.for_model(str(body.get("model")))

    def _streamed(self, step: int, tokens: TokenSink) -> ModelCall:
        call_model: Callable[..., dict[str, Any]] = self._call_model

        def call(body: dict[str, Any]) -> dict[str, Any]:
            attempt = tokens.begin(step)  # only a call that runs: a read-back one is whole
            try:
                response = call_model(body, on_delta=attempt.delta)
            except BaseException:
                attempt.abandon()
                raise
            attempt.finish()
            return response

        return call

    def tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | None = None,
        *,
        call_id: str | None = None,
    ) -> str:
        """Call one of the agent's tools (a step); returns the text the model would read:
        the result, an error, or "may or may not have happened" for an interrupted
        ``never`` tool. A tool the agent does not have, or arguments that fail its schema,
        give an error text and run nothing."""
        if not isinstance(name, str):
            raise InvalidArgument("ctx.tool() takes the tool's name as text")
        if arguments is None:
            arguments = {}
        text = arguments if isinstance(arguments, str) else _json(arguments)
        call = {
            "id": call_id or f"call_{self._runner.next_step}",
            "type": "function",
            "function": {"name": name, "arguments": text},
        }
        return self._runner.tool_step(call)

    def tool_call(self, tool_call: Mapping[str, Any]) -> str:
        """Run a tool call exactly as a Chat Completions answer gave it (with its ``id``)."""
        return self._runner.tool_step(dict(tool_call))

    # -- waits (a step each; the turn parks, holding no worker, until it may go on) ----------

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a step). The due time is fixed when the step is first written:
        a turn delivered again does not restart the clock."""
        self._runner.wait_step(SLEEP, sleep_spec(seconds))

    def wait_for_event(self, name: str, *, timeout: float | None = None) -> EventResult:
        """Wait for the event ``name`` sent to this turn (``send_event``), at most
        ``timeout`` seconds (None: until it comes). An event sent before the wait is kept
        and read here; each event is read by one wait, once."""
        if self.events is not None and name not in self.events:
            raise TurnFailed(
                f"agent {self.agent!r} waits for the event {name!r}, which it does not declare "
                f"(Agent(events=[...]): {', '.join(self.events) or 'none'})"
            )
        output = self._runner.wait_step(f"event:{name}", event_spec(name, timeout))
        return event_result(name, output)

    def run_agent(self, agent: Any, message: str) -> str:
        """Run a turn of another agent (an ``Agent`` or its name) with ``message`` and
        return its reply; raises ChildTurnFailed (a TurnFailed) when the child failed or was
        cancelled. The child may run on another queue and worker; this turn waits parked."""
        name = agent if isinstance(agent, str) else getattr(agent, "name", None)
        if not isinstance(name, str):
            raise InvalidArgument("ctx.run_agent() takes an Agent or an agent's name")
        return child_reply(self._runner.wait_step(f"agent:{name}", child_spec(name, message)))


def function_tools(chat_schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat Completions tool schemas in the Responses form (the function's fields one
    level up)."""
    return [{"type": "function", **schema["function"]} for schema in chat_schemas]


def _settled(call: ModelCall, reservation: Reservation) -> ModelCall:
    def budgeted(body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = call(body)
        except ModelRateLimited:
            reservation.rate_limited()  # the provider says the fleet went too fast
            raise
        reservation.settle(response.get("usage"))
        return response

    return budgeted


def run_loop(loop: Loop, ctx: TurnContext) -> str:
    """Run a loop; its answer must be the reply text."""
    reply = loop(ctx)
    if not isinstance(reply, str):
        raise TurnFailed(
            f"the loop of agent {ctx.agent!r} returned {type(reply).__name__}, not the reply text"
        )
    return reply


# Loops of this package that moved after turns recorded them: a digest keeps the name the
# loop had then, so that a turn in flight across the upgrade is not reported as resumed under
# a changed agent (tests/golden holds turns recorded before the move).
_RECORDED_NAMES = {
    "durable_agent.step.chat:chat_completions": "durable_agent.agent:chat_completions",
}


def loop_name(loop: Loop) -> str:
    """``module:qualname`` of a loop, as recorded in an agent's digest."""
    module = getattr(loop, "__module__", None) or "?"
    name = f"{module}:{getattr(loop, '__qualname__', type(loop).__qualname__)}"
    return _RECORDED_NAMES.get(name, name)


def _json(arguments: Mapping[str, Any]) -> str:
    try:
        return json.dumps(dict(arguments), separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as error:
        raise InvalidArgument(f"ctx.tool() arguments must be JSON values: {error}") from None
