"""Agent-loop session identity, scoped by context variables.

The identity is the set of keys RL-Insight's Agent Loop dashboard groups spans
by. Its fields and coercions equal ``rl_insight.agent_loop.agent_loop_session``
(RL-Insight 0.3.0) for the same inputs, so spans look the same whether the
session was created by RL-Insight or computed here.

The current identity lives in a :class:`contextvars.ContextVar`: it follows
asyncio tasks created inside a session and never leaks between threads or
concurrent sessions. Each ``using_identity`` block is a scope that knows the one
it was entered in; leaving it closes it, and a closed scope is never current
again, whatever order scopes are left in and whichever context leaves them
(an async generator closed by another task, two sessions left in entry order).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from verl_otel_bridge._internal.attributes import AttributeValue, ConvertHook, bounded_text, to_attribute_value
from verl_otel_bridge._internal.protocol import DEFAULT_EXPERIMENT_NAME, IDENTITY_KEYS
from verl_otel_bridge._internal.scopes import note_repair

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "IDENTITY_KEYS",
    "IdentityFields",
    "SessionIdentity",
    "current_identity",
    "state_lane_id",
    "using_identity",
]


class _RequiredFields(TypedDict):
    sample: int | str
    session: int | str


class IdentityFields(_RequiredFields, total=False):
    """The keywords that name a session, declared once for every API that takes them.

    ``sample`` and ``session`` (verl's sample index and session number) are required;
    ``traj`` (the trajectory within the session) defaults to 0, ``project`` and
    ``experiment_name`` to the bridge config's, ``uid`` (the prompt's id: a GRPO group),
    ``global_steps`` (the training step) and ``session_id`` (a request id of your own) to
    None. Indices are sent as text, ``global_steps`` as a number. Coercions: see
    :meth:`SessionIdentity.create`.
    """

    traj: int | str
    uid: str | None
    global_steps: int | None
    session_id: str | None
    project: str | None
    experiment_name: str | None


#: Every keyword :class:`IdentityFields` declares.
FIELD_NAMES = frozenset(IdentityFields.__annotations__)


class _Scope:
    """One ``using_identity`` block: its identity, the scope it was entered in, and whether it is still open."""

    __slots__ = ("identity", "open", "parent")

    def __init__(self, identity: SessionIdentity | None, parent: _Scope | None) -> None:
        self.identity = identity
        self.parent = parent
        self.open = True


_current: ContextVar[_Scope | None] = ContextVar("verl_otel_bridge_identity", default=None)


def state_lane_id(experiment_name: str, sample: str, session: str, traj: str) -> str:
    """The dashboard's lane id for one trajectory."""
    return f"experiment={experiment_name}/sample={sample}/session={session}/traj={traj}"


