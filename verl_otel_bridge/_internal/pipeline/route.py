"""Where a configuration sends spans, and why: one decision read by the pipeline, ``status()`` and ``doctor``."""

from __future__ import annotations

from dataclasses import dataclass

from verl_otel_bridge._internal.captures.run import where
from verl_otel_bridge._internal.config import BridgeConfig

DISABLED = "tracing is disabled (enabled=false or OTEL_SDK_DISABLED=true): every span API is a no-op"


@dataclass(frozen=True)
class Route:
    """The exporters a config asks for, before anything is built or probed.

    Attributes:
        enabled: False when the config (or ``OTEL_SDK_DISABLED``) turned tracing off.
        primary: the first configured exporter name (``auto``, ``rl_insight`` or a local name).
        wants_rl_insight: RL-Insight is the preferred destination (``rl_insight``, or
            ``auto`` unless ``rl_insight_enable`` is false).
        explicit: RL-Insight was asked for by name or by ``rl_insight_enable=true``, so
            being unusable is a WARNING rather than an INFO.
        local: the local exporter: the fallback when RL-Insight is wanted, else the exporter itself.
        copies: exporters that get a copy of every batch.
        why: the configuration that made this decision, in words.
    """

    enabled: bool
    primary: str
    wants_rl_insight: bool
    explicit: bool
    local: str
    copies: tuple[str, ...]
    why: str

    @classmethod
    def of(cls, config: BridgeConfig) -> Route:
        """The route ``config`` asks for."""
        primary, *copies = config.exporters
        wants = primary == "rl_insight" or (primary == "auto" and config.rl_insight_enable is not False)
        explicit = primary == "rl_insight" or config.rl_insight_enable is True
        local = config.fallback if primary in ("auto", "rl_insight") else primary
        if not config.enabled:
            why = DISABLED
        elif primary == "rl_insight":
            why = "exporter=rl_insight"
        elif wants:
            why = (
                "exporter=auto with rl_insight_enable=true"
                if explicit
                else "exporter=auto (RL-Insight when usable, else the fallback)"
            )
        elif primary == "auto":
            why = (
                "exporter=auto with rl_insight_enable=false (VERL_RL_INSIGHT_ENABLE=0, or a verl config whose "
                f"trainer.logger lacks rl_insight), so {local!r}"
            )
        else:
            why = f"exporter={local!r} configured"
        if config.enabled and "jsonl" in (local, *copies):
            why += f"; {where(config)}"
        return cls(config.enabled, primary, wants, explicit, local, tuple(copies), why)

    @property
    def names(self) -> tuple[str, ...]:
        """The local exporters this route builds: ``local`` first, then the copies."""
        return (self.local, *self.copies)
