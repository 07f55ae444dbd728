"""verl 0.9.1's real agent loop on CPU: no GPU, no model weights, no LLM server.

verl's own ``AgentLoopWorker``, ``LLMServerClient``, agent loops, tool loading,
tool parser and ``RewardLoopWorker`` run unchanged. Three stand-ins only:

* the load balancer handle (``acquire_server``/``release_server``/``require_*_fields``),
* the LLM server handle, whose ``generate`` answers from a script (:class:`ScriptedServer`),
* a ``.remote`` shim over a real in-process ``RewardLoopWorker``.

The model directory holds a ``LlamaConfig`` and a byte-level BPE tokenizer built in
code (256 byte tokens plus the chat and tool-call special tokens). The same stand-ins,
as Ray actors, serve ``AgentLoopManager`` (``tests/verl/test_ray.py``). Used by
``examples/verl_agent_loop.py``, the tests in ``tests/verl`` and ``bench/verl_overhead.py``.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|endoftext|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GROUND_TRUTH = "42"
#: What the scripted model answers last: verl's gsm8k scorer gives it 1.0.
FINAL_ANSWER = f"The answer is #### {GROUND_TRUTH}<|im_end|>"
#: One call of each tool kind: a BaseTool using BaseTool.execute, one overriding it, a function tool.
TOOL_CALLS = [
    ("base_default", {"x": 1}),
    ("base_override", {"x": 2}),
    ("add_numbers", {"a": 40, "b": 2}),
]
OVERRIDE_TEXT = "override tool ran"
#: In a prompt: the scripted model calls the tools (the batch rows for ``tool_agent`` have it).
TOOLS_MARK = "[tools]"

TOOLS_MODULE = '''
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class DefaultTool(BaseTool):
    """Uses BaseTool.execute as it is."""


class OverrideTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="override tool ran"), 0.5, {"calls": 1}


class RaisingTool(BaseTool):
    """Its execute raises: verl answers the call with its error text."""

    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("the raising tool broke")


class BrokenReleaseTool(BaseTool):
    """Its release raises: the exception leaves verl's _call_tool."""

    async def release(self, instance_id, **kwargs):
        raise ConnectionError("the tool's sandbox is gone")
'''

FUNCTION_TOOLS_MODULE = '''
from verl.tools.function_tool import function_tool


@function_tool
def add_numbers(a: int, b: int) -> str:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return str(a + b)


