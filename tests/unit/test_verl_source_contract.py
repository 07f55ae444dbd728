"""The table of verl targets against the published verl packages' sources (``tests/verl_sources.py``: the
wheels of every supported release, unpacked, never installed, so no GPU package is needed).

Every target the plugin wraps or reads must be there with the parameters its wrapper reads, and every field,
key, text and result shape its wrappers read (``targets.Uses``); a verl that renames one fails here before a
user's run goes untraced.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import verl_sources

from verl_otel_bridge._internal.verl import install, source, targets


@pytest.fixture(scope="module", params=verl_sources.VERSIONS)
def published(request: pytest.FixtureRequest) -> source.SourceTree:
    return source.SourceTree(verl_sources.wheel_source(request.param))


def test_every_target_and_what_its_wrappers_read_is_in_each_supported_verl(published: source.SourceTree) -> None:
    assert published.version in verl_sources.VERSIONS
    assert [str(finding) for finding in source.check(published)] == []


def test_the_table_has_every_module_of_verl_that_names_rl_insight_logger(published: source.SourceTree) -> None:
    """verl's own lookups of ``RLInsightLogger`` all get the plugin's class only if the table has each of them."""
    table = {t.module for t in targets.TARGETS if t.name == targets.RL_INSIGHT_LOGGER}
    named = source.names_in(published, targets.RL_INSIGHT_LOGGER)
    assert named == (table if published.version != "0.8.0" else set())  # 0.8.0 has no RLInsightLogger


def test_the_oldest_release_checked_is_the_oldest_supported() -> None:
    assert verl_sources.VERSIONS[0] == targets.OLDEST_VERL


def test_every_wrapper_the_table_names_is_a_function_of_the_package() -> None:
    for target in targets.TARGETS:
        if target.kind is targets.Kind.READ:
            assert target.wrapper is None, target
        else:
            assert callable(install.wrapper_of(target)), target


@pytest.fixture(scope="module")
def pristine() -> Path:
    return verl_sources.wheel_source(verl_sources.VERSIONS[-1])


# (file under verl/, text replaced, its replacement, what the finding names)
RENAMES = {
    "a wrapped method": (
        "experimental/agent_loop/tool_agent_loop.py",
        "async def _call_tool(",
        "async def _call_tool_renamed(",
        "tool_agent_loop.ToolAgentLoop._call_tool: verl.experimental.agent_loop.tool_agent_loop has no",
    ),
    "a parameter the wrapper reads": (
        "workers/rollout/llm_server.py",
        "prompt_ids: list[int],",
        "prompt_token_ids: list[int],",
        "LLMServerClient.generate (line",
    ),
    "a trajectory key": (
        "experimental/agent_loop/agent_loop.py",
        '"sample_index": index[i]',
        '"sample_idx": index[i]',
        "lacks the literal 'sample_index' of verl.experimental.agent_loop.agent_loop.get_trajectory_info",
    ),
    "a result field": (
        "workers/rollout/replica.py",
        "    stop_reason: Optional[str] = None",
        "    finish_reason: Optional[str] = None",
        "lacks the field 'stop_reason' of verl.workers.rollout.replica.TokenOutput",
    ),
    "a metric": (
        "experimental/agent_loop/agent_loop.py",
        "    tool_calls: float = 0.0",
        "    tool_seconds: float = 0.0",
        "lacks the field 'tool_calls' of verl.experimental.agent_loop.agent_loop.AgentLoopMetrics",
    ),
    "the tool-error text": (
        "experimental/agent_loop/tool_agent_loop.py",
        "Error executing tool '",
        "Tool call failed: '",
        'lacks the prefix "Error executing tool \'"',
    ),
    "the _call_tool result": (
        "experimental/agent_loop/tool_agent_loop.py",
        "return ToolResponse(text=msg), 0.0, {}",
        "return ToolResponse(text=msg), 0.0",
        "lacks the returns '3'",
    ),
    "an extra_fields key": (
        "experimental/agent_loop/agent_loop.py",
        '"reward_extra_info"',
        '"reward_info"',
        "lacks the literal 'reward_extra_info' of verl.experimental.agent_loop.agent_loop.AgentLoopWorker._compute_score",
    ),
}


@pytest.mark.parametrize("case", list(RENAMES))
def test_a_rename_in_verl_fails_the_contract(case: str, pristine: Path, tmp_path: Path) -> None:
    relative, old, new, expected = RENAMES[case]
    copy = tmp_path / "verl-renamed"
    shutil.copytree(pristine / "verl", copy / "verl")
    path = copy / "verl" / relative
    text = path.read_text()
    assert old in text, f"the pristine source no longer has {old!r}: update the case"
    path.write_text(text.replace(old, new))
    findings = [str(finding) for finding in source.check(source.SourceTree(copy))]
    assert findings and all(expected in finding for finding in findings), findings
