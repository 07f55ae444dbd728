"""A simulated agent loop sent through the bridge, and what a backend must show for it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import verl_otel_bridge as vob

STEPS = (1, 2)
SAMPLES = 3
SESSIONS_PER_SAMPLE = 2
FAILED = (2, 1, 1)  # (global_steps, sample, session) of the session that fails


@dataclass
class Sent:
    """What the loop sent: per conversation id, its spans, tokens and outcome."""

    spans: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    conversations: dict[str, str] = field(default_factory=dict)  # conversation id -> status
    rewards: dict[str, float] = field(default_factory=dict)  # conversation id -> reward
    inputs: dict[str, str] = field(default_factory=dict)  # conversation id -> the session's input
    outputs: dict[str, str] = field(default_factory=dict)  # conversation id -> the session's output

    @property
    def failed(self) -> list[str]:
        return [c for c, status in self.conversations.items() if status != "success"]


def run_agent_loop(bridge: vob.Bridge, experiment: str) -> Sent:
    """Run ``SAMPLES * SESSIONS_PER_SAMPLE`` sessions in each of ``STEPS`` through ``bridge``.

    Each session: a task of two generate turns with a tool turn between them
    (the tool's own work a ``@traced`` span), a recorded reward-model span, a
    reward; one session fails.
    """
    sent = Sent()
    tool = bridge.traced("tool_call")(lambda query: f"42 for {query}")
    for step in STEPS:
        for sample in range(SAMPLES):
            for session in range(SESSIONS_PER_SAMPLE):
                conversation = f"{experiment}-step{step}-s{sample}-n{session}"
                failed = (step, sample, session) == FAILED
                reward = 0.0 if failed else round(0.1 + 0.15 * (sample + session), 2)
                question = f"What is 6 x 7? (sample {sample}, session {session})"
                with bridge.session(
                    sample=sample,
                    session=session,
                    global_steps=step,
                    uid=f"uid-{sample}",
                    session_id=conversation,
                    experiment_name=experiment,
                ) as s:
                    vob.record_io(input=question)
                    with s.task("solve", input=question) as task:
                        with s.turn(0, type="generate", input=question) as turn:
                            turn.record(
                                prompt_tokens=100 + sample,
                                completion_tokens=20 + session,
                                finish_reason="tool_calls",
                                tools="calculator",
                                content="I will use the calculator.",
                            )
                        with s.turn(1, type="tool") as turn:
                            args = {"expression": "6*7"}
                            turn.record(tools="calculator", tool_args=args)
                            vob.record_io(output=tool(json.dumps(args)))
                        answer = "I cannot tell." if failed else "6 x 7 = 42"
                        with s.turn(2, type="generate", input="calculator said 42") as turn:
                            turn.record(
                                prompt_tokens=150 + sample,
                                completion_tokens=5 + session,
                                finish_reason="stop",
                                content=answer,
                            )
                        vob.record_io(output=answer)
                        task.set_result(status="failed" if failed else "success", reward=reward, finished=True)
                    end = time.time_ns()
                    bridge.record_span(
                        "reward_model", start_time_ns=end - 1_000_000, end_time_ns=end, attributes={"reward": reward}
                    )
                    vob.record_io(output=answer, span=s.span)
                    s.finish(
                        status="failed" if failed else "success",
                        runner_name="simulated",
                        reward_source="rule",
                        trajectories=[{"chain_id": 0, "reward_score": reward, "num_turns": 3}],
                        finished=True,
                    )
                sent.spans += 7  # session, task, 3 turns, tool_call, reward_model
                sent.prompt_tokens += 100 + sample + 150 + sample
                sent.completion_tokens += 20 + session + 5 + session
                sent.conversations[conversation] = "failed" if failed else "success"
                sent.rewards[conversation] = reward
                sent.inputs[conversation] = question
                sent.outputs[conversation] = answer
    return sent
