"""Every span name and attribute key the bridge writes: the agent-loop span protocol.

A leaf module (it imports nothing from the package), so the API side that writes
these names and the export side that reads them share one declaration.
``docs/protocol.md`` documents each; ``tests/unit/test_protocol.py`` checks the two agree.
"""

from __future__ import annotations

# -- span names ------------------------------------------------------------------

SESSION_SPAN_NAME = "agent_session"
TASK_SPAN_NAME = "agent_task"
TURN_SPAN_NAME = "agent_turn"
#: A short child of a session span, exported while the session is still open
#: (see ``verl_otel_bridge._internal.inflight``), so a hung session is visible while it hangs.
PROGRESS_SPAN_NAME = "agent_session.progress"

# -- the session identity: the keys RL-Insight's Agent Loop dashboard groups spans by ---

#: Identity keys, in the order RL-Insight 0.3.0 builds them.
PROJECT, EXPERIMENT_NAME, SAMPLE, SESSION, TRAJ = "project", "experiment_name", "sample", "session", "traj"
STATE_LANE_ID, UID, GLOBAL_STEPS, SESSION_ID = "state_lane_id", "uid", "global_steps", "session_id"
IDENTITY_KEYS = (PROJECT, EXPERIMENT_NAME, SAMPLE, SESSION, TRAJ, STATE_LANE_ID, UID, GLOBAL_STEPS, SESSION_ID)
#: ``experiment_name`` when neither the caller nor the config names one
#: (verl's ``RolloutTraceConfig`` uses the same default).
DEFAULT_EXPERIMENT_NAME = "default"

# -- RL-Insight's dashboard keys -------------------------------------------------------

#: Marks spans for RL-Insight's dashboard: :data:`SESSION_SOURCE` for sessions, :data:`TASK_SOURCE` for tasks.
TRACE_SOURCE = "monitor.trace_source"
SESSION_SOURCE = "session"
TASK_SOURCE = "task"
#: Per-trajectory summaries (``chain_id``, ``reward_score``, ``num_turns``) as a JSON
#: list, so RL-Insight's trajectory gauges can be published from the exported span.
TRAJECTORIES = "monitor.trajectories"
CHAIN_ID, REWARD_SCORE, NUM_TURNS = "chain_id", "reward_score", "num_turns"
TRAJECTORY_FIELDS = (CHAIN_ID, REWARD_SCORE, NUM_TURNS)
#: How a session or task ended (``success``, ``error``, ``cancelled``, ``unfinished``, or the caller's).
STATUS = "status"
#: The ``status`` of a session the bridge ended at shutdown because it was still open.
UNFINISHED = "unfinished"
#: A task's reward (``TaskHandle.set_result``) and its error text.
REWARD = "reward"
ERROR = "error"
FINISHED = "finished"
#: What ``Session.finish`` sets on the session span (the dashboard's Session summary).
RUNNER_NAME = "runner_name"
NUM_TRAJECTORIES = "num_trajectories"
REWARD_SOURCE = "reward_source"
SESSION_RESULT_KEYS = (RUNNER_NAME, STATUS, NUM_TRAJECTORIES, REWARD_SOURCE, FINISHED)
#: What ``TaskHandle.set_result`` sets (the dashboard's Task summary).
TASK_NAME = "task_name"
ACCURACY = "accuracy"
REWARD_POSTED = "reward_posted"
TASK_RESULT_KEYS = (STATUS, REWARD, ACCURACY, FINISHED, ERROR, REWARD_POSTED)
#: What a turn carries: an integer ``turn`` and its ``type`` (the dashboard's Turn details).
TURN = "turn"
TURN_TYPE = "type"
#: The turn types the dashboard knows (``turn(type=...)``); others are passed through.
GENERATE_TURN, TOOL_TURN = "generate", "tool"
FINISH_REASON = "finish_reason"
PROMPT_TOKENS = "prompt_tokens"
COMPLETION_TOKENS = "completion_tokens"
TOOLS = "tools"
TOOL_ARGS = "tool_args"
CONTENT = "content"
REASONING = "reasoning"
TURN_RECORD_KEYS = (FINISH_REASON, PROMPT_TOKENS, COMPLETION_TOKENS, TOOLS, TOOL_ARGS, CONTENT, REASONING)

