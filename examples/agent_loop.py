"""The main job (``make demo``): a simulated async multi-turn agent loop, traced.

The code lives in ``verl_otel_bridge/cli/demo.py`` so that the installed command
``verl-otel-bridge demo`` runs the same thing; read it there. It shows
``session`` / ``task`` / ``turn`` with tool calls, ``@traced`` and
``record_span``, on the default configuration: RL-Insight when usable, otherwise
the local in-memory fallback, printed as a span tree with ``status()``.
"""

from verl_otel_bridge.cli.demo import main

if __name__ == "__main__":
    main()
