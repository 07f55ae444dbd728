"""verl's training steps as traces: the wrappers the plugin installs on verl's PPO trainer (the targets:
:data:`~verl_otel_bridge._internal.verl.targets.TARGETS`).

``RayPPOTrainer.fit`` times each phase of a step with ``marked_timer`` (imported by
name into ``verl.trainer.ppo.ray_trainer``) and, after the step, logs its metrics
with ``Tracking.log(data=metrics, step=global_steps)``. Wrapping those two gives one
trace per step, with no code:

* ``training_step``: opened by the step's first timer, ended when verl logs the
  step's metrics; ``project`` and ``experiment_name`` (from verl's ``Tracking``) and
  ``global_steps`` (the logged step);
* one span per ``marked_timer`` block, named by verl's timer (``step``, ``gen``,
  ``reward``, ``old_log_prob``, ...), nested as verl nests them, with ``training.phase``.
  ``gen`` is the current span while ``AgentLoopManager.generate_sequences`` runs, so
  the carrier the plugin sends (:data:`~verl_otel_bridge._internal.verl.tracing.CARRIER_KEY`)
  makes every rollout session of the step its descendant, on any Ray worker;
* ``training_step.metrics`` records in the step's trace: each logged metric as
  ``metric.<verl's key>``, with the step's identity.

A timer starting at the top of an open step under a name that step already had
means the previous step was never logged: it is ended (without metrics) and a new
one opens. When ``fit`` ends, a step still open is ended (with status ERROR if
``fit`` raised) and the spans are flushed: verl runs the trainer in a Ray actor,
which Ray ends without ``atexit``.

Inert unless tracing is wanted (:func:`~verl_otel_bridge._internal.verl.tracing.wanted`, the
agent loops' switch, with the backend of the config verl's ``Tracking`` got). A
wrapper never raises into verl; a verl whose trainer does not look as expected is
left untraced with one WARNING. The one exception on purpose: a bad bridge setting
fails ``Tracking.__init__`` (a ``ValueError`` naming key, value and fix).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from types import ModuleType, TracebackType
from typing import Any

from opentelemetry.trace import Span, set_span_in_context

from verl_otel_bridge._internal import current
from verl_otel_bridge._internal import protocol as p
from verl_otel_bridge._internal.bridge import Bridge
from verl_otel_bridge._internal.scopes import SpanBlock
from verl_otel_bridge._internal.spans import record_error
from verl_otel_bridge._internal.verl.tracing import FLUSH_TIMEOUT_S, configure_from_verl, wanted
from verl_otel_bridge._internal.verl.wrapping import PATCHED, warn

#: Metric attributes per ``training_step.metrics`` record: below OpenTelemetry's default of 128 per span.
METRICS_PER_RECORD = 100


class _Run:
    """What verl's ``Tracking`` was made with: the run's name and the rollout-trace backend."""

    __slots__ = ("backend", "identity")

    def __init__(self, project: Any, experiment_name: Any, backend: Any) -> None:
        self.identity = {"project": project, "experiment_name": experiment_name}
        self.backend = backend


class _Step:
    """One open ``training_step``: its span (current while no phase is), the bridge, the phases open."""

    __slots__ = ("block", "bridge", "depth", "identity", "names", "span")

    def __init__(self, bridge: Bridge, identity: Mapping[str, Any]) -> None:
        self.bridge = bridge
        self.identity = bridge.clean_attributes(identity)
        self.span: Span = bridge.tracer.start_span(p.TRAINING_STEP_SPAN_NAME, attributes=self.identity)
        self.block = SpanBlock(self.span)
        self.depth = 0
        self.names: set[Any] = set()


_run: ContextVar[_Run | None] = ContextVar("verl_otel_bridge_run", default=None)
_step: ContextVar[_Step | None] = ContextVar("verl_otel_bridge_step", default=None)


# --------------------------------------------------------------------------- the wrappers


def phase_timers(original: Callable[..., Any], module: ModuleType) -> Callable[..., Any]:
    """``marked_timer`` of ``verl.trainer.ppo.ray_trainer`` (``original``), each block inside its phase's span."""

    @functools.wraps(original)
    def marked_timer(name: Any, timing_raw: Any, *args: Any, **kwargs: Any) -> _PhaseTimer:
        return _PhaseTimer(name, original(name, timing_raw, *args, **kwargs))

    setattr(marked_timer, PATCHED, True)
    return marked_timer


class _PhaseTimer:
    """verl's timer inside the phase's span (the span is started first and ended last)."""

    __slots__ = ("_name", "_phase", "_timer")

    def __init__(self, name: Any, timer: Any) -> None:
        self._name = name
        self._timer = timer
        self._phase: tuple[_Step, Any] | None = None

    def __enter__(self) -> Any:
        try:
            self._phase = _enter_phase(self._name)
        except Exception as exc:  # noqa: BLE001 - instrumentation must never break verl
            warn("starting the phase", exc)
        try:
            return self._timer.__enter__()
        except BaseException as exc:
            self._leave(exc)
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Any:
        try:
            return self._timer.__exit__(exc_type, exc, tb)
        finally:
            self._leave(exc)

    def _leave(self, exc: BaseException | None) -> None:
        phase, self._phase = self._phase, None
        if phase is not None:
            try:
                _leave_phase(*phase, exc)
            except Exception as error:  # noqa: BLE001
                warn("ending the phase", error)


