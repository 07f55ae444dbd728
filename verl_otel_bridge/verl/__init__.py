"""verl integration: the ``verl.plugins`` entry point (:mod:`.plugin`) and the ``RLInsightLogger`` drop-in.

``from verl_otel_bridge.verl import RLInsightLogger`` replaces
``from verl.utils.tracking import RLInsightLogger``; the plugin traces verl's own
agent loops with no code (``docs/verl.md``).
"""

from verl_otel_bridge.verl.logger import AgentLoopSession, RLInsightLogger

__all__ = ["AgentLoopSession", "RLInsightLogger"]
