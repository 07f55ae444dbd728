"""The generic vocabulary: spans as OpenInference and GenAI-convention backends read them.

The bridge records spans in its native vocabulary, the keys RL-Insight's
dashboards query (``session``, ``uid``, ``turn``, ``reward``, ...), and that is
what RL-Insight and the bridge's own captures (``memory``, ``jsonl``,
``console``: read back by ``SpanCapture``, ``show`` and ``replay``) receive.
The ``otlp`` destination (also ``replay --to otlp``) sends each span translated
by a :class:`Translator` (:func:`generic_parts`, :func:`generic_span`), so Arize
Phoenix, MLflow, Langfuse and other GenAI-aware backends show sessions, span
kinds, tokens, inputs and outputs, reward and failures:

- identity: ``session`` becomes ``session.index`` (Phoenix stores attributes as
  a nested tree, where a plain ``session`` would hide ``session.id``); every
  other identity key is kept as it is (and any other plain key a dotted key
  nests under moves to ``<key>.value``); ``session.id`` and
  ``gen_ai.conversation.id`` name the conversation; ``user.id`` is the ``uid``;
- ``openinference.span.kind`` on every span that lacks one (chat turns keep only
  ``gen_ai.operation.name=chat``, which both backends map to their LLM kind);
- ``input.value`` / ``output.value`` from ``input`` / ``output`` (see
  :func:`verl_otel_bridge.record_io`), ``gen_ai.input.messages`` /
  ``gen_ai.output.messages`` on generate turns (the output: ``output``, else the
  turn's ``content``), ``gen_ai.tool.call.result`` on tool turns (likewise; the
  input: ``input``, else ``tool_args``), ``llm.token_count.*`` beside ``gen_ai.usage.*``;
- reward as a ``gen_ai.evaluation.result`` event and in ``metadata`` (JSON,
  which Phoenix filters on: ``metadata['reward'] > 0.5``); a session with one
  trajectory also gets its ``reward_score`` in ``metadata`` and as the trace tag
  ``mlflow.traceTag.reward`` (MLflow: ``tag.reward = '0.55'``);
- the identity's ``project`` (else the configured one) as the resource's
  ``openinference.project.name``, unless the resource already names one.

The translation is idempotent and never raises: a span it cannot translate is
exported as it was, and logged once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan

from verl_otel_bridge._internal.attributes import attributes_dict, span_attributes, span_events
from verl_otel_bridge._internal.conversation import Conversations
from verl_otel_bridge._internal.logs import OnceLogger
from verl_otel_bridge._internal.protocol import (
    CONTENT,
    DEFAULT_KIND,
    EVALUATION_EVENT,
    EVALUATION_NAME,
    EVALUATION_SCORE,
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION,
    GEN_AI_TWINS,
    GENERIC_IDENTITY_KEYS,
    INPUT,
    INPUT_MESSAGES,
    INPUT_MIME_TYPE,
    INPUT_VALUE,
    METADATA,
    MLFLOW_REWARD_TAG,
    NAME_KINDS,
    OPERATION_KINDS,
    OUTPUT,
    OUTPUT_MESSAGES,
    OUTPUT_MIME_TYPE,
    OUTPUT_VALUE,
    PROJECT_RESOURCE,
    REWARD,
    REWARD_KIND,
    SESSION_ID,
    SESSION_SPAN_NAME,
    SPAN_KIND,
    TOKEN_COUNTS,
    TOKEN_TOTAL,
    TOOL_CALL_RESULT,
    TRAJECTORIES,
    USER_ID,
)
from verl_otel_bridge._internal.records import parse_json, replace_span

logger = logging.getLogger(__name__)

#: The GenAI twin of a tool turn's arguments, its input when no ``input`` was recorded.
TOOL_ARGS_TWIN = GEN_AI_TWINS["tool_args"]


def conversation_id(attributes: Mapping[str, Any]) -> str | None:
    """The conversation a span belongs to: the identity's ``session_id``, else one built from the identity.

    Built as ``project=.../experiment=.../global_steps=.../sample=.../session=.../traj=...``
    so it is unique across projects, experiments and steps (Phoenix's session ids are global).
    None for spans outside a session.
    """
    if "state_lane_id" not in attributes:
        return None
    given = attributes.get("session_id")
    if given:
        return str(given)
    session = attributes.get("session", attributes.get(GENERIC_IDENTITY_KEYS["session"], ""))
    parts = (
        ("project", attributes.get("project", "")),
        ("experiment", attributes.get("experiment_name", "")),
        ("global_steps", attributes.get("global_steps", "")),
        ("sample", attributes.get("sample", "")),
        ("session", session),
        ("traj", attributes.get("traj", "")),
    )
    return "/".join(f"{key}={value}" for key, value in parts if value != "")


def span_kind(name: str, attributes: Mapping[str, Any]) -> str | None:
    """The OpenInference kind a span gets (None: leave it to the backend's ``gen_ai.operation.name`` mapping)."""
    given = attributes.get(SPAN_KIND)
    if given:
        return str(given)
    if name in NAME_KINDS:
        return NAME_KINDS[name]
    operation = attributes.get(GEN_AI_OPERATION)
    if operation == "chat":
        return None
    if operation in OPERATION_KINDS:
        return OPERATION_KINDS[str(operation)]
    if _number(attributes.get(REWARD)) is not None:
        return REWARD_KIND
    return DEFAULT_KIND


class KeyPlans:
    """Which keys the translation moves aside, worked out once per distinct key set.

    Spans of one program have a handful of key sets (a turn's, a task's, ...), so the
    shadowed keys are looked up, not recomputed per span. Holds at most ``max_plans``
    key sets (then starts over).
    """

    def __init__(self, max_plans: int = 1024) -> None:
        self._max = max_plans
        self._shadowed: dict[tuple[str, ...], tuple[str, ...]] = {}

    def unshadow(self, out: dict[str, Any]) -> None:
        """Move any plain key that a dotted key nests under (a caller's ``llm=...``) to ``<key>.value``."""
        keys = tuple(out)
        shadowed = self._shadowed.get(keys)
        if shadowed is None:
            prefixes = {key[:index] for key in keys for index, char in enumerate(key) if char == "."}
            shadowed = self._remember(self._shadowed, keys, tuple(prefixes.intersection(keys)))
        for key in shadowed:
            out.setdefault(f"{key}.value", out.pop(key))

    def _remember(
        self, plans: dict[tuple[str, ...], tuple[str, ...]], keys: tuple[str, ...], plan: tuple[str, ...]
    ) -> tuple[str, ...]:
        if len(plans) >= self._max:
            plans.clear()
        plans[keys] = plan
        return plan


def renamed(attributes: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``attributes`` with the identity keys renamed (:data:`GENERIC_IDENTITY_KEYS`).

    When a span holds a key and its new name both, the one later in the span's order wins.
    """
    out = attributes.copy()
    for key, new_key in GENERIC_IDENTITY_KEYS.items():
        if key in out:
            if new_key in out:
                names = [GENERIC_IDENTITY_KEYS.get(name, name) for name in attributes]
                return dict(zip(names, attributes.values(), strict=True))
            out[new_key] = out.pop(key)
    return out


def generic_attributes(name: str, attributes: Mapping[str, Any], plans: KeyPlans | None = None) -> dict[str, Any]:
    """``attributes`` of a span called ``name`` in the generic vocabulary (see the module docstring).

    ``plans`` (kept by the caller across spans) makes the key work a lookup.
    """
    plans = plans if plans is not None else KeyPlans()
    if attributes.__class__ is not dict:
        attributes = attributes_dict(attributes)
    out = renamed(attributes)
    conversation = conversation_id(attributes)
    if conversation:
        out[SESSION_ID] = conversation
        out[GEN_AI_CONVERSATION_ID] = conversation
    if attributes.get("uid"):
        out[USER_ID] = attributes["uid"]
    kind = span_kind(name, attributes)
    if kind is not None:
        out[SPAN_KIND] = kind
    operation = attributes.get(GEN_AI_OPERATION)
    if INPUT in attributes or OUTPUT in attributes or CONTENT in attributes or TOOL_ARGS_TWIN in attributes:
        _io(out, attributes, operation)  # (without any of them it changes nothing)
    counted = False
    for key, source in TOKEN_COUNTS.items():
        if source in attributes:
            out[key] = attributes[source]
            counted = True
        elif key in out:
            counted = True
    if counted and TOKEN_TOTAL not in out:
        total = 0
        for key in TOKEN_COUNTS:
            count = out.get(key)
            total += count if count.__class__ is int else int(_number(count) or 0)
        out[TOKEN_TOTAL] = total
    reward = _number(attributes.get(REWARD))
    if reward is None and name == SESSION_SPAN_NAME:
        reward = session_reward(attributes)
        if reward is not None:
            out[MLFLOW_REWARD_TAG] = str(reward)
    if reward is not None:
        out[METADATA] = _merged_metadata(attributes.get(METADATA), {REWARD: reward})
    plans.unshadow(out)
    return out


def session_reward(attributes: Mapping[str, Any]) -> float | None:
    """The ``reward_score`` of a session's only trajectory (``finish(trajectories=[...])``), else None."""
    summaries = attributes.get(TRAJECTORIES)
    if not isinstance(summaries, str) or not _is_json(summaries):
        return None
    loaded = json.loads(summaries)
    if not isinstance(loaded, list) or len(loaded) != 1 or not isinstance(loaded[0], dict):
        return None
    return _number(loaded[0].get("reward_score"))


def _io(out: dict[str, Any], attributes: Mapping[str, Any], operation: Any) -> None:
    given_input, given_output = attributes.get(INPUT), attributes.get(OUTPUT)
    if operation == "chat":
        given_output = given_output if given_output is not None else attributes.get(CONTENT)
        if given_input is not None and INPUT_MESSAGES not in out:
            out[INPUT_MESSAGES] = _messages(given_input, "user")
        if given_output is not None and OUTPUT_MESSAGES not in out:
            out[OUTPUT_MESSAGES] = _messages(given_output, "assistant", attributes.get("finish_reason"))
    elif operation == "execute_tool":
        given_input = given_input if given_input is not None else attributes.get(TOOL_ARGS_TWIN)
        given_output = given_output if given_output is not None else attributes.get(CONTENT)
        if given_output is not None:
            out.setdefault(TOOL_CALL_RESULT, _text(given_output))
    pairs = ((given_input, INPUT_VALUE, INPUT_MIME_TYPE), (given_output, OUTPUT_VALUE, OUTPUT_MIME_TYPE))
    for value, value_key, mime_key in pairs:
        if value is not None and value_key not in out:
            out[value_key] = _text(value)
            out[mime_key] = "application/json" if _is_json(out[value_key]) else "text/plain"
    out.pop(INPUT, None)
    out.pop(OUTPUT, None)


def _messages(value: Any, role: str, finish_reason: Any = None) -> str:
    """GenAI-convention messages: ``value`` as given when it is already a JSON list of messages."""
    text = _text(value)
    if _is_json(text) and isinstance(json.loads(text), list):
        return text
    message: dict[str, Any] = {"role": role, "parts": [{"type": "text", "content": text}]}
    if finish_reason:
        message["finish_reason"] = str(finish_reason)
    return json.dumps([message], ensure_ascii=False)


def _merged_metadata(existing: Any, extra: Mapping[str, Any]) -> str:
    merged: dict[str, Any] = {}
    if isinstance(existing, str) and _is_json(existing):
        loaded = json.loads(existing)
        if isinstance(loaded, dict):
            merged.update(loaded)
    merged.update(extra)
    return json.dumps(merged, ensure_ascii=False)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)):
        return json.dumps(list(value), ensure_ascii=False)
    return str(value)


def _is_json(text: str) -> bool:
    if text[:1] not in ("{", "["):
        return False
    try:
        parse_json(text)
    except ValueError:
        return False
    return True


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def reward_events(span: ReadableSpan, attributes: Mapping[str, Any] | None = None) -> Sequence[Event]:
    """``span``'s events plus one ``gen_ai.evaluation.result`` for its ``reward`` (if not there yet).

    ``attributes``: the span's, when the caller has them as a dict already.
    """
    events = span_events(span)
    reward = _number((attributes if attributes is not None else span.attributes or {}).get(REWARD))
    if reward is None or (events and any(event.name == EVALUATION_EVENT for event in events)):
        return events
    events = list(events)
    when = span.end_time if span.end_time is not None else span.start_time
    events.append(Event(EVALUATION_EVENT, {EVALUATION_NAME: REWARD, EVALUATION_SCORE: reward}, when))
    return events


class Translator:
    """Translates spans (:func:`generic_parts`), remembering across spans what it can.

    ``project`` (the configured one) names the Phoenix project of spans whose identity has none.
    A span it cannot translate goes out as it was, logged once per kind. :meth:`batch` also gives
    each generate turn its whole input, rebuilt from the conversation stored once
    (:mod:`verl_otel_bridge._internal.conversation`): backends show one LLM call at a time.
    """

    def __init__(self, project: str | None = None) -> None:
        self.project = project or None
        # project -> (resource, resource with that project): spans share their provider's resource
        self._resources: dict[str, tuple[Resource, Resource]] = {}
        self._plans = KeyPlans()
        self._conversations = Conversations()
        self._once = OnceLogger(logger)

    def batch(self, spans: Sequence[ReadableSpan]) -> list[GenericParts]:
        """The translated parts of each of ``spans``, in order, conversations rebuilt whole."""
        return [self(span) or as_it_is(span) for span in self._conversations.spans(spans)]

    def __call__(self, span: ReadableSpan) -> GenericParts | None:
        """``span``'s translated parts; None when it cannot be translated."""
        try:
            return generic_parts(span, self.project, self._resource, self._plans)
        except Exception as exc:  # noqa: BLE001 - an odd span goes out untranslated, never lost
            self._once.log(
                f"translate:{type(exc).__name__}", logging.WARNING, "span %r exported untranslated: %r", span.name, exc
            )
            return None

    def _resource(self, resource: Resource, project: str) -> Resource:
        cached = self._resources.get(project)
        if cached is not None and cached[0] is resource:
            return cached[1]
        merged = with_project(resource, project)
        self._resources[project] = (resource, merged)
        return merged


def as_it_is(span: ReadableSpan) -> GenericParts:
    """``span``'s own attributes, events and resource, as the parts it is sent with untranslated."""
    return {"attributes": span_attributes(span), "events": span_events(span), "resource": span.resource}


def with_project(resource: Resource, project: str) -> Resource:
    """``resource`` naming Phoenix's project ``project``."""
    return resource.merge(Resource({PROJECT_RESOURCE: project}))


class GenericParts(TypedDict):
    """What :func:`generic_span` replaces in a span."""

    attributes: dict[str, Any]
    events: Sequence[Event]
    resource: Resource


def generic_parts(
    span: ReadableSpan,
    project: str | None = None,
    resource_for: Callable[[Resource, str], Resource] = with_project,
    plans: KeyPlans | None = None,
) -> GenericParts:
    """The attributes, events and resource of ``span`` in the generic vocabulary (see :func:`generic_span`)."""
    attributes = span_attributes(span)
    resource = span.resource
    wanted = attributes.get("project") or project
    if wanted and (resource is None or PROJECT_RESOURCE not in resource.attributes):
        resource = resource_for(resource if resource is not None else Resource({}), str(wanted))
    return {
        "attributes": generic_attributes(span.name, attributes, plans),
        "events": reward_events(span, attributes),
        "resource": resource,
    }


def generic_span(
    span: ReadableSpan,
    project: str | None = None,
    resource_for: Callable[[Resource, str], Resource] = with_project,
    plans: KeyPlans | None = None,
) -> ReadableSpan:
    """A copy of ``span`` in the generic vocabulary: attributes, reward event, Phoenix project.

    ``project`` names the project of spans whose identity has none; ``plans`` (see
    :class:`KeyPlans`), kept across calls, saves the key work. Usable on spans
    from the ``memory`` exporter or ``SpanCapture`` to see what ``otlp`` sends:
    ``[generic_span(s) for s in capture.spans]``.
    """
    return replace_span(span, **generic_parts(span, project, resource_for, plans))
