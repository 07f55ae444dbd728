"""The spill: spans that cannot wait in memory, or that the destination refused, wait in local files.

Files are JSON Lines of :mod:`verl_otel_bridge._internal.records` (plus ``spilled_from``), one
set per process in ``spill_dir`` (``spill-<host>-<pid>-<n>.jsonl``), each at most a
quarter of ``spill_max_bytes``, together at most ``spill_max_bytes``. The directory
is private to the user (:mod:`verl_otel_bridge._internal.private_files`: ``0700``, owner and
mode checked, never a link; an unsafe one is refused with a WARNING and nothing is
spilled); files are created ``0600`` with ``O_EXCL | O_NOFOLLOW`` and written and read
through the descriptor kept from their creation, never reopened by name.

By job:

* :mod:`.segments`: the files (create, append whole lines, read back, delete);
* :mod:`.spill`: :class:`Spill`, which writes spans (those the export queue refused
  through a byte-bounded buffer on a thread of its own, those the destination
  refused on the export thread) and counts what does not fit;
* :mod:`.drain`: the thread that sends the oldest file back whenever the destination
  answers, whatever happened to the files meanwhile.

The export chain (:mod:`verl_otel_bridge._internal.pipeline.chain`) spills what the
destination refuses and decides, from its health, when the drain may try it.

Accounting: a span written is counted ``spilled`` (and ``spill_written``); when the
drain reads it back, it leaves ``spilled`` (counted ``spill_drained``) and is counted
wherever the exporters put it (``exported``, ``fallback``, ``failed``, or ``spilled``
again if the destination refused it again). A span the drain cannot read back (its
line unreadable, its file cut short or unreadable) leaves ``spilled`` as ``failed``.
A span that finds the spill full (or unwritable) is ``dropped``.

The bridge never sends a span twice: a span is spilled only after the destination
refused it, and the drain reads each line once. Delivery from the files is
at-least-once: a file the drain had begun stays whole on disk until read to its end,
so replaying it (``verl-otel-bridge replay``) after the process died may resend
spans the drain had already delivered.
"""

from verl_otel_bridge._internal.pipeline.spill.settings import FROM_DESTINATION, FROM_QUEUE, SpillSettings
from verl_otel_bridge._internal.pipeline.spill.spill import Spill

__all__ = ["FROM_DESTINATION", "FROM_QUEUE", "Spill", "SpillSettings"]