@dataclass(frozen=True)
class SessionIdentity:
    """Who a span belongs to: one trajectory of one session of one sample.

    Build it with :meth:`create` (which applies RL-Insight's coercions) or
    :meth:`from_dict` (which accepts what :meth:`to_dict` produced, e.g. after a
    JSON round trip through an agent framework's tool kwargs).
    """

    project: str
    experiment_name: str
    sample: str
    session: str
    traj: str
    uid: str
    global_steps: Any
    session_id: str
    state_lane_id: str
    #: The identity as OpenTelemetry attributes, computed once per session so
    #: stamping a span costs one dict hand-off.
    attributes: Mapping[str, AttributeValue] = field(compare=False, repr=False, hash=False)

    @classmethod
    def create(
        cls, *, max_length: int | None = None, on_convert: ConvertHook | None = None, **fields: Unpack[IdentityFields]
    ) -> SessionIdentity:
        """Apply RL-Insight 0.3.0's coercions to :class:`IdentityFields`.

        ``project``, ``uid`` and ``session_id`` become ``""`` when None;
        ``experiment_name``, ``sample``, ``session`` and ``traj`` become strings,
        each at most ``max_length`` characters (as every attribute, see
        :mod:`verl_otel_bridge._internal.attributes`); ``global_steps`` is kept as given
        (``""`` when None) because the dashboard compares it as a number, and its
        attribute becomes text only outside int64. ``on_convert`` hears of each
        value that had to be changed (see :mod:`verl_otel_bridge._internal.attributes`).

        Raises:
            TypeError: a keyword :class:`IdentityFields` does not declare, or no
                ``sample``/``session`` (as a call with a wrong keyword would).
        """
        check_fields(fields)

        def text(value: Any) -> str:
            return bounded_text(value, max_length)

        experiment_name, project = fields.get("experiment_name"), fields.get("project")
        uid, global_steps, session_id = fields.get("uid"), fields.get("global_steps"), fields.get("session_id")
        experiment = DEFAULT_EXPERIMENT_NAME if experiment_name is None else text(experiment_name)
        sample_s, session_s, traj_s = text(fields["sample"]), text(fields["session"]), text(fields.get("traj", 0))
        values: dict[str, Any] = {
            "project": "" if project is None else text(project),
            "experiment_name": experiment,
            "sample": sample_s,
            "session": session_s,
            "traj": traj_s,
            "state_lane_id": state_lane_id(experiment, sample_s, session_s, traj_s),
            "uid": "" if uid is None else text(uid),
            "global_steps": "" if global_steps is None else global_steps,
            "session_id": "" if session_id is None else text(session_id),
        }
        return cls._from_values(values, on_convert)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SessionIdentity:
        """Rebuild an identity from :meth:`to_dict` output.

        Raises:
            ValueError: a required key is missing, or ``state_lane_id`` does not
                match the other keys.
        """
        missing = [k for k in ("experiment_name", "sample", "session") if k not in data]
        if missing:
            raise ValueError(f"identity dict lacks {', '.join(missing)}; got keys {sorted(data)}")
        identity = cls.create(
            project=data.get("project"),
            experiment_name=data["experiment_name"],
            sample=data["sample"],
            session=data["session"],
            traj=data.get("traj", 0),
            uid=data.get("uid") or None,
            global_steps=None if data.get("global_steps", "") == "" else data["global_steps"],
            session_id=data.get("session_id") or None,
        )
        given = data.get("state_lane_id")
        if given is not None and given != identity.state_lane_id:
            raise ValueError(f"identity dict has state_lane_id={given!r} but its keys give {identity.state_lane_id!r}")
        return identity

    @classmethod
    def _from_values(cls, values: dict[str, Any], on_convert: ConvertHook | None = None) -> SessionIdentity:
        # Every value but global_steps is text already (bounded by create).
        attributes = dict(values)
        steps = values["global_steps"]
        if steps.__class__ is not str:
            converted = to_attribute_value(steps, key="global_steps", on_convert=on_convert)
            if converted is None:
                del attributes["global_steps"]
            else:
                attributes["global_steps"] = converted
        return cls(**values, attributes=attributes)

    def to_dict(self) -> dict[str, Any]:
        """The identity as RL-Insight's ``agent_loop_session(...).identity`` dict."""
        return {key: getattr(self, key) for key in IDENTITY_KEYS}


def check_fields(fields: Mapping[str, Any]) -> None:
    """Raise ``TypeError`` as Python would for a call with keywords :class:`IdentityFields` lacks."""
    unknown = sorted(set(fields) - FIELD_NAMES)
    if unknown:
        raise TypeError(f"unexpected session identity keyword {unknown[0]!r}; known: {', '.join(sorted(FIELD_NAMES))}")
    missing = [name for name in ("sample", "session") if name not in fields]
    if missing:
        raise TypeError(f"missing required session identity keyword {missing[0]!r}")


def current_identity() -> SessionIdentity | None:
    """The identity of the innermost open session scope the caller is inside, or None."""
    scope = _current.get()
    while scope is not None and not scope.open:
        scope = scope.parent
    return scope.identity if scope is not None else None


class using_identity:
    """Make ``identity`` current for the block (and tasks started inside it).

    Leaving the block never raises and never leaves ``identity`` behind: left out of
    order, or from another context, the scope is closed and skipped from then on
    (a ``RuntimeWarning``, which Python shows once per place by default). A plain
    class rather than a generator: a session enters two of these.
    """

    __slots__ = ("_identity", "_scope", "_token")

    def __init__(self, identity: SessionIdentity | None) -> None:
        self._identity = identity

    def __enter__(self) -> SessionIdentity | None:
        scope = self._scope = _Scope(self._identity, _current.get())
        self._token = _current.set(scope)
        return self._identity

    def __exit__(self, *exc: object) -> None:
        scope = self._scope
        scope.open = False
        if _current.get() is scope:
            try:
                _current.reset(self._token)
            except ValueError:  # made in another context (e.g. an async generator closed by another task)
                note_repair()
        else:
            note_repair()