@function_tool
def divide(a: int, b: int) -> str:
    """Divide two numbers.

    Args:
        a: the dividend
        b: the divisor
    """
    return str(a // b)
'''


def _schema(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "integer", "description": "x"}},
                "required": ["x"],
            },
        },
    }


def build_model_dir(root: Path) -> Path:
    """A model directory verl's ``HFModelConfig`` loads: config and tokenizer, no weights."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    model_dir = root / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: i for i, char in enumerate(sorted(alphabet))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",  # noqa: S106 - a token of the vocabulary, not a password
        pad_token="<|endoftext|>",  # noqa: S106
        bos_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(model_dir)
    LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=len(fast),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    ).save_pretrained(model_dir)
    return model_dir


def build_tools(root: Path) -> tuple[Path, Path]:
    """``tools.yaml`` (``BaseTool`` subclasses) and a function-tool module, in ``root``; the scripted model
    calls those of :data:`TOOL_CALLS` (the others fail, for tests that call them instead)."""
    (root / "harness_tools.py").write_text(textwrap.dedent(TOOLS_MODULE))
    function_path = root / "harness_function_tools.py"
    function_path.write_text(textwrap.dedent(FUNCTION_TOOLS_MODULE))
    classes = {
        "base_default": "DefaultTool",
        "base_override": "OverrideTool",
        "base_raising": "RaisingTool",
        "base_broken_release": "BrokenReleaseTool",
    }
    entries = [
        {"class_name": f"harness_tools.{cls}", "config": {"type": "native"}, "tool_schema": _schema(name)}
        for name, cls in classes.items()
    ]
    tools_yaml = root / "tools.yaml"
    tools_yaml.write_text(json.dumps({"tools": entries}))  # JSON is YAML
    return tools_yaml, function_path


def make_config(
    model_dir: Path,
    *,
    backend: str | None = "otel",
    tools: tuple[Path, Path] | None = None,
    max_samples: int | None = None,
    token2text: bool = False,
    num_workers: int = 1,
    project: str = "proj",
    experiment: str = "exp",
) -> Any:
    """verl's generated PPO trainer config with the CPU overrides."""
    import verl
    from omegaconf import OmegaConf

    config = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.prompt_length=1024",
        "actor_rollout_ref.rollout.response_length=1024",
        f"actor_rollout_ref.rollout.agent.num_workers={num_workers}",
        f"actor_rollout_ref.rollout.trace.backend={'null' if backend is None else backend}",
        "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker="
        + ("null" if max_samples is None else str(max_samples)),
        f"actor_rollout_ref.rollout.trace.token2text={str(token2text).lower()}",
        f"trainer.project_name={project}",
        f"trainer.experiment_name={experiment}",
        "reward.num_workers=1",
    ]
    if tools is not None:
        overrides += [
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools[0]}",
            f"actor_rollout_ref.rollout.multi_turn.function_tool_path={tools[1]}",
            f"actor_rollout_ref.rollout.multi_turn.max_parallel_calls={len(TOOL_CALLS)}",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        ]
    return OmegaConf.merge(config, OmegaConf.from_dotlist(overrides))


def make_batch(
    num_prompts: int,
    n: int = 1,
    *,
    step: int = 3,
    agent_name: str = "single_turn_agent",
    validate: bool = False,
    first: int = 0,
) -> Any:
    """A batch as verl's trainer hands it to ``generate_sequences``: ``n`` rollouts per prompt, ``uid`` per prompt;
    prompts are numbered from ``first`` (their sample index is ``100 + number``)."""
    from verl.protocol import DataProto

    rows = [(p, r) for p in range(first, first + num_prompts) for r in range(n)]
    mark = f"{TOOLS_MARK} " if agent_name == "tool_agent" else ""
    non_tensor = {
        "raw_prompt": np.array([[{"role": "user", "content": f"{mark}question {p}"}] for p, _ in rows], dtype=object),
        "index": np.array([100 + p for p, _ in rows]),
        "uid": np.array([f"uid-{p}" for p, _ in rows], dtype=object),
        "agent_name": np.array([agent_name] * len(rows), dtype=object),
        "data_source": np.array(["openai/gsm8k"] * len(rows), dtype=object),
        "reward_model": np.array([{"ground_truth": GROUND_TRUTH, "style": "rule"}] * len(rows), dtype=object),
        "extra_info": np.array([{} for _ in rows], dtype=object),
        "tools_kwargs": np.array([{} for _ in rows], dtype=object),
    }
    return DataProto.from_dict(non_tensors=non_tensor, meta_info={"global_steps": step, "validate": validate})


class ScriptedServer:
    """The LLM server: a prompt asking for tools (:data:`TOOLS_MARK`) and without tool results yet gets the
    three tool calls, anything else the answer.

    ``calls`` records each call: the trajectory's ``sample`` (read from the prompt), its
    ``round`` (0: before tool results, 1: after) and the token counts it returned.
    """

    def __init__(self, model_dir: str, latency_s: float = 0.0) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.latency_s = latency_s
        self.calls: list[dict[str, Any]] = []

    def get_calls(self) -> list[dict[str, Any]]:
        return self.calls

    async def generate(
        self, *, request_id: str, prompt_ids: Sequence[int], sampling_params: Mapping[str, Any], **kwargs: Any
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        prompt = self.tokenizer.decode(list(prompt_ids))
        rounds = prompt.count("<|im_start|>tool")
        if TOOLS_MARK in prompt and not rounds:
            text = "".join(
                f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>" for name, args in TOOL_CALLS
            )
        else:
            text = FINAL_ANSWER
        token_ids = self.tokenizer.encode(text, add_special_tokens=False)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)  # a model's time to answer (the benchmark's second setting)
        question = int(prompt.split("question ", 1)[1].split("<", 1)[0])
        self.calls.append(
            {
                "sample": str(100 + question),
                "round": min(rounds, 1),
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(token_ids),
            }
        )
        return TokenOutput(
            token_ids=token_ids,
            log_probs=[-0.5] * len(token_ids),
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": 3, "num_cached_tokens": 4},
        )


class LoadBalancer:
    """The global load balancer: one server, ``server-0``."""

    def __init__(self, server: Any) -> None:
        self.server = server

    async def require_acquire_fields(self) -> list[str]:
        return []

    async def require_release_fields(self) -> list[str]:
        return []

    async def acquire_server(self, request_id: str, **fields: Any) -> tuple[str, Any]:
        return "server-0", self.server

    def release_server(self, server_id: str, **fields: Any) -> None:
        return None


class _Method:
    def __init__(self, function: Any) -> None:
        self._function = function

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        result = self._function(*args, **kwargs)
        if asyncio.iscoroutine(result):
            return asyncio.ensure_future(result)
        future = asyncio.get_running_loop().create_future()
        future.set_result(result)
        return future


class Remote:
    """``handle.method.remote(...)`` over an in-process object: an awaitable, as a Ray actor handle gives."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> _Method:
        return _Method(getattr(self._target, name))


def make_worker(config: Any, model_dir: Path, *, latency_s: float = 0.0) -> tuple[Any, ScriptedServer]:
    """verl's ``AgentLoopWorker`` with the stand-ins, and the scripted server it talks to
    (answering after ``latency_s``)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.workers.rollout.llm_server import LLMServerClient

    server = ScriptedServer(str(model_dir), latency_s)
    client = LLMServerClient(config, load_balancer_handle=Remote(LoadBalancer(Remote(server))))
    reward = Remote(RewardLoopWorker(config))
    return AgentLoopWorker(config, llm_client=client, reward_loop_worker_handles=[reward]), server
