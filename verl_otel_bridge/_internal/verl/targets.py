"""What the verl plugin touches in verl, declared once: the modules, the names in them, the parameters and the
fields its wrappers read, and the wrapper of each.

Read by the plugin (which modules to hook), by the installer (what to wrap, and the check that a verl
method still looks as expected), by ``doctor`` and by the source-contract test (both check verl's source
against it without importing verl). A leaf (it imports only constants): it names each wrapper by
its module and function (``"tracing.run_agent_loop"`` is a function of
:mod:`verl_otel_bridge._internal.verl.tracing`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from verl_otel_bridge._internal import protocol as p
from verl_otel_bridge._internal.config import RL_INSIGHT_ENABLE_ENV

#: The oldest verl the plugin supports, and the first that loads ``verl.plugins`` entry points at ``import verl``
#: (older ones load the modules named in :data:`EXTERNAL_MODULES_ENV` only).
OLDEST_VERL = "0.8.0"
FIRST_VERL_LOADING_PLUGINS = "0.9.0"
#: verl's variable naming modules ``import verl`` imports (a comma list), in every verl the plugin supports.
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
#: verl's variable choosing the ``verl.plugins`` entry points it loads (``none``: none).
EXTERNAL_PLUGINS_ENV = "VERL_USE_EXTERNAL_PLUGINS"
#: The entry point group verl loads, and the plugin's module (what :data:`EXTERNAL_MODULES_ENV` names).
ENTRY_POINT_GROUP = "verl.plugins"
PLUGIN_MODULE = "verl_otel_bridge.verl.plugin"


class Kind(enum.Enum):
    """How the installer treats a target."""

    #: ``Class.method`` replaced by a function calling ``wrapper(original, self, args, kwargs)``.
    METHOD = "method"
    #: A module attribute (a function, or a class) replaced by ``wrapper(original, module)``'s result.
    ATTRIBUTE = "attribute"
    #: Read by a wrapper, not replaced: only checked.
    READ = "read"


@dataclass(frozen=True)
class Uses:
    """Something of verl's source a wrapper depends on beyond a target's parameters.

    ``field``: the class ``scope`` of ``module`` declares ``name`` (an annotation, an assignment
    in its body, or ``self.<name> = ...`` in a method; its bases in verl included).
    ``literal``: the string ``name`` occurs in ``scope`` (a function or ``Class.method``; None:
    the whole module), e.g. a dict key verl writes.
    ``prefix``: a string, or an f-string's leading text, starting with ``name`` occurs in ``scope``.
    ``returns``: every ``return`` of the function ``scope`` returns a tuple of ``int(name)`` items.
    """

    kind: str
    module: str
    scope: str | None
    name: str
    #: Not in every supported verl; without it the wrapper records nothing for it.
    optional: bool = False

    def __str__(self) -> str:
        where = f"{self.module}.{self.scope}" if self.scope else self.module
        return f"{self.kind} {self.name!r} of {where}"


@dataclass(frozen=True)
class Target:
    """One name of verl the plugin wraps or reads.

    Attributes:
        module: the verl module.
        name: the name in it: ``function``, ``Class`` or ``Class.method``.
        kind: how it is installed (:class:`Kind`).
        parameters: the parameters the wrapper reads by name (a class: its constructor's).
        uses: what else of verl's source the wrapper reads (:class:`Uses`).
        wrapper: ``"<module of verl_otel_bridge._internal.verl>.<function>"``; None for :attr:`Kind.READ`.
        anchor: if this target is not as expected, the module's later targets are not wrapped either.
        optional: absent in some supported verl (no warning then).
    """

    module: str
    name: str
    kind: Kind
    parameters: tuple[str, ...] = ()
    uses: tuple[Uses, ...] = ()
    wrapper: str | None = None
    anchor: bool = False
    optional: bool = False

    @property
    def qualified_name(self) -> str:
        return f"{self.module}.{self.name}"


ROLLOUT_TRACE = "verl.utils.rollout_trace"
AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
TOOL_AGENT_LOOP = "verl.experimental.agent_loop.tool_agent_loop"
LLM_SERVER = "verl.workers.rollout.llm_server"
RAY_TRAINER = "verl.trainer.ppo.ray_trainer"
CONSTANTS_PPO = "verl.trainer.constants_ppo"
TRACKING = "verl.utils.tracking"

#: The class verl's own code builds or calls for RL-Insight (selected by ``RL_INSIGHT_ENABLE_ENV``).
RL_INSIGHT_LOGGER = "RLInsightLogger"
#: How verl's ``ToolAgentLoop._call_tool`` answers a failed tool call (its result text starts so), and the
#: ``error.type`` the tool turn gets for each.
TOOL_ERRORS = (
    ("Error executing tool '", "tool_exception"),
    ("Unknown function '", "unknown_tool"),
    ("Invalid JSON in arguments for '", "invalid_tool_arguments"),
)
#: The fields of ``AgentLoopOutput.metrics`` the session records (as ``verl.<field>``).
AGENT_LOOP_METRICS = tuple(key[len(p.VERL_METRIC_PREFIX) :] for key in p.VERL_METRICS)

_TRACE_CONFIG = tuple(
    Uses("field", ROLLOUT_TRACE, "RolloutTraceConfig", name)
    for name in ("backend", "project_name", "experiment_name", "token2text")
)
_LOOP_OUTPUT = (
    *(Uses("field", AGENT_LOOP, "AgentLoopOutput", name) for name in ("reward_score", "num_turns", "response_ids")),
    Uses("field", AGENT_LOOP, "AgentLoopOutput", "metrics"),
    Uses("field", AGENT_LOOP, "AgentLoopOutput", "extra_fields"),
    *(Uses("field", AGENT_LOOP, "AgentLoopMetrics", name) for name in AGENT_LOOP_METRICS),
)
_META_INFO = Uses("field", "verl.protocol", "DataProto", "meta_info")
_CALL_TOOL = "ToolAgentLoop._call_tool"
#: verl's modules that name ``RLInsightLogger`` (the class itself, or imported by name), besides ``TRACKING``.
RL_INSIGHT_LOGGER_USERS = (
    LLM_SERVER,
    "verl.utils.profiler.profile",
    "verl.workers.rollout.vllm_rollout.vllm_async_server",
    "verl.workers.rollout.sglang_rollout.async_sglang_server",
)

TARGETS: tuple[Target, ...] = (
    # verl's rollout-trace decorator: its agent-loop, tool and client modules import it by name, later.
    Target(ROLLOUT_TRACE, "RolloutTraceConfig.get_backend", Kind.READ, anchor=True),
    Target(ROLLOUT_TRACE, "RolloutTraceConfig.get_instance", Kind.READ, uses=_TRACE_CONFIG, anchor=True),
    Target(ROLLOUT_TRACE, "rollout_trace_op", Kind.ATTRIBUTE, ("func",), wrapper="tracing.rollout_trace_op"),
    # One session per trajectory; without it nothing else of the module has a place to go.
    Target(
        AGENT_LOOP,
        "AgentLoopWorker._run_agent_loop",
        Kind.METHOD,
        ("sampling_params", "trajectory", "agent_name", "trace"),
        (
            *(Uses("literal", AGENT_LOOP, "get_trajectory_info", key) for key in ("step", "sample_index")),
            *(Uses("literal", AGENT_LOOP, "get_trajectory_info", key) for key in ("rollout_n", "validate")),
            Uses("literal", AGENT_LOOP, "AgentLoopWorker._compute_score", "reward_extra_info"),
            Uses("literal", AGENT_LOOP, None, "raw_prompt"),
            Uses("literal", RAY_TRAINER, None, "uid"),
            Uses("field", AGENT_LOOP, "AgentLoopWorker", "tokenizer"),
            *_LOOP_OUTPUT,
        ),
        wrapper="tracing.run_agent_loop",
        anchor=True,
    ),
    Target(
        AGENT_LOOP,
        "AgentLoopWorker.__init__",
        Kind.METHOD,
        ("config",),
        (Uses("field", AGENT_LOOP, "AgentLoopWorker", "config"),),
        wrapper="tracing.worker_init",
    ),
    Target(
        AGENT_LOOP,
        "AgentLoopWorker.generate_sequences",
        Kind.METHOD,
        ("batch",),
        (_META_INFO,),
        wrapper="tracing.worker_generate_sequences",
    ),
    Target(
        AGENT_LOOP,
        "AgentLoopManager.generate_sequences",
        Kind.METHOD,
        ("prompts",),
        (_META_INFO, Uses("field", AGENT_LOOP, "AgentLoopManager", "config")),
        wrapper="tracing.manager_generate_sequences",
    ),
    # Wraps the ``run`` of each loop class when its first instance is made.
    Target(AGENT_LOOP, "AgentLoopBase.__init__", Kind.METHOD, wrapper="tracing.loop_init"),
    Target(
        TOOL_AGENT_LOOP,
        _CALL_TOOL,
        Kind.METHOD,
        ("tool_call", "tools_kwargs", "agent_data"),
        (
            Uses("field", "verl.experimental.agent_loop.tool_parser", "FunctionCall", "name"),
            Uses("field", "verl.experimental.agent_loop.tool_parser", "FunctionCall", "arguments"),
            Uses("field", "verl.tools.schemas", "ToolResponse", "text"),
            Uses("returns", TOOL_AGENT_LOOP, _CALL_TOOL, "3"),
            *(Uses("prefix", TOOL_AGENT_LOOP, _CALL_TOOL, prefix) for prefix, _ in TOOL_ERRORS),
        ),
        wrapper="tracing.call_tool",
    ),
    Target(
        LLM_SERVER,
        "LLMServerClient.generate",
        Kind.METHOD,
        ("request_id", "prompt_ids"),
        (
            *(
                Uses("field", "verl.workers.rollout.replica", "TokenOutput", name)
                for name in ("token_ids", "stop_reason", "num_preempted", "extra_fields")
            ),
            Uses("literal", LLM_SERVER, None, "num_cached_tokens", optional=True),  # from verl 0.9.1
        ),
        wrapper="tracing.generate",
    ),
    Target(
        LLM_SERVER, "LLMServerClient._acquire_server", Kind.METHOD, ("request_id",), wrapper="tracing.acquire_server"
    ),
    # The driver names the capture run for every worker (verl 0.9.0 and later pass the config; 0.8.0 does not).
    Target(CONSTANTS_PPO, "get_ppo_ray_runtime_env", Kind.ATTRIBUTE, wrapper="runs.runtime_env"),
    # One trace per training step: each phase's timer, and the step logged.
    Target(RAY_TRAINER, "marked_timer", Kind.ATTRIBUTE, ("name", "timing_raw"), wrapper="trainer.phase_timers"),
    Target(RAY_TRAINER, "RayPPOTrainer.fit", Kind.METHOD, wrapper="trainer.fit"),
    Target(
        TRACKING,
        "Tracking.__init__",
        Kind.METHOD,
        ("project_name", "experiment_name", "config"),
        wrapper="trainer.tracking_init",
    ),
    Target(TRACKING, "Tracking.log", Kind.METHOD, ("data", "step"), wrapper="trainer.tracking_log"),
    # verl's RLInsightLogger, where verl defines it (``Tracking`` builds it) and everywhere verl imports it.
    Target(
        TRACKING,
        RL_INSIGHT_LOGGER,
        Kind.ATTRIBUTE,
        ("project_name", "experiment_name", "config"),
        (
            Uses("literal", TRACKING, "Tracking.__init__", "rl_insight"),
            Uses("literal", TRACKING, RL_INSIGHT_LOGGER, RL_INSIGHT_ENABLE_ENV),
        ),
        wrapper="logger.select_logger",
        optional=True,
    ),
    *(
        Target(module, RL_INSIGHT_LOGGER, Kind.ATTRIBUTE, wrapper="logger.select_logger", optional=True)
        for module in RL_INSIGHT_LOGGER_USERS
    ),
)

#: Every verl module the plugin hooks, in the order of :data:`TARGETS`.
MODULES: tuple[str, ...] = tuple(dict.fromkeys(target.module for target in TARGETS))


def targets_of(module: str) -> tuple[Target, ...]:
    """The targets in verl module ``module``, in table order."""
    return tuple(target for target in TARGETS if target.module == module)
