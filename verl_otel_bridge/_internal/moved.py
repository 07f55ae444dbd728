"""Documented import paths of modules now under :mod:`verl_otel_bridge._internal`, kept for one release.

``import verl_otel_bridge.inflight`` (or any module below an old package, such as
``verl_otel_bridge.otlp.encoding``) warns ``DeprecationWarning`` naming what to
import instead, and gives the very module that now lives under ``_internal``, so
its objects are the same ones. An import hook answers these names: no file sits at
an old path, and a name the package already binds (``verl_otel_bridge.status``,
``verl_otel_bridge.session``: functions) is never an alias.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.abc import Loader
else:  # importing importlib.abc would load importlib.resources too: the loader protocol is enough at run time
    Loader = object

_PACKAGE = "verl_otel_bridge"
_INTERNAL = f"{_PACKAGE}._internal"

#: old module (with everything below it; the longest match applies) -> what replaces it, or None: nothing public.
MOVED: dict[str, str | None] = {
    f"{_PACKAGE}.tree": f"from {_PACKAGE}.testing import render_tree",
    f"{_PACKAGE}.current": f"the functions of {_PACKAGE} (configure, get_bridge, set_bridge, status, ...)",
    f"{_PACKAGE}.exporters.vocabulary": f"from {_PACKAGE}.testing import generic_span",
    f"{_PACKAGE}.accounting": f"the counters of {_PACKAGE}.status()",
    f"{_PACKAGE}.exporters": None,
    f"{_PACKAGE}.inflight": None,
    f"{_PACKAGE}.otlp": None,
    f"{_PACKAGE}.pipeline": None,
}


#: Old modules that moved elsewhere than ``_internal`` + their old path.
RENAMED = {f"{_PACKAGE}.exporters.vocabulary": f"{_INTERNAL}.vocabulary"}


def internal_name(old: str) -> str:
    """Where the module once imported as ``old`` lives now."""
    renamed = next((m for m in RENAMED if old == m or old.startswith(f"{m}.")), None)
    if renamed is not None:
        return f"{RENAMED[renamed]}{old[len(renamed) :]}"
    return f"{_INTERNAL}{old[len(_PACKAGE) :]}"


def deprecation_message(old: str) -> str | None:
    """The warning an import of ``old`` gives, or None when ``old`` is no moved module."""
    moved = max((m for m in MOVED if old == m or old.startswith(f"{m}.")), key=len, default=None)
    if moved is None:
        return None
    instead = MOVED[moved]
    use = f"use {instead}" if instead else f"it is internal now ({internal_name(old)}, no stable API)"
    return f"{old} is deprecated and will be removed in the next release: {use}"


class _MovedModules(Loader):
    """A meta path finder and loader: an old path gets the module at its new one, after a ``DeprecationWarning``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        message = deprecation_message(fullname)
        if message is None or importlib.util.find_spec(internal_name(fullname)) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # stacklevel 2 is the importing line: the warnings module skips importlib's own frames.
        warnings.warn(str(deprecation_message(spec.name)), DeprecationWarning, stacklevel=2)
        module = importlib.import_module(internal_name(spec.name))
        spec.loader_state = module.__spec__  # importlib sets the alias's spec on the module: exec_module undoes it
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the module was imported under its new name) but giving it back its own spec."""
        assert module.__spec__ is not None
        module.__spec__ = module.__spec__.loader_state


def install() -> None:
    """Answer the old paths from now on in this process (idempotent)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        # First: below an old package the path finder would otherwise load a second copy of a module.
        sys.meta_path.insert(0, _MovedModules())
