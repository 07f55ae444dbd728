"""verl's own agent loops as bridge sessions: the wrappers the plugin installs (what each wraps and reads:
:data:`~verl_otel_bridge._internal.verl.targets.TARGETS`).

Per trajectory (``AgentLoopWorker._run_agent_loop``) one ``agent_session``
with verl's identity (``sample`` = sample_index, ``session`` = rollout_n,
``traj`` = 0, ``global_steps`` = step, ``uid`` = the trainer's uid, project and
experiment from verl's ``RolloutTraceConfig``); inside it the loop's ``run`` as
an ``agent_task``, one generate ``agent_turn`` per ``LLMServerClient.generate``
call and one tool ``agent_turn`` per ``ToolAgentLoop._call_tool`` call. The
session gets the reward and verl's timings once the worker computed them.

The conversation (verl's ``trace.token2text``, or the bridge's ``record_text``) is
stored once: the first generate turn's ``input`` is its decoded prompt, each later
one's ``input.appended`` the tokens appended to the previous generate turn's prompt
and response (tool replies, template text; only those are decoded) with
``input.after_turn`` naming that turn, and every generate turn's ``content`` its
decoded response. A prompt that does not continue the previous one (a loop that
rewrote its context) is recorded whole again. Readers and ``exporter: otlp``
rebuild each turn's whole input, and the session's first input and last output
(:mod:`verl_otel_bridge._internal.conversation`). A tool turn always carries its
arguments and result. A tool call verl answered with one of its error texts (the
tool raised, an unknown tool, arguments that are not JSON) ends its turn with
status ERROR and ``error.type``; the session counts them in ``failed_tool_calls``
and keeps verl's own status.

With verl's backend ``otel``, verl's ``rollout_trace_op`` calls the method it
decorates directly (verl would bind each call's arguments for records nobody reads).

Inert unless :func:`wanted` (read at each trajectory); honours verl's sampling
(``trace=False`` trajectories make no span). A wrapper never raises into verl:
an instrumentation error is logged once at WARNING and verl's method runs as
if unwrapped. Exceptions of verl's own code pass through unchanged. The one
exception on purpose: a bad bridge setting fails ``AgentLoopWorker.__init__``
(a ``ValueError`` naming key, value and fix), so a run does not start unobserved.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from types import ModuleType, TracebackType
from typing import Any

from verl_otel_bridge._internal import current, propagation
from verl_otel_bridge._internal import protocol as p
from verl_otel_bridge._internal.agent_loop import TaskHandle, TurnHandle, mark_failed
from verl_otel_bridge._internal.attributes import bounded_text, set_clean_attributes
from verl_otel_bridge._internal.bridge import Bridge
from verl_otel_bridge._internal.config import BridgeConfig, parse_bool
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.session import Session
from verl_otel_bridge._internal.verl import destination
from verl_otel_bridge._internal.verl.switch import BACKEND, SWITCH_ENV
from verl_otel_bridge._internal.verl.targets import TOOL_ERRORS
from verl_otel_bridge._internal.verl.wrapping import PATCHED, patch, warn

logger = logging.getLogger(__name__)
_once = OnceLogger(logger)

ExcInfo = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]
_NO_EXCEPTION: ExcInfo = (None, None, None)

#: ``DataProto.meta_info`` key of the trainer's trace context (see :func:`manager_generate_sequences`).
CARRIER_KEY = "verl_otel_bridge.carrier"
#: Longest the end of ``AgentLoopWorker.generate_sequences`` waits for its spans' export.
FLUSH_TIMEOUT_S = 5.0


class _Trajectory:
    """What the wrappers of one traced trajectory share (through :data:`_trajectory`)."""

    __slots__ = (
        "agent_name",
        "bridge",
        "decode",
        "failed_tools",
        "in_run",
        "last_generate",
        "seen_ids",
        "session",
        "turns",
    )

    def __init__(self, bridge: Bridge, session: Session, agent_name: str, decode: Callable[..., Any] | None) -> None:
        self.bridge = bridge
        self.session = session
        self.agent_name = agent_name
        #: The tokenizer's ``decode`` when the conversation is recorded, else None.
        self.decode = decode
        self.turns = 0
        self.failed_tools = 0
        #: The previous generate turn's number, and its prompt's and response's token ids (what the next
        #: generate turn's prompt starts with when it continues the conversation).
        self.last_generate: int | None = None
        self.seen_ids: list[int] = []
        self.in_run = False

    def next_turn(self) -> int:
        turn = self.turns
        self.turns += 1
        return turn

    def set(self, values: Mapping[str, Any], span: Any = None) -> None:
        """Set ``values`` (None left out, converted as the bridge converts) on ``span``, default the session's."""
        set_clean_attributes(span or self.session.span, self.bridge.clean_attributes(values))  # None left out

    def text(self, token_ids: Sequence[int], *, whole: bool = False) -> str | None:
        """``token_ids`` decoded (at most as many as can survive ``max_attribute_length``), or None; ``whole``:
        a whole prompt (decoded once per worker for the rollouts that share it)."""
        # A token is at least one byte and a character at most four: more ids could only be cut away.
        return (
            self.decode(token_ids[: 4 * self.bridge.config.max_attribute_length], whole=whole) if self.decode else None
        )

    def prompt_text(self, turn: int, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> dict[str, Any]:
        """A generate turn's input, stored once: the tokens appended since the previous generate turn decoded
        (``input.appended``, ``input.after_turn``), or, for the first turn or a prompt that does not continue
        that turn's prompt and response, the whole prompt (``input``)."""
        seen, previous = self.seen_ids, self.last_generate
        self.seen_ids = [*prompt_ids, *response_ids]
        self.last_generate = turn
        if self.decode is None:
            return {}
        if previous is not None and len(prompt_ids) >= len(seen) and prompt_ids[: len(seen)] == seen:
            return {p.INPUT_APPENDED: self.text(prompt_ids[len(seen) :]), p.INPUT_AFTER_TURN: previous}
        return {p.INPUT: self.text(prompt_ids, whole=True)}


_trajectory: ContextVar[_Trajectory | None] = ContextVar("verl_otel_bridge_trajectory", default=None)
_generate_turn: ContextVar[TurnHandle | None] = ContextVar("verl_otel_bridge_generate_turn", default=None)


class _Call:
    """One ``generate_sequences`` call: the bridges its trajectories used and how many are still open."""

    __slots__ = ("bridges", "ended", "open")

    def __init__(self) -> None:
        self.bridges: list[Bridge] = []
        self.open = 0
        self.ended = asyncio.Event()

    def started(self, bridge: Bridge) -> None:
        self.bridges.append(bridge)
        self.open += 1
        self.ended.clear()

    def stopped(self) -> None:
        self.open -= 1
        if self.open <= 0:
            self.ended.set()


_traced_calls: ContextVar[_Call | None] = ContextVar("verl_otel_bridge_traced_calls", default=None)


def wanted(trace_backend: Any) -> bool:
    """Whether to trace: :data:`SWITCH_ENV` on or off decides (read as every on/off variable is, by
    :func:`~verl_otel_bridge._internal.config.parse_bool`); unset, verl's backend must be ``otel``."""
    switch = os.environ.get(SWITCH_ENV, "")
    if switch.strip():
        try:
            return parse_bool(switch)
        except ValueError:
            _once.log(
                "switch", logging.WARNING, "verl tracing: %s=%r is not on or off; it is ignored", SWITCH_ENV, switch
            )
    return bool(trace_backend == BACKEND)


def _rollout_trace_config() -> Any:
    rollout_trace = sys.modules.get("verl.utils.rollout_trace")
    return rollout_trace.RolloutTraceConfig.get_instance() if rollout_trace is not None else None


def _enter(what: str, make: Callable[..., AbstractContextManager[Any]], *args: Any, **kwargs: Any) -> Any:
    """``(scope, scope.__enter__())`` for ``scope = make(*args, **kwargs)``, or None after logging an exception
    (the caller then runs verl's method untraced)."""
    try:
        scope = make(*args, **kwargs)
        return scope, scope.__enter__()
    except Exception as exc:  # noqa: BLE001 - instrumentation must never break verl
        warn(what, exc)
        return None


def _exit(what: str, scope: AbstractContextManager[Any], exc_info: ExcInfo) -> None:
    """``scope.__exit__(*exc_info)``; an exception of the scope's own is logged, never raised."""
    try:
        scope.__exit__(*exc_info)
    except Exception as exc:  # noqa: BLE001
        if exc is not exc_info[1]:  # the block's own exception, re-raised by the scope, is the caller's to raise
            warn(what, exc)


def _record_and_end(what: str, scope: AbstractContextManager[Any], record: Callable[..., None], *args: Any) -> None:
    """``record(*args)`` (an exception logged), then the normal end of ``scope``."""
    try:
        record(*args)
    except Exception as exc:  # noqa: BLE001
        warn(f"recording {what}", exc)
    _exit(f"ending {what}", scope, _NO_EXCEPTION)


# --------------------------------------------------------------------------- verl's rollout-trace decorator


def rollout_trace_op(original: Callable[..., Any], module: ModuleType) -> Callable[..., Any]:
    """``verl.utils.rollout_trace.rollout_trace_op`` (``original``) made to call the decorated method directly
    when verl's backend is ``otel``; with any other backend (or none) verl's own wrapper runs as before.

    Installed when that module is imported, before verl's agent-loop, tool and LLM-client modules
    import the decorator by name, so their methods are decorated by this one.
    """
    get_backend = module.RolloutTraceConfig.get_backend

    @functools.wraps(original)
    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        traced = original(func)
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_op(self: Any, *args: Any, **kwargs: Any) -> Any:
                if get_backend() == BACKEND:
                    return await func(self, *args, **kwargs)
                return await traced(self, *args, **kwargs)

            return async_op

        @functools.wraps(func)
        def op(self: Any, *args: Any, **kwargs: Any) -> Any:
            if get_backend() == BACKEND:
                return func(self, *args, **kwargs)
            return traced(self, *args, **kwargs)

        return op

    setattr(decorator, PATCHED, True)
    return decorator


# --------------------------------------------------------------------------- the worker


def worker_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
    """After verl's ``__init__``: a process with no bridge yet gets one from verl's config and its environment.

    Raises:
        ValueError: a bad ``actor_rollout_ref.rollout.trace.otel_bridge`` setting or
            ``VERL_OTEL_BRIDGE_*`` variable, naming key and fix, so the worker fails at start.
    """
    wrapped(instance, *args, **kwargs)
    configure_from_verl(instance.config, _verl_backend)


def _verl_backend() -> Any:
    trace_config = _rollout_trace_config()
    return trace_config.backend if trace_config is not None else None


def configure_from_verl(verl_config: Any, backend: Callable[[], Any]) -> None:
    """Give a process with no bridge yet one from verl's config and its environment, if :func:`wanted`
    (with the rollout-trace backend ``backend()`` returns).

    Raises:
        ValueError: a bad ``actor_rollout_ref.rollout.trace.otel_bridge`` setting or
            ``VERL_OTEL_BRIDGE_*`` variable, naming key and fix.
    """
    if current.current_bridge() is not None:
        return
    try:
        if not wanted(backend()):
            return
    except Exception as exc:  # noqa: BLE001
        warn("reading the backend", exc)
        return
    try:
        config = destination.worker_config(verl_config)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - a config shape we do not know: the environment alone decides
        _once.log(
            "from_verl", logging.WARNING, "verl tracing: reading verl's config failed (%r); using the environment", exc
        )
        config = BridgeConfig.resolve()
    current.configure(config)


async def worker_generate_sequences(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """Continue the trainer's trace (when it sent one); export this call's spans before returning or raising."""
    try:
        batch = args[0] if args else kwargs.get("batch")
        carrier = batch.meta_info.pop(CARRIER_KEY, None)
    except Exception as exc:  # noqa: BLE001
        warn("reading the carrier", exc)
        carrier = None
    traced = _Call()
    token = _traced_calls.set(traced)
    attached = _enter("attach", propagation.attach, carrier) if carrier else None
    exc_info = _NO_EXCEPTION
    try:
        return await wrapped(instance, *args, **kwargs)
    except BaseException:
        exc_info = sys.exc_info()
        raise
    finally:
        if attached is not None:
            _exit("attach", attached[0], exc_info)
        _traced_calls.reset(token)
        if traced.bridges:
            if traced.open > 0:  # a failing call: its sibling trajectories (verl does not cancel them) end soon
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(traced.ended.wait(), FLUSH_TIMEOUT_S)
            # Ray ends AgentLoopWorker actors without atexit, and a failing actor may not live on: what is
            # still queued when the call ends would be lost. A call that succeeded waits for local files
            # only: its actor lives on, and verl must not wait for a slow trace server.
            await _flush(traced.bridges, wait_for_network=exc_info is not _NO_EXCEPTION)


async def _flush(traced: list[Bridge], *, wait_for_network: bool) -> None:
    loop = asyncio.get_running_loop()
    for bridge in {id(b): b for b in traced}.values():
        flush = functools.partial(bridge.flush_queued, FLUSH_TIMEOUT_S, wait_for_network=wait_for_network)
        try:
            await loop.run_in_executor(None, flush)
        except Exception as exc:  # noqa: BLE001
            warn("flushing", exc)


def manager_generate_sequences(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """On the trainer: hand the current span (if any) to the workers, so their sessions are its children.

    Not a coroutine function: verl's method is ``auto_await`` (sync from sync code), so the
    wrapper returns whatever it returns.
    """
    try:
        if wanted(instance.config.actor_rollout_ref.rollout.trace.get("backend")):
            destination.warn_if_spread(instance.config)  # once: Ray's nodes writing into node-local directories
            carrier = propagation.inject()
            if carrier:
                prompts = args[0] if args else kwargs["prompts"]
                prompts.meta_info[CARRIER_KEY] = carrier
    except Exception as exc:  # noqa: BLE001
        warn("sending the trace context", exc)
    return wrapped(instance, *args, **kwargs)


async def run_agent_loop(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    try:
        started = _start(instance, args, kwargs)
    except Exception as exc:  # noqa: BLE001
        warn("starting the session", exc)
        started = None
    if started is None:
        return await wrapped(instance, *args, **kwargs)
    trajectory, scope, token = started
    try:
        output = await wrapped(instance, *args, **kwargs)
    except BaseException:
        _stop(scope, token, sys.exc_info())
        raise
    try:
        _finish(trajectory, output)
    except Exception as exc:  # noqa: BLE001
        warn("recording the trajectory", exc)
    _stop(scope, token, _NO_EXCEPTION)
    return output


def _start(
    instance: Any, args: Any, kwargs: Any
) -> tuple[_Trajectory, AbstractContextManager[Session], Token[_Trajectory | None]] | None:
    trace_config = _rollout_trace_config()
    if not kwargs.get("trace", True) or not wanted(trace_config.backend if trace_config is not None else None):
        return None
    info = args[1] if len(args) > 1 else kwargs["trajectory"]
    bridge = current.get_bridge()
    if not bridge.enabled:
        return None
    agent_name = str(kwargs.get("agent_name"))
    scope = bridge.session(
        sample=info["sample_index"],
        session=info["rollout_n"],
        traj=0,
        uid=kwargs.get("uid"),
        global_steps=int(info["step"]),
        project=trace_config.project_name if trace_config is not None else None,
        experiment_name=trace_config.experiment_name if trace_config is not None else None,
    )
    session = scope.__enter__()
    try:
        text = bridge.config.record_text or bool(trace_config is not None and trace_config.token2text)
        trajectory = _Trajectory(bridge, session, agent_name, _prompts(instance).decode if text else None)
        values: dict[str, Any] = {p.VALIDATE: bool(info["validate"]), p.AGENT_NAME: agent_name}
        values[p.GEN_AI_AGENT_NAME] = agent_name
        trajectory.set(values)
        token = _trajectory.set(trajectory)
    except BaseException:
        _exit("starting the session", scope, sys.exc_info())
        raise
    call = _traced_calls.get()
    if call is not None:
        call.started(bridge)
    return trajectory, scope, token


#: The transformers modules whose ``decode`` / ``_decode`` hand token ids to the ``tokenizers`` backend as they are.
_LIBRARY_DECODERS = frozenset(
    {
        "transformers.tokenization_utils_base",
        "transformers.tokenization_utils_fast",
        "transformers.tokenization_utils_tokenizers",
    }
)


class _Prompts:
    """One worker's decoding: :func:`decoder` of its tokenizer, and the text of the prompts it decoded last.

    The rollouts of one prompt (GRPO's ``n``) start from the same token ids: their first generate turn
    decodes it once per worker. Kept on the ``AgentLoopWorker`` (it lives and dies with it).
    """

    __slots__ = ("_decode", "_texts")

    #: Distinct prompts remembered (a step's prompts for this worker, about 8 KB each).
    MAX_PROMPTS = 256

    def __init__(self, tokenizer: Any) -> None:
        self._decode = decoder(tokenizer)
        self._texts: dict[tuple[int, ...], str] = {}

    def decode(self, token_ids: Sequence[int], *, whole: bool = False) -> str:
        if not whole:
            return self._decode(token_ids)
        key = tuple(token_ids)
        text = self._texts.pop(key, None)
        if text is None:
            text = self._decode(token_ids)
            if len(self._texts) >= self.MAX_PROMPTS:
                del self._texts[next(iter(self._texts))]
        self._texts[key] = text  # the most recent last
        return text


_PROMPTS = "_verl_otel_bridge_prompts"


def _prompts(worker: Any) -> _Prompts:
    prompts = getattr(worker, _PROMPTS, None)
    if not isinstance(prompts, _Prompts):
        prompts = _Prompts(worker.tokenizer)
        setattr(worker, _PROMPTS, prompts)
    return prompts


def decoder(tokenizer: Any) -> Callable[[Sequence[int]], str]:
    """``tokenizer.decode``, or the same decoding without its per-token Python work.

    A transformers fast tokenizer whose ``decode`` is the library's own and that cleans up no
    spaces returns exactly what its ``tokenizers`` backend's ``decode`` returns; only the
    conversion of each id to a Python object is left out (half the cost of decoding).
    Any other tokenizer, or ids the backend does not take, use ``tokenizer.decode``.
    """
    decode: Callable[[Sequence[int]], str] = tokenizer.decode
    backend = getattr(tokenizer, "backend_tokenizer", None)
    owners = {c.__module__ for c in type(tokenizer).__mro__ if "decode" in vars(c) or "_decode" in vars(c)}
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True) or not owners <= _LIBRARY_DECODERS:
        return decode
    fast = functools.partial(backend.decode, skip_special_tokens=False)

    def decode_ids(token_ids: Sequence[int]) -> str:
        try:
            return str(fast(token_ids))
        except TypeError:  # not a list of Python ints (a tensor, an array)
            return decode(token_ids)

    return decode_ids


def _stop(scope: AbstractContextManager[Session], token: Token[_Trajectory | None], exc_info: ExcInfo) -> None:
    _trajectory.reset(token)
    _exit("ending the session", scope, exc_info)
    call = _traced_calls.get()
    if call is not None:
        call.stopped()


def _finish(trajectory: _Trajectory, output: Any) -> None:
    metrics = output.metrics
    values: dict[str, Any] = {
        p.REWARD_SCORE: output.reward_score,
        p.REWARD_EXTRA_INFO: output.extra_fields.get("reward_extra_info"),
        p.NUM_TURNS: output.num_turns,
        p.FAILED_TOOL_CALLS: trajectory.failed_tools,
    }
    for key in p.VERL_METRICS:
        values[key] = getattr(metrics, key[len(p.VERL_METRIC_PREFIX) :], None)
    trajectory.set(values)
    trajectory.session.finish(
        status="success",
        trajectories=[{p.CHAIN_ID: 0, p.REWARD_SCORE: output.reward_score, p.NUM_TURNS: output.num_turns}],
        runner_name=trajectory.agent_name,
        finished=True,
    )


# --------------------------------------------------------------------------- the loops


def loop_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
    """After ``AgentLoopBase.__init__``: wrap the ``run`` of this loop's class (once per class)."""
    wrapped(instance, *args, **kwargs)
    try:
        _wrap_run(type(instance))
    except Exception as exc:  # noqa: BLE001
        warn("wrapping the loop's run", exc)


def _wrap_run(cls: type) -> None:
    owner = next((klass for klass in cls.__mro__ if "run" in vars(klass)), None)
    if owner is not None:
        patch(owner, "run", _run)


async def _run(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    trajectory = _trajectory.get()
    if trajectory is None or trajectory.in_run:  # untraced, or a subclass's run calling super().run()
        return await wrapped(instance, *args, **kwargs)
    started = _enter("starting the task", trajectory.bridge.task, trajectory.agent_name)
    if started is None:
        return await wrapped(instance, *args, **kwargs)
    scope, task = started
    trajectory.in_run = True
    try:
        output = await wrapped(instance, *args, **kwargs)
    except BaseException:
        trajectory.in_run = False
        _exit("ending the task", scope, sys.exc_info())
        raise
    trajectory.in_run = False
    _record_and_end("the task", scope, _record_run, trajectory, task, output)
    return output


def _record_run(trajectory: _Trajectory, task: TaskHandle, output: Any) -> None:
    task.set_result(status="success", reward=output.reward_score)
    trajectory.set({p.RESPONSE_LENGTH: len(output.response_ids), p.NUM_TURNS: output.num_turns})


async def generate(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    trajectory = _trajectory.get()
    if trajectory is None or _generate_turn.get() is not None:  # untraced, or a subclass calling super()
        return await wrapped(instance, *args, **kwargs)
    number = trajectory.next_turn()
    started = _enter("starting the generate turn", trajectory.bridge.turn, number)
    if started is None:
        return await wrapped(instance, *args, **kwargs)
    scope, turn = started
    token = _generate_turn.set(turn)
    try:
        output = await wrapped(instance, *args, **kwargs)
    except BaseException:
        _generate_turn.reset(token)
        _exit("ending the generate turn", scope, sys.exc_info())
        raise
    _generate_turn.reset(token)
    _record_and_end("the generate turn", scope, _record_generate, trajectory, turn, number, kwargs, output)
    return output


def _record_generate(
    trajectory: _Trajectory, turn: TurnHandle, number: int, kwargs: Mapping[str, Any], output: Any
) -> None:
    cached = output.extra_fields.get("num_cached_tokens")
    prompt_ids = kwargs["prompt_ids"]
    response_ids = output.token_ids
    turn.record(
        finish_reason=output.stop_reason,
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(response_ids),
        content=trajectory.text(response_ids),
    )
    trajectory.set(
        {
            p.CACHED_TOKENS: cached,
            p.GEN_AI_CACHED_TOKENS: cached,
            p.NUM_PREEMPTED: output.num_preempted,
            **trajectory.prompt_text(number, prompt_ids, response_ids),
        },
        turn.span,
    )


async def acquire_server(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    result = await wrapped(instance, *args, **kwargs)
    turn = _generate_turn.get()
    if turn is not None:
        try:
            turn.span.set_attribute(p.SERVER_ADDRESS, str(result[0]))
        except Exception as exc:  # noqa: BLE001
            warn("recording the server", exc)
    return result


async def call_tool(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    trajectory = _trajectory.get()
    if trajectory is None:
        return await wrapped(instance, *args, **kwargs)
    started = _enter("starting the tool turn", trajectory.bridge.turn, trajectory.next_turn(), type="tool")
    if started is None:
        return await wrapped(instance, *args, **kwargs)
    scope, turn = started
    try:
        tool_call = args[0] if args else kwargs["tool_call"]
        turn.record(tools=tool_call.name, tool_args=tool_call.arguments)
    except Exception as exc:  # noqa: BLE001
        warn("recording the tool call", exc)
    started = time.perf_counter()
    try:
        result = await wrapped(instance, *args, **kwargs)
    except BaseException as error:
        if isinstance(error, Exception):  # not a cancellation: the tool call failed
            trajectory.failed_tools += 1
            _tool_failed(turn, type(error).__qualname__, None)
        _exit("ending the tool turn", scope, sys.exc_info())  # the exception's event and status ERROR
        raise
    latency_ms = (time.perf_counter() - started) * 1000
    _record_and_end("the tool turn", scope, _record_tool_result, trajectory, turn, result, latency_ms)
    return result


def _record_tool_result(trajectory: _Trajectory, turn: TurnHandle, result: Any, latency_ms: float) -> None:
    response, tool_reward, metrics = result
    text = response.text
    turn.record(content=text)
    trajectory.set({p.TOOL_REWARD: tool_reward, p.TOOL_METRICS: metrics or None, p.LATENCY_MS: latency_ms}, turn.span)
    if isinstance(text, str):
        for prefix, error_type in TOOL_ERRORS:
            if text.startswith(prefix):
                trajectory.failed_tools += 1
                _tool_failed(turn, error_type, bounded_text(text, trajectory.bridge.config.max_attribute_length))
                return


def _tool_failed(turn: TurnHandle, error_type: str, description: str | None) -> None:
    try:
        turn.span.set_attribute(p.ERROR_TYPE, error_type)
        if description is not None:
            mark_failed(turn.span, description)
    except Exception as exc:  # noqa: BLE001
        warn("recording the tool failure", exc)
