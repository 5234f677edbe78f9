"""Telling someone of new uncertain effects: the hooks, each told of each effect once.

``DURABLE_AGENT_UNCERTAIN_TASK`` names a Celery task sent the effect's JSON on
``DURABLE_AGENT_UNCERTAIN_QUEUE`` (hook ``task``); ``DURABLE_AGENT_UNCERTAIN_CALLBACK`` a
``module:function`` called with the :class:`UncertainEffect` (hook ``callback``). Each
sweeper pass calls :func:`notify_new`.

Each hook keeps its own record (``uncertain_notices``, one row per effect and hook): a hook
that raises is asked again at the next pass, and the other, which was told, is not. A pass
claims its notices for a while in a statement of its own, then calls the hooks with no lock
and no transaction open, each call bounded by ``DURABLE_AGENT_UNCERTAIN_HOOK_TIMEOUT_SECONDS``:
a hook that hangs holds up nobody but itself. It is not called again by this process while
the hung call runs; the notices it held are taken by any worker once their claim runs out.

At least once: a worker killed between a hook's call and the record of it, or a hook that
returns after its timeout, means that effect is told again. ``notice_id`` (``<turn>:<step>``,
in the JSON and on the effect) is the same every time: deduplicate pages with it.
"""

from __future__ import annotations

import importlib
import logging
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import ConfigurationError, ServiceUnavailable
from ..journal.holders import worker_identity
from ..journal.operator_store import OperatorStore
from .uncertain import UncertainEffect, effects_of

if TYPE_CHECKING:
    from ..runtime import Runtime

log = logging.getLogger(__name__)

Hook = Callable[[UncertainEffect], None]

_hung: dict[str, threading.Thread] = {}  # "hook=target" -> its call that outlived the timeout
_hung_lock = threading.Lock()


def hooks(runtime: Runtime) -> dict[str, Hook]:
    """The configured hooks by name, ``task`` and ``callback`` (none: nothing is read)."""
    settings = runtime.settings
    found: dict[str, Hook] = {}
    if settings.uncertain_task:
        queue = settings.uncertain_queue or f"{settings.queue}.uncertain"

        def send(effect: UncertainEffect) -> None:
            runtime.celery.send_task(settings.uncertain_task, args=[effect.as_json()], queue=queue)

        found["task"] = send
    if settings.uncertain_callback:
        found["callback"] = _import_callable(settings.uncertain_callback)
    return found


def _import_callable(path: str) -> Hook:
    module_name, _, name = path.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise ConfigurationError(
            f"DURABLE_AGENT_UNCERTAIN_CALLBACK={path}: cannot import it ({error})"
        ) from error
    if not callable(function):
        raise ConfigurationError(f"DURABLE_AGENT_UNCERTAIN_CALLBACK={path} is not callable")
    hook: Hook = function
    return hook


def claim_seconds(timeout: float) -> float:
    """How long a pass holds the notices it claimed: its calls, each bounded, and then some."""
    return 2 * timeout + 5.0


def notify_new(runtime: Runtime, batch: int = 100) -> int:
    """Give each new uncertain effect to each hook; how many (effect, hook) were told."""
    named = hooks(runtime)
    if not named:
        return 0
    settings = runtime.settings
    targets = {"task": settings.uncertain_task, "callback": settings.uncertain_callback}
    keys = {name: f"{name}={targets[name]}" for name in named}
    with _hung_lock:
        for key in [k for k, call in _hung.items() if not call.is_alive()]:
            del _hung[key]
        callable_now = [name for name in named if keys[name] not in _hung]
    if not callable_now:
        return 0
    timeout = runtime.settings.uncertain_hook_timeout_seconds
    owner = f"{worker_identity()}:{uuid.uuid4().hex[:8]}"
    store = OperatorStore(runtime.database)
    claimed = store.claim_uncertain_notices(callable_now, owner, claim_seconds(timeout), batch)
    told = 0
    for turn_id, step, name in claimed:
        if keys[name] in _hung:  # it hung on an earlier effect of this pass: let others take it
            store.release_notice(turn_id, step, name, owner)
            continue
        rows = store.uncertain_effects(turn_id=turn_id, step=step, include_resolved=True, limit=1)
        effects = effects_of(runtime, rows)
        if not effects:  # resolved away or pruned meanwhile: nothing to tell
            store.notice_told(turn_id, step, name)
            continue
        effect = effects[0]
        if _call(keys[name], named[name], effect, timeout):
            store.notice_told(turn_id, step, name)
            told += 1
            log.warning(
                "uncertain effect told to the %s hook: turn %s step %d %s (%s)",
                name,
                effect.turn_id,
                effect.step,
                effect.tool,
                effect.how,
            )
        elif keys[name] not in _hung:  # it raised: asked again at the next pass
            store.release_notice(turn_id, step, name, owner)
    return told


def _call(key: str, hook: Hook, effect: UncertainEffect, timeout: float) -> bool:
    """Call the hook in a thread of its own, waiting at most ``timeout``; True if it
    returned. A call still running then is left to finish (or not) on its own."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            hook(effect)
        except BaseException as error:  # reported below, whatever it is
            failure.append(error)

    name = key.partition("=")[0]
    call = threading.Thread(target=run, name=f"uncertain-{name}-hook", daemon=True)
    call.start()
    call.join(timeout)
    if call.is_alive():
        with _hung_lock:
            _hung[key] = call
        log.warning(
            "the uncertain-effects %s hook did not return within %.1f s (turn %s step %d): "
            "not calling it again from this process until it does; the effect is told again "
            "once its claim runs out",
            name,
            timeout,
            effect.turn_id,
            effect.step,
        )
        return False
    if failure:
        if isinstance(failure[0], ServiceUnavailable):
            log.warning("uncertain effects not told yet (will retry): %s", failure[0])
        else:
            log.warning(
                "the uncertain-effects %s hook raised (will retry at the next pass): %r",
                name,
                failure[0],
            )
        return False
    return True
