"""verl's own agent loops as bridge sessions: the wrappers the plugin installs (verl 0.9.1).

Per trajectory (``AgentLoopWorker._run_agent_loop``) one ``agent_session``
with verl's identity (``sample`` = sample_index, ``session`` = rollout_n,
``traj`` = 0, ``global_steps`` = step, ``uid`` = the trainer's uid, project and
experiment from verl's ``RolloutTraceConfig``); inside it the loop's ``run`` as
an ``agent_task``, one generate ``agent_turn`` per ``LLMServerClient.generate``
call and one tool ``agent_turn`` per ``ToolAgentLoop._call_tool`` call. The
session gets the reward and verl's timings once the worker computed them.

Inert unless :func:`wanted` (read at each trajectory); honours verl's sampling
(``trace=False`` trajectories make no span). A wrapper never raises into verl:
an instrumentation error is logged once at WARNING and verl's method runs as
if unwrapped. Exceptions of verl's own code pass through unchanged. The one
exception on purpose: a bad bridge setting fails ``AgentLoopWorker.__init__``
(a ``ValueError`` naming key, value and fix), so a run does not start unobserved.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from contextvars import ContextVar
from types import ModuleType
from typing import Any, TypeVar

from verl_otel_bridge import current, propagation
from verl_otel_bridge import protocol as p
from verl_otel_bridge.agent_loop import TaskHandle, TurnHandle
from verl_otel_bridge.bridge import Bridge
from verl_otel_bridge.config import BridgeConfig, parse_bool
from verl_otel_bridge.logs import OnceLogger
from verl_otel_bridge.session import Session
from verl_otel_bridge.verl.config import bridge_config
from verl_otel_bridge.verl.switch import BACKEND, SWITCH_ENV

logger = logging.getLogger(__name__)
_once = OnceLogger(logger)

_T = TypeVar("_T")
Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]

#: Set on each method the plugin replaced (so a class is patched once).
PATCHED = "__verl_otel_bridge_patched__"

#: ``DataProto.meta_info`` key of the trainer's trace context (see :func:`install_agent_loop`).
CARRIER_KEY = "verl_otel_bridge.carrier"
#: Longest the end of ``AgentLoopWorker.generate_sequences`` waits for its spans' export.
FLUSH_TIMEOUT_S = 5.0

# Parameters verl 0.9.1's methods have; another verl version without them is not wrapped.
_EXPECTED: dict[str, tuple[str, ...]] = {
    "AgentLoopWorker.__init__": ("config",),
    "AgentLoopWorker._run_agent_loop": ("sampling_params", "trajectory", "agent_name", "trace"),
    "AgentLoopWorker.generate_sequences": ("batch",),
    "AgentLoopManager.generate_sequences": ("prompts",),
    "AgentLoopBase.__init__": (),
    "ToolAgentLoop._call_tool": ("tool_call", "tools_kwargs", "agent_data"),
    "LLMServerClient.generate": ("request_id", "prompt_ids"),
    "LLMServerClient._acquire_server": ("request_id",),
}


class _Trajectory:
    """What the wrappers of one traced trajectory share (through :data:`_trajectory`)."""

    __slots__ = ("agent_name", "bridge", "in_run", "session", "turns")

    def __init__(self, bridge: Bridge, session: Session, agent_name: str) -> None:
        self.bridge = bridge
        self.session = session
        self.agent_name = agent_name
        self.turns = 0
        self.in_run = False

    def next_turn(self) -> int:
        turn = self.turns
        self.turns += 1
        return turn

    def set(self, values: Mapping[str, Any], span: Any = None) -> None:
        """Set ``values`` (None left out, converted as the bridge converts) on ``span``, default the session's."""
        clean = self.bridge.clean_attributes({k: v for k, v in values.items() if v is not None})
        (span or self.session.span).set_attributes(clean)


_trajectory: ContextVar[_Trajectory | None] = ContextVar("verl_otel_bridge_trajectory", default=None)
_generate_turn: ContextVar[TurnHandle | None] = ContextVar("verl_otel_bridge_generate_turn", default=None)
_traced_calls: ContextVar[list[Bridge] | None] = ContextVar("verl_otel_bridge_traced_calls", default=None)


