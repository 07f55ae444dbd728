"""What turns the tracing of verl's agent loops on: read by the plugin and by the wrappers it installs."""

#: ``1`` (or any on value): trace verl's agent loops whatever its rollout-trace backend; ``0``
#: (or any off value): never; unset: trace iff the backend is :data:`BACKEND`.
SWITCH_ENV = "VERL_OTEL_TRACE"
#: The value of ``actor_rollout_ref.rollout.trace.backend`` that turns tracing on.
BACKEND = "otel"
