"""The plugin's switches: what turns the tracing of verl's agent loops on, and which ``RLInsightLogger`` verl gets."""

#: ``1`` (or any on value): trace verl's agent loops whatever its rollout-trace backend; ``0``
#: (or any off value): never; unset: trace iff the backend is :data:`BACKEND`.
SWITCH_ENV = "VERL_OTEL_TRACE"
#: The value of ``actor_rollout_ref.rollout.trace.backend`` that turns tracing on.
BACKEND = "otel"
#: Which class verl's own lookups of ``RLInsightLogger`` get while RL-Insight is selected: ``bridge`` (the
#: default: the plugin's) or ``verl`` (verl's own, untouched).
RL_INSIGHT_LOGGER_ENV = "VERL_OTEL_RL_INSIGHT_LOGGER"
RL_INSIGHT_LOGGERS = ("bridge", "verl")