def _enter_phase(name: Any) -> tuple[_Step, Any] | None:
    run = _run.get()
    if not wanted(run.backend if run is not None else None):
        return None
    step = _step.get()
    if step is not None and step.depth == 0 and name in step.names:
        _end_step(step)  # the previous step was not logged
        step = None
    if step is None:
        bridge = current.get_bridge()
        if not bridge.enabled:
            return None
        identity = run.identity if run is not None else {}
        step = _Step(
            bridge,
            {
                "project": identity.get("project") or bridge.config.project,
                "experiment_name": identity.get("experiment_name") or bridge.config.experiment_name,
            },
        )
        _step.set(step)
    if step.depth == 0:
        step.names.add(name)
    scope = step.bridge.span(name, **{p.PHASE: name})
    scope.__enter__()
    step.depth += 1
    return step, scope


def _leave_phase(step: _Step, scope: Any, exc: BaseException | None) -> None:
    step.depth -= 1
    scope.__exit__(type(exc) if exc is not None else None, exc, None)
    if step.depth == 0 and exc is not None and _step.get() is step:
        _end_step(step, error=exc)  # the step is not going to be logged


def _end_step(
    step: _Step,
    *,
    global_steps: Any = None,
    metrics: Mapping[Any, Any] | None = None,
    error: BaseException | None = None,
) -> None:
    _step.set(None)
    try:
        if global_steps is not None:
            step.span.set_attributes(step.bridge.clean_attributes({"global_steps": global_steps}))
        if metrics:
            _record_metrics(step, metrics, global_steps)
        if error is not None:
            record_error(step.span, error)
    finally:
        step.block.close()
        step.span.end()


def _record_metrics(step: _Step, metrics: Mapping[Any, Any], global_steps: Any) -> None:
    """The logged metrics as ``training_step.metrics`` records, children of the step at one instant."""
    values = {f"{p.STEP_METRIC_PREFIX}{key}": _scalar(value) for key, value in metrics.items()}
    identity = {**step.identity, "global_steps": global_steps}
    parent = set_span_in_context(step.span)
    now = time.time_ns()
    for chunk in _chunks(sorted(values), METRICS_PER_RECORD):
        attributes = step.bridge.clean_attributes({**identity, **{key: values[key] for key in chunk}})
        record = step.bridge.tracer.start_span(
            p.STEP_METRICS_SPAN_NAME, context=parent, attributes=attributes, start_time=now
        )
        record.end(end_time=now)


def _scalar(value: Any) -> Any:
    """A numpy or torch scalar as the Python number it holds (verl logs both); anything else as it is."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        return item()
    return value


def _chunks(keys: list[str], size: int) -> Iterable[list[str]]:
    return (keys[i : i + size] for i in range(0, len(keys), size))


def _arguments(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    return dict(inspect.signature(wrapped).bind(instance, *args, **kwargs).arguments)


def tracking_init(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> None:
    """After verl's ``__init__``: remember the run (name, backend) for the steps of this context; configure
    a bridge from verl's config if the process has none and tracing is wanted.

    Raises:
        ValueError: a bad bridge setting (see :func:`~verl_otel_bridge._internal.verl.tracing.configure_from_verl`).
    """
    wrapped(instance, *args, **kwargs)
    try:
        arguments = _arguments(wrapped, instance, args, kwargs)
        config = arguments.get("config")
        run = _Run(arguments.get("project_name"), arguments.get("experiment_name"), _backend(config))
    except Exception as exc:  # noqa: BLE001
        warn("reading the run", exc)
        return
    _run.set(run)
    if config is not None:
        configure_from_verl(config, lambda: run.backend)


def _backend(config: Any) -> Any:
    """``actor_rollout_ref.rollout.trace.backend`` of a verl config (a mapping), None when absent."""
    section = config
    for key in ("actor_rollout_ref", "rollout", "trace"):
        section = section.get(key) if isinstance(section, Mapping) else None
    return section.get("backend") if isinstance(section, Mapping) else None


def tracking_log(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """verl's ``Tracking.log``, then: the open step gets the metrics and, outside any phase, ends."""
    try:
        return wrapped(instance, *args, **kwargs)
    finally:
        try:
            _logged(_arguments(wrapped, instance, args, kwargs))
        except Exception as exc:  # noqa: BLE001
            warn("recording the step's metrics", exc)


def _logged(arguments: Mapping[str, Any]) -> None:
    step = _step.get()
    if step is None:
        return
    data = arguments.get("data")
    metrics = data if isinstance(data, Mapping) else None
    if step.depth == 0:
        _end_step(step, global_steps=arguments.get("step"), metrics=metrics)
    elif metrics:
        _record_metrics(step, metrics, arguments.get("step"))


def fit(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """verl's ``fit``, then: a step still open is ended, and the spans are exported."""
    try:
        result = wrapped(instance, *args, **kwargs)
    except BaseException as exc:
        _fit_ended(exc)
        raise
    _fit_ended(None)
    return result


def _fit_ended(exc: BaseException | None) -> None:
    try:
        step = _step.get()
        if step is not None:
            _end_step(step, error=exc)
        run = _run.get()
        bridge = current.current_bridge()
        if bridge is not None and wanted(run.backend if run is not None else None):
            bridge.force_flush(FLUSH_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001
        warn("ending the last step", error)
