"""Surviving ``os.fork()``: objects that own locks or threads recreate them in the child."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable


def reinit_after_fork(method: Callable[[], object]) -> None:
    """Call the bound ``method`` in every child forked from now on, while its object lives.

    A lock held by another thread at the moment of ``fork`` stays held forever in
    the child; ``method`` replaces such locks (and restarts threads). The object is
    referenced weakly, so registering does not keep it alive.
    """
    ref = weakref.WeakMethod(method)

    def in_child() -> None:
        bound = ref()
        if bound is not None:
            bound()

    os.register_at_fork(after_in_child=in_child)
