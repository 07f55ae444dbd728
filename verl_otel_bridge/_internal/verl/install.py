"""Wrap a verl module's targets when verl imports it: what the plugin's post-import hooks call.

The targets, their kinds and wrappers are :data:`~verl_otel_bridge._internal.verl.targets.TARGETS`;
each is checked first (:func:`~verl_otel_bridge._internal.verl.wrapping.recognised`). A target that
fails to wrap is logged at WARNING and left as verl has it; nothing raises into verl's import.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from verl_otel_bridge._internal.verl import logger as logger_wrappers
from verl_otel_bridge._internal.verl import runs, tracing, trainer
from verl_otel_bridge._internal.verl.targets import Kind, Target, targets_of
from verl_otel_bridge._internal.verl.wrapping import PATCHED, patch, recognised, resolve

logger = logging.getLogger(__name__)

#: The modules the table's wrappers (``"<module>.<function>"``) are functions of.
_WRAPPER_MODULES: dict[str, ModuleType] = {
    "tracing": tracing,
    "trainer": trainer,
    "logger": logger_wrappers,
    "runs": runs,
}


def install(module: ModuleType) -> None:
    """Wrap ``module``'s targets in table order; after an anchor that is not as expected, none of the rest."""
    for target in targets_of(module.__name__):
        if not recognised(module, target):
            if target.anchor:
                return
            continue
        if target.wrapper is None:
            continue
        try:
            _install(module, target, wrapper_of(target))
        except Exception:
            logger.warning(
                "verl_otel_bridge: wrapping %s failed; it is not traced", target.qualified_name, exc_info=True
            )


def wrapper_of(target: Target) -> Any:
    """The function ``target.wrapper`` names."""
    assert target.wrapper is not None
    owner, _, name = target.wrapper.partition(".")
    return getattr(_WRAPPER_MODULES[owner], name)


def _install(module: ModuleType, target: Target, wrapper: Any) -> None:
    if target.kind is Kind.METHOD:
        owner, _, method = target.name.rpartition(".")
        patch(resolve(module, owner), method, wrapper)
        return
    original = vars(module)[target.name]
    if getattr(original, PATCHED, False):
        return
    replacement = wrapper(original, module)
    if replacement is not original:
        setattr(module, target.name, replacement)