def wanted(trace_backend: Any) -> bool:
    """Whether to trace: :data:`SWITCH_ENV` on or off decides (read as every on/off variable is, by
    :func:`~verl_otel_bridge.config.parse_bool`); unset, verl's backend must be ``otel``."""
    switch = os.environ.get(SWITCH_ENV, "")
    if switch.strip():
        try:
            return parse_bool(switch)
        except ValueError:
            _once.log(
                "switch", logging.WARNING, "verl tracing: %s=%r is not on or off; it is ignored", SWITCH_ENV, switch
            )
    return bool(trace_backend == BACKEND)


def _verl_backend() -> Any:
    rollout_trace = sys.modules.get("verl.utils.rollout_trace")
    return rollout_trace.RolloutTraceConfig.get_backend() if rollout_trace is not None else None


def _careful(what: str, action: Callable[[], _T], default: _T) -> _T:
    """``action()``, or ``default`` after logging its exception once at WARNING."""
    try:
        return action()
    except Exception as exc:  # noqa: BLE001 - instrumentation must never break verl
        _once.log(f"{what}:{type(exc).__name__}", logging.WARNING, "verl tracing: %s failed: %r", what, exc)
        return default


def _enter(stack: ExitStack, what: str, make: Callable[[], AbstractContextManager[_T]]) -> _T | None:
    return _careful(what, lambda: stack.enter_context(make()), None)


# --------------------------------------------------------------------------- installing


def _recognised(module: ModuleType, target: str) -> bool:
    owner, _, method = target.partition(".")
    try:
        function = getattr(getattr(module, owner), method)
        parameters = inspect.signature(function).parameters
    except (AttributeError, TypeError, ValueError):
        parameters = None
    missing = [p for p in _EXPECTED[target] if parameters is None or p not in parameters]
    if parameters is None or missing:
        version = getattr(sys.modules.get("verl"), "__version__", "?")
        _once.log(
            f"unrecognised:{target}",
            logging.WARNING,
            "verl %s: %s.%s is not the method the verl plugin knows (missing %s); it is not traced",
            version,
            module.__name__,
            target,
            missing or "the method",
        )
        return False
    return True


def _wrap(module: ModuleType, target: str, wrapper: Wrapper) -> bool:
    if not _recognised(module, target):
        return False
    owner, _, method = target.partition(".")
    patch(getattr(module, owner), method, wrapper)
    return True


def patch(owner: type, name: str, wrapper: Wrapper) -> None:
    """Replace ``owner.name`` by a plain function (a coroutine function for a coroutine function) calling
    ``wrapper(original, self, args, kwargs)``; a method already patched is left alone.

    A plain function with the original's ``__module__`` and ``__qualname__`` (not a ``wrapt``
    proxy): Ray pickles an actor class's methods by reference to that name, so an
    ``AgentLoopWorker`` actor runs the patched method of its own process.
    """
    original = vars(owner)[name]
    if getattr(original, PATCHED, False):
        return
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await wrapper(original, self, args, kwargs)

    else:

        @functools.wraps(original)
        def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
            return wrapper(original, self, args, kwargs)

    setattr(patched, PATCHED, True)
    setattr(owner, name, patched)


def install_agent_loop(module: ModuleType) -> None:
    """Wrap ``verl.experimental.agent_loop.agent_loop`` (its worker, manager and loop base class)."""
    if not _wrap(module, "AgentLoopWorker._run_agent_loop", _run_agent_loop):
        return  # without the session nothing else has a place to go
    _wrap(module, "AgentLoopWorker.__init__", _worker_init)
    _wrap(module, "AgentLoopWorker.generate_sequences", _worker_generate_sequences)
    _wrap(module, "AgentLoopManager.generate_sequences", _manager_generate_sequences)
    _wrap(module, "AgentLoopBase.__init__", _loop_init)


def install_tool_agent_loop(module: ModuleType) -> None:
    """Wrap ``ToolAgentLoop._call_tool``, which sees ``BaseTool`` subclasses and function tools alike."""
    _wrap(module, "ToolAgentLoop._call_tool", _call_tool)


def install_llm_server(module: ModuleType) -> None:
    """Wrap ``LLMServerClient.generate`` (one generate turn per call) and ``_acquire_server`` (which server)."""
    _wrap(module, "LLMServerClient.generate", _generate)
    _wrap(module, "LLMServerClient._acquire_server", _acquire_server)


# --------------------------------------------------------------------------- the worker