# -- progress records: what an ``agent_session.progress`` span carries besides the identity --

#: Seconds since the session started.
PROGRESS_ELAPSED_S = "progress.elapsed_s"
#: Turn spans started in the session so far.
PROGRESS_TURNS = "progress.turns"
#: The ``turn`` of the last turn span started, absent before the first turn.
PROGRESS_TURN = "progress.turn"
#: Name of the last span started in the session (what it is doing, or stuck in).
PROGRESS_LAST_SPAN = "progress.last_span"
#: Seconds since that span started.
PROGRESS_IDLE_S = "progress.idle_s"

# -- OpenTelemetry semantic conventions ---------------------------------------------------

#: The LLM server a turn ran on, when the caller sets it (``turn(..., **{SERVER_ADDRESS: addr})``);
#: ``verl-otel-bridge report`` shows it for the slowest sessions.
SERVER_ADDRESS = "server.address"

# -- OpenTelemetry GenAI semantic conventions -------------------------------------------

GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
#: ``gen_ai.operation.name`` of sessions and tasks, of generate turns and of tool turns.
INVOKE_AGENT, CHAT, EXECUTE_TOOL = "invoke_agent", "chat", "execute_tool"
#: ``turn(type=...)`` -> ``gen_ai.operation.name``; other types are passed through.
TURN_OPERATIONS = {GENERATE_TURN: CHAT, TOOL_TURN: EXECUTE_TOOL}
#: Each dashboard turn field and its GenAI twin (``finish_reason`` becomes a one-item list).
GEN_AI_TWINS = {
    FINISH_REASON: "gen_ai.response.finish_reasons",
    PROMPT_TOKENS: "gen_ai.usage.input_tokens",
    COMPLETION_TOKENS: "gen_ai.usage.output_tokens",
    TOOLS: "gen_ai.tool.name",
    TOOL_ARGS: "gen_ai.tool.call.arguments",
}

# -- what the hub path adds: RL-Insight's ``trace_span`` has no ids or status ------------

TRACE_ID = "otel.trace_id"
SPAN_ID = "otel.span_id"
PARENT_SPAN_ID = "otel.parent_span_id"
STATUS_CODE = "otel.status_code"
STATUS_DESCRIPTION = "otel.status_description"

# -- what the verl plugin adds (verl_otel_bridge._internal.verl.tracing) ------------------------------

#: On the session span, from verl's trajectory and its ``_run_agent_loop`` result
#: (besides :data:`REWARD_SCORE` and :data:`NUM_TURNS`).
VALIDATE = "validate"
AGENT_NAME = "agent_name"
REWARD_EXTRA_INFO = "reward_extra_info"
RESPONSE_LENGTH = "response_length"
#: On the session span: verl's own per-trajectory metrics (``AgentLoopMetrics``), prefixed.
VERL_METRIC_PREFIX = "verl."
VERL_METRICS = ("verl.generate_sequences", "verl.tool_calls", "verl.compute_score", "verl.num_preempted")
#: On a generate turn, besides the turn fields: cached prompt tokens (and ``SERVER_ADDRESS``: the
#: server the load balancer chose, verl's server id, which is its address).
CACHED_TOKENS = "cached_tokens"
GEN_AI_CACHED_TOKENS = "gen_ai.usage.cache_read.input_tokens"
NUM_PREEMPTED = "num_preempted"
#: On a tool turn, besides the turn fields: the tool's reward, its metrics (JSON) and latency.
TOOL_REWARD = "tool_reward"
TOOL_METRICS = "tool_metrics"
LATENCY_MS = "latency_ms"
#: On a failed tool turn (status ERROR): what failed, the exception's class name or one of
#: ``tool_exception``, ``unknown_tool``, ``invalid_tool_arguments`` (verl answered with its error text).
ERROR_TYPE = "error.type"
#: On the session span: how many of its tool calls failed (its ``status`` stays verl's).
FAILED_TOOL_CALLS = "failed_tool_calls"

