"""Whole-session sampling, decided when the session ends.

A span that carries a session identity (``state_lane_id``) is held with the other
spans of its session (``state_lane_id`` and ``global_steps``) until the session's
``agent_session`` span ends; then all of them are kept or dropped together. Spans
outside any session pass at once.

A session is kept when any of these holds:

- its group is sampled: ``blake2b(uid)``, read as a fraction of 2**64, is below
  ``session_sample_rate``; the same on every worker and every run, so all rollouts
  of a prompt (a GRPO group) are kept or dropped together;
- it did not succeed: it or any of its spans has status ERROR, or its ``status``
  attribute is other than ``success`` (``error``, ``cancelled``), or ``finished`` is false;
- ``session_keep_slowest`` > 0 and its duration is among the slowest that fraction
  of the sessions of its step ended so far in this process;
- ``session_keep_reward_extremes`` > 0 and its reward (the mean of its tasks'
  ``reward`` and its trajectories' ``reward_score``) is among the highest or lowest
  that fraction of its step's so far.

The last two rules are decided online, at each session's end, so the first sessions
of a step are kept by them. A session still open at a flush, or pushed out when the
held spans pass ``session_hold_max_bytes``, is released kept (unfinished sessions are
always kept), and its later spans follow. Spans dropped are counted ``sampled_out``.
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from verl_otel_bridge._internal.accounting import SAMPLED_OUT, SAMPLING_RELEASED, SpanCounts
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.forks import reinit_after_fork
from verl_otel_bridge._internal.pipeline.queue import span_size
from verl_otel_bridge._internal.protocol import REWARD, REWARD_SCORE, SESSION_SPAN_NAME
from verl_otel_bridge._internal.trajectories import trajectories

#: Decisions remembered for spans that end after their session (e.g. reported in bulk).
MAX_DECISIONS = 100_000
#: Steps whose durations and rewards are remembered for the rank rules.
MAX_STEPS = 16
#: Durations or rewards remembered per step.
MAX_PER_STEP = 100_000

SessionKey = tuple[Any, Any]


@dataclass(frozen=True)
class SamplingSettings:
    """The ``session_*`` settings: sample rate, keep-slowest and reward-extreme fractions, hold bound."""

    rate: float
    keep_slowest: float
    keep_reward_extremes: float
    hold_max_bytes: int

    @classmethod
    def of(cls, config: BridgeConfig) -> SamplingSettings | None:
        """The settings ``config`` asks for, or None when every session is kept (rate 1)."""
        if config.session_sample_rate >= 1:
            return None
        return cls(
            config.session_sample_rate,
            config.session_keep_slowest,
            config.session_keep_reward_extremes,
            config.session_hold_max_bytes,
        )


def group_sampled(uid: object, rate: float) -> bool:
    """Whether the group ``uid`` is kept at ``rate``: the same answer in every process."""
    digest = hashlib.blake2b(str(uid).encode("utf-8", "replace"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < rate * 2**64


class _Ranks:
    """Values seen per step (bounded), to tell whether a new one is among the top or bottom fraction."""

    def __init__(self) -> None:
        self._steps: collections.OrderedDict[Any, list[float]] = collections.OrderedDict()

    def add(self, step: Any, value: float) -> tuple[float, float]:
        """Record ``value``; the fractions of the step's values above it and below it.

        Equal values count half above, half below (mid-ranks): with rewards of 0 or 1,
        no session is an extreme for being one of many equal ones.
        """
        values = self._steps.get(step)
        if values is None:
            values = self._steps[step] = []
            if len(self._steps) > MAX_STEPS:
                self._steps.popitem(last=False)
        if len(values) < MAX_PER_STEP:
            bisect.insort(values, value)
        count = len(values)
        left, right = bisect.bisect_left(values, value), bisect.bisect_right(values, value)
        ties = (right - left - 1) / 2  # other values equal to this one
        return (count - right + ties) / count, (left + ties) / count


class SessionSampler:
    """Holds session spans until their session ends, then passes them on or counts them ``sampled_out``."""

    def __init__(self, settings: SamplingSettings, counts: SpanCounts) -> None:
        self.settings = settings
        self.counts = counts
        self._hold_nothing()
        reinit_after_fork(self._hold_nothing)
        self._decided: collections.OrderedDict[SessionKey, bool] = collections.OrderedDict()
        self._durations = _Ranks()
        self._rewards = _Ranks()

    def _hold_nothing(self) -> None:
        # Also the after-fork hook: spans held in the parent are the parent's to pass on.
        self._lock = threading.Lock()
        self._held: collections.OrderedDict[SessionKey, list[ReadableSpan]] = collections.OrderedDict()
        self._held_bytes: dict[SessionKey, int] = {}
        self._bytes = 0

    @property
    def held(self) -> int:
        """Spans held now."""
        with self._lock:
            return sum(len(spans) for spans in self._held.values())

    def on_end(self, span: ReadableSpan) -> list[ReadableSpan]:
        """The spans to export now, given that ``span`` ended (none, it, or a whole session)."""
        attributes = span.attributes
        lane = attributes.get("state_lane_id") if attributes else None
        if lane is None:
            return [span]
        assert attributes is not None
        key: SessionKey = (lane, attributes.get("global_steps"))
        with self._lock:
            decided = self._decided.get(key)
            if decided is not None:
                if decided:
                    return [span]
                self.counts.add(SAMPLED_OUT)
                return []
            if span.name == SESSION_SPAN_NAME:
                spans = self._take(key)
                spans.append(span)
                keep = self._keep(span, attributes, spans)
                self._remember(key, keep)
                if keep:
                    return spans
                self.counts.add(SAMPLED_OUT, len(spans))
                return []
            self._held.setdefault(key, []).append(span)
            size = span_size(span)
            self._held_bytes[key] = self._held_bytes.get(key, 0) + size
            self._bytes += size
            released: list[ReadableSpan] = []
            while self._bytes > self.settings.hold_max_bytes and self._held:
                oldest = next(iter(self._held))
                released.extend(self._release(oldest))
            return released

    def release_all(self) -> list[ReadableSpan]:
        """Every held span, kept (at a flush or shutdown: their sessions are unfinished)."""
        with self._lock:
            released: list[ReadableSpan] = []
            for key in list(self._held):
                released.extend(self._release(key))
            return released

    def _release(self, key: SessionKey) -> list[ReadableSpan]:
        spans = self._take(key)
        self._remember(key, True)
        self.counts.add(SAMPLING_RELEASED, len(spans))
        return spans

    def _take(self, key: SessionKey) -> list[ReadableSpan]:
        self._bytes -= self._held_bytes.pop(key, 0)
        return self._held.pop(key, [])

    def _remember(self, key: SessionKey, keep: bool) -> None:
        self._decided[key] = keep
        if len(self._decided) > MAX_DECISIONS:
            self._decided.popitem(last=False)

    def _keep(self, session: ReadableSpan, attributes: Mapping[str, Any], spans: list[ReadableSpan]) -> bool:
        settings = self.settings
        step = attributes.get("global_steps")
        keep = group_sampled(attributes.get("uid"), settings.rate) or not _succeeded(attributes, spans)
        if settings.keep_slowest and session.start_time is not None and session.end_time is not None:
            slower, _faster = self._durations.add(step, float(session.end_time - session.start_time))
            keep = keep or slower < settings.keep_slowest
        reward = _reward(spans) if settings.keep_reward_extremes else None
        if reward is not None:
            higher, lower = self._rewards.add(step, reward)
            keep = keep or higher < settings.keep_reward_extremes or lower < settings.keep_reward_extremes
        return keep


def _succeeded(attributes: Mapping[str, Any], spans: list[ReadableSpan]) -> bool:
    if attributes.get("finished") is False or any(span.status.status_code is StatusCode.ERROR for span in spans):
        return False
    status = attributes.get("status")
    return status is None or status == "success"


def _reward(spans: list[ReadableSpan]) -> float | None:
    """The mean of the session's task rewards and trajectory reward scores, if any."""
    found: list[float] = []
    for span in spans:
        attributes = span.attributes or {}
        reward = attributes.get(REWARD)
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            found.append(float(reward))
        for trajectory in trajectories(attributes):
            score = trajectory.get(REWARD_SCORE)
            if isinstance(score, (int, float)) and not isinstance(score, bool):
                found.append(float(score))
    return sum(found) / len(found) if found else None
