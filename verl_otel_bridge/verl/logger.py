"""A drop-in for verl's ``verl.utils.tracking.RLInsightLogger``, implemented on the bridge.

Switch with two lines::

    # from verl.utils.tracking import RLInsightLogger
    from verl_otel_bridge.verl import RLInsightLogger

Same class attributes, classmethods, signatures and return shapes as verl's
class, with the risks its review named fixed: spans never block the caller on
an RL-Insight call, ``rl_insight.init`` runs once per process with the project
and experiment name, identity never comes from a process-wide singleton, and
degraded features are counted in ``verl_otel_bridge.status()`` instead of being
hidden after one warning. ``docs/verl.md`` lists every behaviour difference.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from packaging.version import Version

from verl_otel_bridge.config import BridgeConfig
from verl_otel_bridge.current import configure, get_bridge
from verl_otel_bridge.logs import OnceLogger
from verl_otel_bridge.rl_insight import compat as rl_insight_compat
from verl_otel_bridge.rl_insight.compat import Probe
from verl_otel_bridge.session import Session

logger = logging.getLogger("verl_otel_bridge.verl.logger")


class AgentLoopSession:
    """What ``RLInsightLogger.agent_loop_session`` returns: ``.identity`` and ``.finish(...)``.

    The session is an ``agent_session`` span started at creation and ended by
    :meth:`finish`; it is not made current, as RL-Insight's object is not.
    """

    def __init__(self, session: Session) -> None:
        self.identity: dict[str, Any] = session.identity.to_dict()
        self.start_ns: int = getattr(session.span, "start_time", None) or 0
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
        if self._session.finished:
            return
        self._session.finish(
            status=status,
            trajectories=trajectories,
            runner_name=runner_name,
            reward_source=reward_source,
            finished=finished,
        )
        self._session.span.end()


class RLInsightLogger:
    """verl's RL-Insight logger surface, on top of the current bridge. All classmethods."""

    ENABLE_ENV = "VERL_RL_INSIGHT_ENABLE"
    MINIMUM_RL_INSIGHT_VERSION = Version("0.3.0")

    # verl keeps these per process; so does the facade (they mirror RL-Insight's own state).
    _registered_metrics: ClassVar[set[tuple[Any, ...]]] = set()
    _lock = threading.Lock()
    _once = OnceLogger(logger)

    @classmethod
    def enabled(cls) -> bool:
        """True iff ``VERL_RL_INSIGHT_ENABLE`` is ``"1"`` (verl sets it when ``trainer.logger`` has ``rl_insight``)."""
        return os.environ.get(cls.ENABLE_ENV, "0") == "1"

    @classmethod
    def init(cls, project_name: str, experiment_name: str, config: Mapping[str, Any] | None = None) -> None:
        """Configure the bridge from the verl config and initialise RL-Insight once, with the run's identity."""
        overrides: dict[str, Any] = {"project": project_name, "experiment_name": experiment_name}
        if cls.enabled():
            overrides["rl_insight_enable"] = True
        bridge = configure(BridgeConfig.from_verl(config or {}, **overrides))
        bridge.rl_insight_probe(initialize=True)

    @classmethod
    def log(cls, data: Mapping[str, Any], step: int | None = None) -> None:
        """verl's metric behaviour: numeric values as gauges named ``key`` with ``/`` -> ``_``; ``step`` ignored."""
        if not cls.enabled():
            return
        probe = cls._usable("log")
        if probe is None or probe.module is None:
            get_bridge().counts.add("verl.metrics_skipped", len(data))
            return
        for key, value in data.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            try:
                probe.module.metric_gauge(str(key).replace("/", "_"), number)
            except Exception as exc:  # noqa: BLE001 - metrics must not break the training step
                get_bridge().counts.add("verl.metrics_failed")
                cls._once.log(f"log:{type(exc).__name__}", logging.WARNING, "rl_insight.metric_gauge raised %r", exc)

    @classmethod
    @contextmanager
    def trace_state(cls, state_name: str, *, state_lane_id: str | None = None, **labels: Any) -> Iterator[None]:
        """RL-Insight's ``trace_state`` when usable; otherwise a bridge span with the same attributes."""
        probe = cls._usable("trace_state") if cls.enabled() else None
        if probe is not None and probe.module is not None:
            with probe.module.trace_state(state_name, state_lane_id=state_lane_id, **labels):
                yield
            return
        attributes = {**labels, "monitor.trace_segment": "state_interval", "state_name": state_name}
        if state_lane_id is not None:
            attributes["state_lane_id"] = state_lane_id
        with get_bridge().span(state_name, **attributes):
            yield

    @classmethod
    def trace_span(
        cls,
        name: str,
        *,
        start_time_ns: int,
        end_time_ns: int,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """Report a completed span; becomes ``record_span`` (exported in the background, never blocking)."""
        get_bridge().record_span(name, start_time_ns=start_time_ns, end_time_ns=end_time_ns, attributes=attributes)

    @classmethod
    def agent_loop_session(
        cls,
        *,
        experiment_name: str | None = None,
        sample: Any,
        session: Any,
        traj: Any = 0,
        uid: Any = None,
        global_steps: Any = None,
        session_id: Any = None,
    ) -> AgentLoopSession:
        """Start an agent-loop session; the identity's project and experiment come from the bridge config."""
        session_ = get_bridge().start_session(
            sample=sample,
            session=session,
            traj=traj,
            uid=uid,
            global_steps=global_steps,
            session_id=session_id,
            experiment_name=experiment_name,
        )
        return AgentLoopSession(session_)

    @classmethod
    def register_metrics(
        cls,
        addrs: Sequence[str],
        job_name: str | None = None,
        labels: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> None:
        """Register Prometheus scrape targets with RL-Insight once per distinct call; errors are logged."""
        key = (tuple(addrs), job_name, repr(labels))
        with cls._lock:
            if key in cls._registered_metrics:
                return
            cls._registered_metrics.add(key)
        probe = cls._usable("register_metrics")
        if probe is None or probe.module is None:
            return
        try:
            probe.module.update_prometheus_config(list(addrs), job_name=job_name, labels=labels)
        except Exception as exc:  # noqa: BLE001
            logger.error("registering metrics endpoints %s with RL-Insight failed: %s", list(addrs), exc)

    @classmethod
    def finish(cls) -> None:
        """Flush and shut the bridge down, then ``rl_insight.finish()`` and reset, as verl's does."""
        bridge = get_bridge()
        probe = bridge.rl_insight_probe()
        bridge.force_flush()
        if probe is not None and probe.module is not None and rl_insight_compat.init_calls():
            try:
                rl_insight_compat.finish(probe.module)
            except Exception as exc:  # noqa: BLE001
                logger.error("rl_insight.finish() raised: %s", exc)
        with cls._lock:
            cls._registered_metrics.clear()

    @staticmethod
    def rollout_state_lane_id(rank: int, prefix: str = "rollout") -> str:
        """verl's lane id for rollout replica ``rank``: ``f"{prefix}_replica_{rank}"``."""
        return f"{prefix}_replica_{rank}"

    @classmethod
    def _usable(cls, feature: str) -> Probe | None:
        """RL-Insight's probe (initialised) if usable for ``feature``; else None, counted and logged once."""
        bridge = get_bridge()
        probe = bridge.rl_insight_probe(initialize=True)
        if probe is not None and probe.usable:
            return probe
        bridge.counts.add(f"verl.{feature}_degraded")
        reason = probe.detail if probe is not None else "the bridge is configured without RL-Insight"
        cls._once.log(
            f"{feature}:{probe.reason if probe else 'none'}",
            logging.WARNING,
            "RLInsightLogger.%s: RL-Insight not usable (%s); degraded, counted in verl_otel_bridge.status()",
            feature,
            reason,
        )
        return None
