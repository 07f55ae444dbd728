"""A drop-in for verl's ``verl.utils.tracking.RLInsightLogger``, implemented on the bridge.

Switch with two lines::

    # from verl.utils.tracking import RLInsightLogger
    from verl_otel_bridge.verl import RLInsightLogger

The public members of verl 0.9.1's class (constructor included) with the same
names, parameters, defaults and return shapes, and what verl does when
``VERL_RL_INSIGHT_ENABLE`` is not ``1``: nothing that touches RL-Insight. When
enabled, the risks its review named are fixed: spans never block the caller on
an RL-Insight call, ``rl_insight.init`` runs once per process with the project
and experiment name, degraded features are counted in
``verl_otel_bridge.status()`` instead of being hidden after one warning, and a
metrics registration made while RL-Insight was unusable is retried once it is
usable. ``docs/verl.md`` lists every behaviour difference.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

from packaging.version import Version

from verl_otel_bridge._internal.accounting import VERL_METRICS_FAILED, VERL_METRICS_SKIPPED
from verl_otel_bridge._internal.bridge import Bridge
from verl_otel_bridge._internal.config import RL_INSIGHT_ENABLE_ENV, BridgeConfig, ConfigError, environment_value
from verl_otel_bridge._internal.current import configure, current_bridge, get_bridge
from verl_otel_bridge._internal.identity import IdentityFields, SessionIdentity
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.rl_insight import compat as rl_insight_compat
from verl_otel_bridge._internal.rl_insight.compat import Probe
from verl_otel_bridge._internal.session import Session
from verl_otel_bridge._internal.verl import destination
from verl_otel_bridge._internal.verl.config import bridge_config
from verl_otel_bridge._internal.verl.switch import RL_INSIGHT_LOGGER_ENV, RL_INSIGHT_LOGGERS
from verl_otel_bridge._internal.verl.targets import RL_INSIGHT_LOGGER, TRACKING

logger = logging.getLogger(__name__)


class AgentLoopSession:
    """What ``RLInsightLogger.agent_loop_session`` returns: ``.identity`` and ``.finish(...)``.

    With a session, it is an ``agent_session`` span started at creation and ended by
    :meth:`finish`; it is not made current, as RL-Insight's object is not. Without
    one (verl's switch off) it only carries the identity, like verl's fallback object.
    """

    def __init__(self, identity: SessionIdentity, session: Session | None = None) -> None:
        self.identity: dict[str, Any] = identity.to_dict()
        self.start_ns: int = (getattr(session.span, "start_time", None) or 0) if session is not None else 0
        self._session = session

    def finish(
        self,
        *,
        trajectories: Sequence[Any] | None = None,
        status: str = "success",
        runner_name: str | None = None,
        reward_source: str | None = None,
        finished: bool | None = None,
    ) -> None:
        """Set the session's outcome and end its span (a second call is ignored)."""
        if self._session is None or self._session.finished:
            return
        self._session.finish(
            status=status,
            trajectories=trajectories,
            runner_name=runner_name,
            reward_source=reward_source,
            finished=finished,
        )
        self._session.span.end()


_MetricsKey = tuple[str | None, tuple[str, ...], str]


class RLInsightLogger:
    """verl's RL-Insight logger surface, on top of the current bridge. All classmethods.

    ``RLInsightLogger(project_name, experiment_name, config)`` (what verl's ``Tracking``
    does) calls :meth:`init`.
    """

    ENABLE_ENV = RL_INSIGHT_ENABLE_ENV
    MINIMUM_RL_INSIGHT_VERSION = Version("0.3.0")

    # verl keeps these per process; so does the facade (they mirror RL-Insight's own state).
    _init_done: ClassVar[bool] = False
    _registered_metrics: ClassVar[set[_MetricsKey]] = set()
    #: Registrations asked for while RL-Insight was unusable, made once it is usable.
    _pending_metrics: ClassVar[dict[_MetricsKey, tuple[list[str], str | None, Any]]] = {}
    _lock = threading.Lock()
    _once = OnceLogger(logger)

    def __init__(self, project_name: str | None, experiment_name: str | None, config: Any = None) -> None:
        self.init(project_name=project_name, experiment_name=experiment_name, config=config)

    @classmethod
    def enabled(cls) -> bool:
        """True iff ``VERL_RL_INSIGHT_ENABLE`` is on (verl sets ``1`` when ``trainer.logger`` has ``rl_insight``).

        Read by the configuration's rule for the variable (``1``, ``true``, ``yes``, ``on``); a value
        that does not parse is off here, and ``configure()`` names it.
        """
        try:
            return environment_value(cls.ENABLE_ENV) is True
        except ConfigError:
            return False

    @classmethod
    def init(cls, project_name: str | None = None, experiment_name: str | None = None, config: Any = None) -> None:
        """When enabled: configure the bridge from the verl config and initialise RL-Insight once, with the
        run's identity; then register transfer_queue's metrics as verl does. Disabled: nothing."""
        if not cls.enabled():
            return
        overrides: dict[str, Any] = {"rl_insight_enable": True}
        if project_name is not None:
            overrides["project"] = project_name
        if experiment_name is not None:
            overrides["experiment_name"] = experiment_name
        bridge = configure(cls._config(config or {}, overrides))
        cls._init_done = True
        probe = bridge.rl_insight_probe(initialize=True)
        if probe is not None and probe.usable:
            cls._register_pending(probe)
        if config is not None:
            cls.register_transfer_queue_metrics(config)

    @classmethod
    def log(cls, data: Mapping[str, Any], step: Any) -> None:
        """verl's metric behaviour: numeric values as gauges named ``key`` with ``/`` -> ``_``; ``step`` ignored."""
        if not cls.enabled():
            return
        probe = cls._usable("log")
        if probe is None or probe.module is None:
            cls._bridge().counts.add(VERL_METRICS_SKIPPED, len(data))
            return
        for key, value in data.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            try:
                probe.module.metric_gauge(str(key).replace("/", "_"), number)
            except Exception as exc:  # noqa: BLE001 - metrics must not break the training step
                cls._bridge().counts.add(VERL_METRICS_FAILED)
                cls._once.log(f"log:{type(exc).__name__}", logging.WARNING, "rl_insight.metric_gauge raised %r", exc)

    @classmethod
    @contextmanager
    def trace_state(cls, state_name: str, *, state_lane_id: str | int | None = None, **labels: Any) -> Iterator[None]:
        """Disabled: pass-through. Enabled: RL-Insight's ``trace_state`` when usable, else a bridge span
        with the same attributes."""
        if not cls.enabled():
            yield
            return
        probe = cls._usable("trace_state")
        if probe is not None and probe.module is not None:
            with probe.module.trace_state(state_name, state_lane_id=state_lane_id, **labels):
                yield
            return
        attributes = {**labels, "monitor.trace_segment": "state_interval", "state_name": state_name}
        if state_lane_id is not None:
            attributes["state_lane_id"] = state_lane_id
        with cls._bridge().span(state_name, **attributes):
            yield

    @classmethod
    def trace_span(
        cls,
        name: str,
        *,
        start_time_ns: int,
        end_time_ns: int,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        """Disabled: nothing. Enabled: ``record_span`` (exported in the background, never blocking)."""
        if not cls.enabled():
            return
        cls._bridge().record_span(name, start_time_ns=start_time_ns, end_time_ns=end_time_ns, attributes=attributes)

    @classmethod
    def agent_loop_session(
        cls,
        *,
        experiment_name: Any | None = None,
        sample: Any,
        session: Any,
        traj: Any = 0,
        uid: Any = None,
        global_steps: Any = None,
        session_id: Any = None,
    ) -> AgentLoopSession:
        """Start an agent-loop session (an ``agent_session`` span when enabled; disabled, identity only).

        Project and experiment come from verl's ``RolloutTraceConfig`` when it has them (as in
        verl), else from the bridge config; ``experiment_name`` wins over both.
        """
        project, traced_experiment = _rollout_trace_names()
        if experiment_name is None:
            experiment_name = traced_experiment
        fields: IdentityFields = {
            "project": project,
            "experiment_name": experiment_name,
            "sample": sample,
            "session": session,
            "traj": traj,
            "uid": uid,
            "global_steps": global_steps,
            "session_id": session_id,
        }
        if not cls.enabled():  # what verl's call gives with RL-Insight 0.3.0 installed: the identity, no span
            return AgentLoopSession(SessionIdentity.create(**fields))
        session_ = cls._bridge().start_session(**fields)
        return AgentLoopSession(session_.identity, session_)

    @classmethod
    def register_rollout_metrics(
        cls,
        server_addresses: list[str],
        rollout_name: str | None,
        labels: list[dict[str, Any] | None] | None = None,
    ) -> None:
        """The rollout servers' Prometheus endpoints, as verl's ``llm_server.py`` registers them."""
        cls.register_metrics(server_addresses, rollout_name, labels)

    @classmethod
    def register_transfer_queue_metrics(cls, config: Any) -> None:
        """transfer_queue's metrics endpoint, when ``transfer_queue.metrics.enabled`` in the verl config."""
        if not (config or {}).get("transfer_queue", {}).get("metrics", {}).get("enabled", False):
            return
        try:
            import transfer_queue

            endpoint = transfer_queue.get_metrics_endpoint()
        except Exception:
            logger.exception("[rl-insight] Failed to get transfer_queue metrics endpoint")
            return
        if endpoint:
            cls.register_metrics([endpoint], "transfer_queue", None)

    @classmethod
    def register_metrics(
        cls,
        server_addresses: list[str],
        job_name: str | None = None,
        labels: list[dict[str, Any] | None] | None = None,
    ) -> None:
        """Register Prometheus scrape targets with RL-Insight once per distinct call; errors are logged.

        Asked while RL-Insight is unusable, the registration is kept and made as soon as a
        later call of this class finds RL-Insight usable.
        """
        if not cls.enabled():
            return
        key: _MetricsKey = (job_name, tuple(server_addresses), repr(labels))
        with cls._lock:
            if key in cls._registered_metrics or key in cls._pending_metrics:
                return  # made, or kept until RL-Insight is usable
            cls._pending_metrics[key] = (list(server_addresses), job_name, labels)
        probe = cls._usable("register_metrics")
        if probe is not None:
            cls._register_pending(probe)

    @classmethod
    def finish(cls) -> None:
        """Flush the bridge, then ``rl_insight.finish()`` (if the bridge initialised it) and reset, as verl's does.

        Nothing when neither :meth:`init` nor a first use initialised anything (as verl).
        """
        if not (cls._init_done or rl_insight_compat.init_calls()):
            return
        bridge = cls._bridge()
        probe = bridge.rl_insight_probe()
        bridge.force_flush()
        if probe is not None and probe.module is not None and rl_insight_compat.init_calls():
            try:
                rl_insight_compat.finish(probe.module)
            except Exception as exc:  # noqa: BLE001
                logger.error("rl_insight.finish() raised: %s", exc)
        with cls._lock:
            cls._init_done = False
            cls._registered_metrics.clear()
            cls._pending_metrics.clear()

    @classmethod
    def _config(cls, verl_config: Any, overrides: Mapping[str, Any]) -> BridgeConfig:
        """The bridge configuration :meth:`init` makes current: the verl config's, with ``overrides``."""
        return bridge_config(verl_config, **overrides)

    @classmethod
    def _bridge(cls) -> Bridge:
        """The bridge every member uses: the current one (built from the environment if none)."""
        return get_bridge()

    @classmethod
    def _degraded_level(cls, probe: Probe | None) -> int:
        """The level of the one line per feature and reason that says a feature is degraded."""
        return logging.WARNING

    @staticmethod
    def rollout_state_lane_id(rank: int, prefix: str = "rollout") -> str:
        """The lane id for rollout replica ``rank``: ``f"{prefix}_replica_{rank}"`` (not in verl 0.9.1's class)."""
        return f"{prefix}_replica_{rank}"

    @classmethod
    def _register_pending(cls, probe: Probe) -> None:
        """Make the registrations still pending (RL-Insight is usable now)."""
        if probe.module is None:
            return
        with cls._lock:
            pending = list(cls._pending_metrics.items())
        for key, (addresses, job_name, labels) in pending:
            with cls._lock:
                if cls._pending_metrics.pop(key, None) is None:
                    continue  # another thread took it
            try:
                probe.module.update_prometheus_config(addresses, job_name=job_name, labels=labels)
            except Exception as exc:  # noqa: BLE001
                logger.error("registering metrics endpoints %s with RL-Insight failed: %s", addresses, exc)
                continue  # as verl: not remembered, so the same call later tries again
            with cls._lock:
                cls._registered_metrics.add(key)

    @classmethod
    def _usable(cls, feature: str) -> Probe | None:
        """RL-Insight's probe (initialised) if usable for ``feature``; else None, counted and logged once.

        Usable, it also makes the metrics registrations still pending.
        """
        bridge = cls._bridge()
        probe = bridge.rl_insight_probe(initialize=True)
        if probe is not None and probe.usable:
            if cls._pending_metrics and feature != "register_metrics":
                cls._register_pending(probe)
            return probe
        bridge.counts.add(f"verl.{feature}_degraded")
        reason = probe.detail if probe is not None else "the bridge is configured without RL-Insight"
        cls._once.log(
            f"{feature}:{probe.reason if probe else 'none'}",
            cls._degraded_level(probe),
            "RLInsightLogger.%s: RL-Insight not usable (%s); degraded, counted in verl_otel_bridge.status()",
            feature,
            reason,
        )
        return None


class PluginRLInsightLogger(RLInsightLogger):
    """What verl's own code gets for ``RLInsightLogger`` when the plugin is loaded and RL-Insight is selected
    (:func:`select_logger`): the drop-in, whose spans go where the plugin's go.

    Its bridge is the plugin's (:func:`~verl_otel_bridge._internal.verl.destination.worker_config`):
    RL-Insight when usable, else the fallback, by default this process's JSON Lines file in the
    plugin's default directory, so nothing stays in a memory buffer that is gone at exit.
    """

    @classmethod
    def _config(cls, verl_config: Any, overrides: Mapping[str, Any]) -> BridgeConfig:
        return destination.worker_config(verl_config, **overrides)

    @classmethod
    def _bridge(cls) -> Bridge:
        bridge = current_bridge()
        if bridge is not None:
            return bridge
        with _configuring:
            bridge = current_bridge()
            if bridge is not None:
                return bridge
            try:
                return configure(cls._config({}, {"rl_insight_enable": True}))
            except ValueError as exc:  # a bad setting: the environment's bridge leaves it out and says so
                logger.error("verl_otel_bridge: %s", exc)
                return get_bridge()

    @classmethod
    def _degraded_level(cls, probe: Probe | None) -> int:
        # The bridge's probe has just said at WARNING why RL-Insight is not usable (and reminds while it
        # lasts): one WARNING per process, not one more per feature. Without a probe nobody said it.
        return logging.INFO if probe is not None else logging.WARNING


_configuring = threading.Lock()


@dataclass(frozen=True)
class LoggerChoice:
    """Which ``RLInsightLogger`` verl's own lookups get, and why (in words)."""

    plugin: bool
    reason: str
    #: The value of :data:`RL_INSIGHT_LOGGER_ENV` is neither of :data:`RL_INSIGHT_LOGGERS`.
    bad_setting: bool = False


def logger_choice(environ: Mapping[str, str] | None = None) -> LoggerChoice:
    """The plugin's class when RL-Insight is selected (``VERL_RL_INSIGHT_ENABLE`` on, as
    :meth:`RLInsightLogger.enabled` reads it) unless :data:`RL_INSIGHT_LOGGER_ENV` is ``verl``."""
    env = os.environ if environ is None else environ
    setting = env.get(RL_INSIGHT_LOGGER_ENV, "").strip()
    try:
        selected = environment_value(RL_INSIGHT_ENABLE_ENV, env) is True
    except ConfigError:
        selected = False
    if not selected:
        return LoggerChoice(
            False,
            f"RL-Insight is not selected ({RL_INSIGHT_ENABLE_ENV} is not on; verl sets it to 1 when trainer.logger "
            "lists rl_insight), so verl's own class is left alone",
        )
    if setting.lower() not in ("", *RL_INSIGHT_LOGGERS):
        return LoggerChoice(
            False,
            f"{RL_INSIGHT_LOGGER_ENV}={setting!r} is neither of {', '.join(RL_INSIGHT_LOGGERS)}, so verl's own "
            "class is kept",
            bad_setting=True,
        )
    if setting.lower() == "verl":
        return LoggerChoice(False, f"RL-Insight is selected, and {RL_INSIGHT_LOGGER_ENV}=verl keeps verl's own class")
    return LoggerChoice(
        True,
        f"RL-Insight is selected ({RL_INSIGHT_ENABLE_ENV}=1), so verl's RLInsightLogger is the bridge's: RL-Insight "
        f"when usable, else the plugin's local destination ({RL_INSIGHT_LOGGER_ENV}=verl keeps verl's own)",
    )


_said = OnceLogger(logger)


def select_logger(original: Any, module: ModuleType) -> Any:
    """What ``module``'s ``RLInsightLogger`` becomes when verl imports it.

    In ``verl.utils.tracking``, which defines it: :class:`PluginRLInsightLogger` if :func:`logger_choice`
    says so (one INFO line per process), else verl's ``original``. Every other module gets what
    ``verl.utils.tracking`` has (it imports the class from there), so one process never mixes the two.
    """
    if module.__name__ != TRACKING:
        defining = sys.modules.get(TRACKING)
        return getattr(defining, RL_INSIGHT_LOGGER, original) if defining is not None else original
    if not isinstance(original, type) or issubclass(original, RLInsightLogger):
        return original
    choice = logger_choice()
    if choice.bad_setting:
        _said.log("bad", logging.WARNING, "verl_otel_bridge: %s", choice.reason)
    if not choice.plugin:
        return original
    _said.log("chosen", logging.INFO, "verl_otel_bridge: %s", choice.reason)
    return PluginRLInsightLogger


def _rollout_trace_names() -> tuple[Any, Any]:
    """(project, experiment) from verl's ``RolloutTraceConfig`` when verl is loaded, else (None, None)."""
    rollout_trace = sys.modules.get("verl.utils.rollout_trace")
    if rollout_trace is None:
        return None, None
    try:
        instance = rollout_trace.RolloutTraceConfig.get_instance()
        return instance.project_name, instance.experiment_name
    except Exception as exc:  # noqa: BLE001 - a verl we do not know; the bridge config applies
        logger.warning("verl's RolloutTraceConfig could not be read (%r); using the bridge config", exc)
        return None, None
