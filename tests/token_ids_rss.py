"""Peak memory growth of a process ending spans with 200,000-element token-id lists, as a script of its own.

``python tests/token_ids_rss.py SETTINGS_JSON SPANS``: configures the bridge with ``exporter: otlp``,
``spill_after_s`` 0.1, ``spill_probe_s`` 600, an empty environment and the settings given (typically an
endpoint nothing listens on, ``spill_dir`` and bounds), ends one warm-up span and then ``SPANS`` spans, each
with a fresh list of ints, and prints one JSON line: ``growth`` (peak RSS growth in bytes), ``queued_bytes``
and the ``counters``. Run by tests/unit/test_noloss.py and bench/noloss.py.
"""

import json
import resource
import sys

import verl_otel_bridge as vob


def rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(settings: dict[str, object], spans: int) -> None:
    bridge = vob.configure(exporter="otlp", spill_after_s=0.1, spill_probe_s=600, environ={}, **settings)
    with vob.span("warm", ids=list(range(1_000, 201_000))):
        pass
    before = rss()
    for i in range(spans):
        with vob.span("sample", ids=list(range(1_000 + i, 201_000 + i))):  # fresh int objects, as token ids are
            pass
    bridge.force_flush(60)
    status = bridge.status()
    print(
        json.dumps(
            {"growth": rss() - before, "queued_bytes": status["pending"]["bytes"], "counters": status["counters"]}
        )
    )
    bridge.shutdown(timeout_s=5)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), int(sys.argv[2]))