def _worker_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
    """After verl's ``__init__``: a process with no bridge yet gets one from verl's config and its environment.

    Raises:
        ValueError: a bad ``actor_rollout_ref.rollout.trace.otel_bridge`` setting or
            ``VERL_OTEL_BRIDGE_*`` variable, naming key and fix, so the worker fails at start.
    """
    wrapped(instance, *args, **kwargs)
    if current.current_bridge() is not None:
        return
    if not _careful("reading the backend", lambda: wanted(_verl_backend()), False):
        return
    try:
        config = bridge_config(instance.config)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - a config shape we do not know: the environment alone decides
        _once.log(
            "from_verl", logging.WARNING, "verl tracing: reading verl's config failed (%r); using the environment", exc
        )
        config = BridgeConfig.resolve()
    current.configure(config)


async def _worker_generate_sequences(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """Continue the trainer's trace (when it sent one) and export this call's spans before returning."""
    batch = args[0] if args else kwargs.get("batch")
    carrier = _careful("reading the carrier", lambda: batch.meta_info.pop(CARRIER_KEY, None), None)
    traced: list[Bridge] = []
    token = _traced_calls.set(traced)
    try:
        with ExitStack() as stack:
            if carrier:
                _enter(stack, "attach", lambda: propagation.attach(carrier))
            output = await wrapped(instance, *args, **kwargs)
    finally:
        _traced_calls.reset(token)
    for bridge in {id(b): b for b in traced}.values():
        # Ray ends AgentLoopWorker actors without atexit: what is queued at the end would be lost.
        await asyncio.get_running_loop().run_in_executor(None, bridge.force_flush, FLUSH_TIMEOUT_S)
    return output


def _manager_generate_sequences(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """On the trainer: hand the current span (if any) to the workers, so their sessions are its children.

    Not a coroutine function: verl's method is ``auto_await`` (sync from sync code), so the
    wrapper returns whatever it returns.
    """

    def send() -> None:
        if not wanted(instance.config.actor_rollout_ref.rollout.trace.get("backend")):
            return
        carrier = propagation.inject()
        if carrier:
            prompts = args[0] if args else kwargs["prompts"]
            prompts.meta_info[CARRIER_KEY] = carrier

    _careful("sending the trace context", send, None)
    return wrapped(instance, *args, **kwargs)


async def _run_agent_loop(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    with ExitStack() as stack:
        trajectory = _careful("starting the session", lambda: _start(stack, args, kwargs), None)
        output = await wrapped(instance, *args, **kwargs)
        if trajectory is not None:
            _careful("recording the trajectory", lambda: _finish(trajectory, output), None)
        return output


def _start(stack: ExitStack, args: Any, kwargs: Any) -> _Trajectory | None:
    if not kwargs.get("trace", True) or not wanted(_verl_backend()):
        return None
    info = args[1] if len(args) > 1 else kwargs["trajectory"]
    bridge = current.get_bridge()
    if not bridge.enabled:
        return None
    from verl.utils.rollout_trace import RolloutTraceConfig

    trace_config = RolloutTraceConfig.get_instance()
    agent_name = str(kwargs.get("agent_name"))
    session = stack.enter_context(
        bridge.session(
            sample=info["sample_index"],
            session=info["rollout_n"],
            traj=0,
            uid=kwargs.get("uid"),
            global_steps=int(info["step"]),
            project=trace_config.project_name,
            experiment_name=trace_config.experiment_name,
        )
    )
    trajectory = _Trajectory(bridge, session, agent_name)
    trajectory.set({p.VALIDATE: bool(info["validate"]), p.AGENT_NAME: agent_name, p.GEN_AI_AGENT_NAME: agent_name})
    stack.callback(_trajectory.reset, _trajectory.set(trajectory))
    traced = _traced_calls.get()
    if traced is not None:
        traced.append(bridge)
    return trajectory


def _finish(trajectory: _Trajectory, output: Any) -> None:
    metrics = output.metrics
    reward_extra_info = output.extra_fields.get("reward_extra_info")
    trajectory.set(
        {
            p.REWARD_SCORE: output.reward_score,
            p.REWARD_EXTRA_INFO: reward_extra_info,
            p.NUM_TURNS: output.num_turns,
            **{key: getattr(metrics, key.removeprefix(p.VERL_METRIC_PREFIX), None) for key in p.VERL_METRICS},
        }
    )
    trajectory.session.finish(
        status="success",
        trajectories=[{p.CHAIN_ID: 0, p.REWARD_SCORE: output.reward_score, p.NUM_TURNS: output.num_turns}],
        runner_name=trajectory.agent_name,
        finished=True,
    )


# --------------------------------------------------------------------------- the loops


def _loop_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
    """After ``AgentLoopBase.__init__``: wrap the ``run`` of this loop's class (once per class)."""
    wrapped(instance, *args, **kwargs)
    _careful("wrapping the loop's run", lambda: _wrap_run(type(instance)), None)


def _wrap_run(cls: type) -> None:
    owner = next((klass for klass in cls.__mro__ if "run" in vars(klass)), None)
    if owner is not None:
        patch(owner, "run", _run)


async def _run(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    trajectory = _trajectory.get()
    if trajectory is None or trajectory.in_run:  # untraced, or a subclass's run calling super().run()
        return await wrapped(instance, *args, **kwargs)
    trajectory.in_run = True
    try:
        with ExitStack() as stack:
            task = _enter(stack, "starting the task", lambda: trajectory.bridge.task(trajectory.agent_name))
            output = await wrapped(instance, *args, **kwargs)
            if task is not None:
                _careful("recording the run", lambda: _record_run(trajectory, task, output), None)
            return output
    finally:
        trajectory.in_run = False


def _record_run(trajectory: _Trajectory, task: TaskHandle, output: Any) -> None:
    task.set_result(status="success", reward=output.reward_score)
    trajectory.set({p.RESPONSE_LENGTH: len(output.response_ids), p.NUM_TURNS: output.num_turns})


async def _generate(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    trajectory = _trajectory.get()
    if trajectory is None or _generate_turn.get() is not None:  # untraced, or a subclass calling super()
        return await wrapped(instance, *args, **kwargs)
    with ExitStack() as stack:
        turn = _enter(stack, "starting the generate turn", lambda: trajectory.bridge.turn(trajectory.next_turn()))
        if turn is not None:
            stack.callback(_generate_turn.reset, _generate_turn.set(turn))
        output = await wrapped(instance, *args, **kwargs)
        if turn is not None:
            _careful("recording the generate turn", lambda: _record_generate(trajectory, turn, kwargs, output), None)
        return output


def _record_generate(trajectory: _Trajectory, turn: TurnHandle, kwargs: Mapping[str, Any], output: Any) -> None:
    cached = output.extra_fields.get("num_cached_tokens")
    turn.record(
        finish_reason=output.stop_reason,
        prompt_tokens=len(kwargs["prompt_ids"]),
        completion_tokens=len(output.token_ids),
    )
    trajectory.set(
        {p.CACHED_TOKENS: cached, p.GEN_AI_CACHED_TOKENS: cached, p.NUM_PREEMPTED: output.num_preempted},
        turn.span,
    )


async def _acquire_server(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    result = await wrapped(instance, *args, **kwargs)
    turn = _generate_turn.get()
    if turn is not None:
        _careful("recording the server", lambda: turn.span.set_attribute(p.SERVER_ADDRESS, str(result[0])), None)
    return result


async def _call_tool(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    trajectory = _trajectory.get()
    if trajectory is None:
        return await wrapped(instance, *args, **kwargs)
    with ExitStack() as stack:
        turn = _enter(
            stack, "starting the tool turn", lambda: trajectory.bridge.turn(trajectory.next_turn(), type="tool")
        )
        if turn is not None:
            _careful("recording the tool call", lambda: _record_tool_call(turn, args, kwargs), None)
        started = time.perf_counter()
        result = await wrapped(instance, *args, **kwargs)
        latency_ms = (time.perf_counter() - started) * 1000
        if turn is not None:
            _careful(
                "recording the tool result", lambda: _record_tool_result(trajectory, turn, result, latency_ms), None
            )
        return result


def _record_tool_call(turn: TurnHandle, args: Any, kwargs: Mapping[str, Any]) -> None:
    tool_call = args[0] if args else kwargs["tool_call"]
    turn.record(tools=tool_call.name, tool_args=tool_call.arguments)


def _record_tool_result(trajectory: _Trajectory, turn: TurnHandle, result: Any, latency_ms: float) -> None:
    response, tool_reward, metrics = result
    turn.record(content=response.text)
    trajectory.set({p.TOOL_REWARD: tool_reward, p.TOOL_METRICS: metrics or None, p.LATENCY_MS: latency_ms}, turn.span)
