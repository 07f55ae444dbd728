"""verl integration: the ``verl.plugins`` entry point (:mod:`.plugin`) and the ``RLInsightLogger`` drop-in.

``from verl_otel_bridge.verl import RLInsightLogger`` replaces
``from verl.utils.tracking import RLInsightLogger``; the plugin traces verl's own
agent loops with no code (``docs/verl.md``); :func:`bridge_config` reads a verl trainer config.
"""

from verl_otel_bridge._internal.verl.config import bridge_config
from verl_otel_bridge._internal.verl.logger import AgentLoopSession, RLInsightLogger

__all__ = ["AgentLoopSession", "RLInsightLogger", "bridge_config"]
