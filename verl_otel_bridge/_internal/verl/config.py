"""The bridge's configuration read from a verl trainer config (verl 0.9.1's layout)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_otel_bridge._internal.config import BridgeConfig

#: The bridge's own section of a verl config: any keys of :class:`~verl_otel_bridge.BridgeConfig`.
SECTION = ("actor_rollout_ref", "rollout", "trace", "otel_bridge")


def bridge_config(
    verl_config: Mapping[str, Any], /, *, environ: Mapping[str, str] | None = None, **overrides: Any
) -> BridgeConfig:
    """Build the config from a verl trainer config (a mapping or OmegaConf ``DictConfig``).

    Reads ``trainer.project_name`` -> ``project``, ``trainer.experiment_name``
    -> ``experiment_name``, ``trainer.logger`` (RL-Insight is wanted iff it
    lists ``rl_insight``) -> ``rl_insight_enable``, ``trainer.rl_insight`` ->
    ``rl_insight_config``, and the bridge's own section
    ``actor_rollout_ref.rollout.trace.otel_bridge`` (any keys of ``BridgeConfig``).
    Keyword overrides win over all of it; the environment fills the rest.

    Raises:
        ConfigError: a key in the ``otel_bridge`` section is unknown, or a value is bad.
    """
    trainer = _section(verl_config, "trainer")
    values: dict[str, Any] = {}
    if trainer.get("project_name") is not None:
        values["project"] = trainer["project_name"]
    if trainer.get("experiment_name") is not None:
        values["experiment_name"] = trainer["experiment_name"]
    loggers = trainer.get("logger")
    if loggers is not None:
        names = [loggers] if isinstance(loggers, str) else list(loggers)
        values["rl_insight_enable"] = "rl_insight" in names
    if trainer.get("rl_insight") is not None:
        values["rl_insight_config"] = trainer["rl_insight"]
    values.update(bridge_section(verl_config))
    values.update(overrides)
    return BridgeConfig.resolve(values, environ=environ)


def bridge_section(verl_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The bridge's own section of ``verl_config`` (:data:`SECTION`), empty when it has none."""
    section: Any = verl_config
    for key in SECTION:
        section = _section(section, key)
    return section  # type: ignore[no-any-return]


def _section(mapping: Any, key: str) -> Mapping[str, Any]:
    if not isinstance(mapping, Mapping):
        return {}
    value = mapping.get(key)
    return value if isinstance(value, Mapping) else {}
