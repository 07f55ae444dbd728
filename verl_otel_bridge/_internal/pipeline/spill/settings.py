"""Where and how much to spill, and the two origins a spilled span can have."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_otel_bridge._internal.config import BridgeConfig, default_spill_dir
from verl_otel_bridge._internal.records import redaction_keys

#: Spilled by the export queue (never exported): drained through the whole exporter chain.
FROM_QUEUE = "queue"
#: Refused by the destination (copies and redaction already done): drained straight back to it.
FROM_DESTINATION = "destination"

#: The spill's write buffer holds a quarter of ``max_queue_bytes``, and at least this much.
MIN_BUFFER_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class SpillSettings:
    """Where and how much to spill.

    Attributes:
        spill_dir: the spill files' directory (made private to the user, or refused).
        spill_max_bytes: the files' total size at most (> 0).
        buffer_bytes: estimated bytes of refused spans waiting to be written at most.
        max_export_batch_size: spans per drained batch.
        spill_after_s: the destination counts as down once it refused every batch this long.
        spill_probe_s: while it is down, one batch is tried this often.
        redact_attributes: attribute keys replaced by ``[REDACTED]`` before a queue span is written.
    """

    spill_dir: str
    spill_max_bytes: int
    buffer_bytes: int
    max_export_batch_size: int
    spill_after_s: float
    spill_probe_s: float
    redact_attributes: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, config: BridgeConfig) -> SpillSettings | None:
        """The settings ``config`` asks for, or None when spilling is off (``spill_max_bytes=0``)."""
        if not config.spill_max_bytes:
            return None
        return cls(
            spill_dir=config.spill_dir or default_spill_dir(),
            spill_max_bytes=config.spill_max_bytes,
            buffer_bytes=max(config.max_queue_bytes // 4, MIN_BUFFER_BYTES),
            max_export_batch_size=config.max_export_batch_size,
            spill_after_s=config.spill_after_s,
            spill_probe_s=config.spill_probe_s,
            redact_attributes=redaction_keys(config.redact_attributes),
        )