# -- the trainer's steps (verl_otel_bridge._internal.verl.trainer) -------------------------------------

#: One per training step on the trainer: ``project``, ``experiment_name`` and ``global_steps``.
TRAINING_STEP_SPAN_NAME = "training_step"
#: On each phase span (named by verl's timer, e.g. ``gen``): that name, so a phase is known by it.
PHASE = "training.phase"
#: Records in a step's trace holding the step's metrics as verl logged them, under
#: ``STEP_METRIC_PREFIX`` + verl's key (e.g. ``metric.timing_s/gen``); each record also carries
#: the step's ``project``, ``experiment_name`` and ``global_steps``.
STEP_METRICS_SPAN_NAME = "training_step.metrics"
STEP_METRIC_PREFIX = "metric."

# -- how sessions and tasks end ----------------------------------------------------------

#: ``finish(status=...)`` / ``set_result(status=...)`` values (lower-cased) that end the span with status ERROR.
FAILED_STATUSES = ("error", "failed", "failure", "cancelled", "canceled", "aborted", "timeout")
SUCCESS = "success"
#: Every ``status`` value the protocol names (compared lower-cased); another is kept as given, with a warning.
KNOWN_STATUSES = (SUCCESS, *FAILED_STATUSES, UNFINISHED)

# -- inputs and outputs (``record_io``) and the native keys the generic vocabulary reads ---

INPUT = "input"
OUTPUT = "output"
#: A generate turn that continues its trajectory's previous generate turn records only what was appended to
#: that turn's prompt and response (tool replies, template text), and which turn it continues; readers and
#: ``exporter: otlp`` rebuild its whole ``input`` (:mod:`verl_otel_bridge._internal.conversation`).
INPUT_APPENDED = "input.appended"
INPUT_AFTER_TURN = "input.after_turn"
#: What ``redact_attributes`` makes a value (a conversation rebuilt from a redacted piece is redacted whole).
REDACTED = "[REDACTED]"

# -- the generic vocabulary: what ``exporter: otlp`` adds for OpenInference / GenAI backends ---

#: Native identity key -> its key in the generic vocabulary (keys not listed are kept):
#: Phoenix nests attributes by their dots, so a plain ``session`` would hide ``session.id``.
GENERIC_IDENTITY_KEYS = {SESSION: "session.index"}
SESSION_ID = "session.id"
USER_ID = "user.id"
SPAN_KIND = "openinference.span.kind"
#: ``openinference.span.kind`` by span name, and by ``gen_ai.operation.name`` for the
#: operations the backends do not map themselves (``chat`` they do: LLM / CHAT_MODEL).
NAME_KINDS = {SESSION_SPAN_NAME: "AGENT", TASK_SPAN_NAME: "CHAIN"}
OPERATION_KINDS = {INVOKE_AGENT: "AGENT", EXECUTE_TOOL: "TOOL"}
REWARD_KIND = "EVALUATOR"
DEFAULT_KIND = "CHAIN"
INPUT_VALUE = "input.value"
INPUT_MIME_TYPE = "input.mime_type"
OUTPUT_VALUE = "output.value"
OUTPUT_MIME_TYPE = "output.mime_type"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
#: OpenInference token counts, from the GenAI usage keys.
TOKEN_COUNTS = {
    "llm.token_count.prompt": "gen_ai.usage.input_tokens",
    "llm.token_count.completion": "gen_ai.usage.output_tokens",
}
TOKEN_TOTAL = "llm.token_count.total"  # noqa: S105 - an attribute key, not a password
METADATA = "metadata"
#: A root-span attribute MLflow turns into the trace tag ``reward``.
MLFLOW_REWARD_TAG = "mlflow.traceTag.reward"
EVALUATION_EVENT = "gen_ai.evaluation.result"
EVALUATION_NAME = "gen_ai.evaluation.name"
EVALUATION_SCORE = "gen_ai.evaluation.score.value"
#: Resource attribute naming Phoenix's project.
PROJECT_RESOURCE = "openinference.project.name"
