"""Configuration: precedence, environment aliases, validation, configure() and get_bridge()."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import opentelemetry.trace
import pytest
from threads import run_threads

import verl_otel_bridge as vob
from verl_otel_bridge import BridgeConfig
from verl_otel_bridge._internal.config import EXPORTERS, FALLBACKS

from .helpers import WAIT_S


class DictConfigLike(Mapping):
    """Behaves like OmegaConf's DictConfig for ``configure()``: a read-only Mapping, not a dict."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        return DictConfigLike(value) if isinstance(value, dict) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def resolve(config: Any = None, environ: dict[str, str] | None = None, **overrides: Any) -> BridgeConfig:
    return BridgeConfig.resolve(config, environ=environ or {}, **overrides)


# -- precedence ------------------------------------------------------------------


def test_defaults() -> None:
    config = resolve()
    assert (config.enabled, config.exporter, config.fallback, config.project, config.experiment_name) == (
        True,
        "auto",
        "memory",
        None,
        None,
    )
    assert config.service_name == "verl_otel_bridge"
    assert config.rl_insight_enable is None


@pytest.mark.parametrize(
    ("mapping", "environ", "overrides", "expected"),
    [
        ({"project": "map"}, {}, {"project": "kw"}, "kw"),  # overrides > mapping
        ({"project": "map"}, {"VERL_OTEL_BRIDGE_PROJECT": "env"}, {}, "map"),  # mapping > env
        (None, {"VERL_OTEL_BRIDGE_PROJECT": "env"}, {"project": "kw"}, "kw"),  # overrides > env
        (None, {"VERL_OTEL_BRIDGE_PROJECT": "env"}, {}, "env"),  # env > defaults
        ({"project": "map"}, {"VERL_OTEL_BRIDGE_PROJECT": "env"}, {"project": "kw"}, "kw"),  # all three
    ],
    ids=["kw>map", "map>env", "kw>env", "env>default", "kw>map>env"],
)
def test_precedence(mapping: Any, environ: dict, overrides: dict, expected: str) -> None:
    assert resolve(mapping, environ, **overrides).project == expected


def test_prefixed_variable_wins_over_alias() -> None:
    environ = {"OTEL_SERVICE_NAME": "alias", "VERL_OTEL_BRIDGE_SERVICE_NAME": "prefixed"}
    assert resolve(environ=environ).service_name == "prefixed"
    environ = {"OTEL_SDK_DISABLED": "true", "VERL_OTEL_BRIDGE_ENABLED": "true"}
    assert resolve(environ=environ).enabled is True


def test_resolve_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPERIMENT_NAME", "from-env")
    assert BridgeConfig.resolve().experiment_name == "from-env"


def test_a_bridgeconfig_is_taken_whole_with_overrides_on_top(monkeypatch: pytest.MonkeyPatch) -> None:
    base = resolve(project="p", exporter="memory")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_PROJECT", "env")
    assert BridgeConfig.resolve(base) is base
    assert BridgeConfig.resolve(base, experiment_name="e") == resolve(
        project="p", exporter="memory", experiment_name="e"
    )


# -- every key from the environment -----------------------------------------------

# key -> (raw environment value, parsed value)
PREFIXED_ENV = {
    "enabled": ("false", False),
    "exporter": (" jsonl ", "jsonl"),
    "fallback": ("console", "console"),
    "jsonl_path": ("/tmp/x.jsonl", "/tmp/x.jsonl"),
    "capture_dir": ("/shared/spans", "/shared/spans"),
    "capture_run": ("run-7", "run-7"),
    "capture_rotate_bytes": ("1048576", 1048576),
    "capture_max_bytes": ("0", 0),
    "otlp_endpoint": ("http://127.0.0.1:4318/v1/traces", "http://127.0.0.1:4318/v1/traces"),
    "otlp_headers": ("authorization=Bearer%20t,x-tenant=a", {"authorization": "Bearer t", "x-tenant": "a"}),
    "otlp_timeout_s": ("2.5", 2.5),
    "otlp_compression": ("GZIP", "gzip"),
    "otlp_certificate": ("/etc/ca.pem", "/etc/ca.pem"),
    "otlp_client_certificate": ("/etc/client.pem", "/etc/client.pem"),
    "otlp_client_key": ("/etc/client.key", "/etc/client.key"),
    "otlp_protocol": ("http/protobuf", "http/protobuf"),
    "memory_max_spans": ("17", 17),
    "project": ("proj", "proj"),
    "experiment_name": ("exp", "exp"),
    "service_name": ("svc", "svc"),
    "rl_insight_enable": ("yes", True),
    "rl_insight_server_url": ("http://127.0.0.1:9", "http://127.0.0.1:9"),
    "rl_insight_min_version": ("0.4.0", "0.4.0"),
    "rl_insight_config": (
        '{"prometheus": {"metrics_report_port": 9999}}',
        {"prometheus": {"metrics_report_port": 9999}},
    ),
    "rl_insight_transport": ("hub", "hub"),
    "max_queue_size": ("4096", 4096),
    "max_export_batch_size": ("64", 64),
    "schedule_delay_ms": ("250", 250),
    "shutdown_timeout_s": ("2.5", 2.5),
    "max_attribute_length": ("100", 100),
    "max_queue_bytes": ("1048576", 1048576),
    "max_attribute_items": ("50", 50),
    "spill_dir": ("/tmp/spill", "/tmp/spill"),
    "spill_max_bytes": ("0", 0),
    "spill_after_s": ("1.5", 1.5),
    "spill_probe_s": ("0.5", 0.5),
    "session_sample_rate": ("0.25", 0.25),
    "session_keep_slowest": ("0.1", 0.1),
    "session_keep_reward_extremes": ("0.05", 0.05),
    "session_hold_max_bytes": ("4096", 4096),
    "record_text": ("true", True),
    "redact_attributes": (" content, tool_args ,", ("content", "tool_args")),
    "reminder_interval_s": ("30", 30.0),
    "handle_sigterm": ("off", False),
    "progress_interval_s": ("0", 0.0),
    "straggler_factor": ("2.5", 2.5),
    "console_format": ("json", "json"),
}


def test_prefixed_table_covers_every_key() -> None:
    assert set(PREFIXED_ENV) == set(BridgeConfig.keys())


@pytest.mark.parametrize(("key", "raw", "expected"), [(k, *v) for k, v in PREFIXED_ENV.items()])
def test_every_key_reads_its_prefixed_variable(key: str, raw: str, expected: Any) -> None:
    config = resolve(environ={f"VERL_OTEL_BRIDGE_{key.upper()}": raw})
    assert getattr(config, key) == expected


@pytest.mark.parametrize(
    ("variable", "raw", "key", "expected"),
    [
        ("VERL_RL_INSIGHT_ENABLE", "1", "rl_insight_enable", True),
        ("VERL_RL_INSIGHT_ENABLE", "0", "rl_insight_enable", False),
        ("VERL_RL_INSIGHT_ENABLE", "", "rl_insight_enable", None),
        ("RL_INSIGHT_SERVER_URL", "http://h:1", "rl_insight_server_url", "http://h:1"),
        ("OTEL_SERVICE_NAME", "trainer", "service_name", "trainer"),
        ("OTEL_SDK_DISABLED", "true", "enabled", False),
        ("OTEL_SDK_DISABLED", "TRUE", "enabled", False),
        ("OTEL_SDK_DISABLED", "false", "enabled", True),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "5000", "max_queue_size", 5000),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "100", "max_export_batch_size", 100),
        ("OTEL_BSP_SCHEDULE_DELAY", "42", "schedule_delay_ms", 42),
    ],
)
def test_alias_variables(variable: str, raw: str, key: str, expected: Any) -> None:
    assert getattr(resolve(environ={variable: raw}), key) == expected


def test_otel_service_name_reaches_the_span_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-trainer")
    bridge = vob.configure(exporter="memory")
    with vob.span("s"):
        pass
    (span,) = bridge.memory_exporter.get_finished_spans()
    assert span.resource.attributes["service.name"] == "my-trainer"


def test_otel_sdk_disabled_disables_the_bridge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    bridge = vob.configure()
    assert bridge.enabled is False
    assert bridge.status()["reason"] == "disabled"


# -- mistakes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: resolve({"exporterr": "memory"}), ["exporterr", "Did you mean 'exporter'", "Known keys"]),
        (lambda: resolve(projct="p"), ["projct", "Did you mean 'project'", "Known keys"]),
        (lambda: resolve(environ={"VERL_OTEL_BRIDGE_NOPE": "1"}), ["VERL_OTEL_BRIDGE_NOPE", "Known keys"]),
        (lambda: resolve(exporter="kafka"), ["exporter", "kafka", *EXPORTERS]),
        (lambda: resolve(fallback="rl_insight"), ["fallback", "rl_insight", *FALLBACKS]),
        (lambda: resolve(environ={"VERL_OTEL_BRIDGE_EXPORTER": "kafka"}), ["exporter", "kafka", *EXPORTERS]),
        (lambda: resolve(max_queue_size=-1), ["max_queue_size", "-1", "at least 1"]),
        (lambda: resolve(memory_max_spans=0), ["memory_max_spans", "at least 1"]),
        (lambda: resolve(max_attribute_length=0), ["max_attribute_length", "at least 1"]),
        (lambda: resolve(max_export_batch_size=-3), ["max_export_batch_size", "at least 1"]),
        (lambda: resolve(max_queue_size=10, max_export_batch_size=20), ["max_export_batch_size", "max_queue_size"]),
        (lambda: resolve(schedule_delay_ms=-1), ["schedule_delay_ms", "negative"]),
        (lambda: resolve(shutdown_timeout_s=0), ["shutdown_timeout_s", "positive"]),
        (lambda: resolve(max_queue_size="lots"), ["max_queue_size", "lots", "integer"]),
        (lambda: resolve(max_queue_size=True), ["max_queue_size", "integer"]),
        (lambda: resolve(environ={"OTEL_BSP_MAX_QUEUE_SIZE": "lots"}), ["OTEL_BSP_MAX_QUEUE_SIZE", "integer"]),
        (lambda: resolve(shutdown_timeout_s="soon"), ["shutdown_timeout_s", "number"]),
        (lambda: resolve(enabled="maybe"), ["enabled", "maybe", "true or false"]),
        (lambda: resolve(enabled=2), ["enabled", "true or false"]),
        (lambda: resolve(environ={"OTEL_SDK_DISABLED": "maybe"}), ["OTEL_SDK_DISABLED", "true or false"]),
        (lambda: resolve(environ={"VERL_RL_INSIGHT_ENABLE": "perhaps"}), ["VERL_RL_INSIGHT_ENABLE", "true, false"]),
        (lambda: resolve(rl_insight_min_version="latest"), ["rl_insight_min_version", "latest", "0.3.0"]),
        (lambda: resolve(rl_insight_config=[1, 2]), ["rl_insight_config", "mapping"]),
        (lambda: resolve(environ={"VERL_OTEL_BRIDGE_RL_INSIGHT_CONFIG": "{bad json"}), ["RL_INSIGHT_CONFIG", "JSON"]),
        (lambda: resolve(exporter=3), ["exporter", "auto", "rl_insight", "memory"]),
        (lambda: resolve(rl_insight_transport="grpc"), ["rl_insight_transport", "grpc", "hub"]),
        (lambda: resolve(jsonl_path=""), ["jsonl_path", "file"]),
        (lambda: resolve(redact_attributes=[1]), ["redact_attributes", "list of strings"]),
        (lambda: resolve(reminder_interval_s=0), ["reminder_interval_s", "positive"]),
        (lambda: resolve(progress_interval_s=-1), ["progress_interval_s", "0 (off)"]),
        (
            lambda: resolve(environ={"VERL_OTEL_BRIDGE_STRAGGLER_FACTOR": "nan"}),
            ["straggler_factor", "STRAGGLER_FACTOR"],
        ),
        (lambda: resolve(console_format="pretty"), ["console_format", "pretty", "text", "json"]),
        (lambda: resolve(["exporter"]), ["mapping", "list"]),
    ],
)
def test_mistakes_raise_valueerror_naming_key_and_fix(call: Any, named: list[str]) -> None:
    with pytest.raises(ValueError) as raised:
        call()
    for text in named:
        assert text in str(raised.value), (text, str(raised.value))


def test_unwritable_jsonl_path_fails_at_configure(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(ValueError, match="jsonl_path"):
        vob.configure(exporter="jsonl", jsonl_path=str(not_a_dir / "spans.jsonl"))
    with pytest.raises(ValueError, match="jsonl_path"):
        vob.configure(exporter="rl_insight", fallback="jsonl", jsonl_path=str(not_a_dir / "spans.jsonl"))


def test_dictconfig_like_mapping_works() -> None:
    section = DictConfigLike(
        {"exporter": "memory", "project": "p", "rl_insight_config": {"prometheus": {"metrics_report_port": 1}}}
    )
    bridge = vob.configure(section, experiment_name="e")
    assert (bridge.config.exporter, bridge.config.project, bridge.config.experiment_name) == ("memory", "p", "e")
    assert bridge.config.rl_insight_config == {"prometheus": {"metrics_report_port": 1}}
    assert type(bridge.config.rl_insight_config["prometheus"]) is dict


# -- configure() and get_bridge() ------------------------------------------------------


def test_configure_twice_flushes_and_replaces(tmp_path: Path) -> None:
    provider_before = opentelemetry.trace.get_tracer_provider()
    first = vob.configure(exporter="memory")
    with vob.span("one"):
        pass
    jsonl = tmp_path / "first.jsonl"
    second = vob.configure(exporter="jsonl", jsonl_path=str(jsonl), schedule_delay_ms=600_000)
    with vob.span("two"):
        pass
    third = vob.configure(exporter="memory")
    assert vob.get_bridge() is third
    # the first's memory exporter still has its span; the second's queued span was flushed on replace
    assert [s.name for s in first.memory_exporter.get_finished_spans()] == ["one"]
    assert [line for line in jsonl.read_text().splitlines() if '"two"' in line]
    assert second.status()["counters"]["exported"] == {"jsonl": 1}
    with vob.span("three"):
        pass
    assert [s.name for s in third.memory_exporter.get_finished_spans()] == ["three"]
    assert opentelemetry.trace.get_tracer_provider() is provider_before
    assert first.tracer is not third.tracer


def test_get_bridge_without_configure_builds_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "memory")
    monkeypatch.setenv("VERL_OTEL_BRIDGE_PROJECT", "envproj")
    bridge = vob.get_bridge()
    assert vob.get_bridge() is bridge
    assert (bridge.config.exporter, bridge.config.project) == ("memory", "envproj")
    with vob.session(sample=0, session=0) as s:
        pass
    assert s.identity.project == "envproj"


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [("VERL_OTEL_BRIDGE_EXPORTER", "kafka", "exporter='kafka'"), ("VERL_OTEL_BRIDGE_NO_SUCH_KEY", "1", "NO_SUCH_KEY")],
)
def test_get_bridge_with_bad_env_logs_an_error_instead_of_raising(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, variable: str, value: str, named: str
) -> None:
    monkeypatch.setenv(variable, value)
    with caplog.at_level(logging.ERROR, logger="verl_otel_bridge"):
        with vob.span("still works"):
            pass
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and named in errors[0].getMessage()
    assert vob.get_bridge().config == BridgeConfig()
    assert vob.force_flush(WAIT_S)


def test_module_shutdown_empties_the_slot() -> None:
    first = vob.configure(exporter="memory")
    vob.shutdown()
    assert vob.get_bridge() is not first


def test_explicit_enabled_wins_over_otel_sdk_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK reads OTEL_SDK_DISABLED by itself; a bridge told enabled=True must still record."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    bridge = vob.configure(exporter="memory", enabled=True)
    with vob.span("s"):
        pass
    assert bridge.status()["enabled"] is True
    assert [s.name for s in bridge.memory_exporter.get_finished_spans()] == ["s"]


def test_concurrent_first_get_bridge_builds_one_bridge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_OTEL_BRIDGE_EXPORTER", "memory")
    barrier = threading.Barrier(16, timeout=WAIT_S)
    seen: list[vob.Bridge] = []

    def first_use() -> None:
        barrier.wait()
        seen.append(vob.get_bridge())

    assert not run_threads(first_use for _ in range(16))
    assert len(seen) == 16 and len({id(bridge) for bridge in seen}) == 1


@pytest.mark.parametrize(
    ("call", "key"),
    [
        (lambda: resolve(exporter="kafka"), "exporter"),
        (lambda: resolve(environ={"OTEL_BSP_MAX_QUEUE_SIZE": "lots"}), "max_queue_size"),
        (lambda: resolve(max_queue_size=10, max_export_batch_size=20), "max_export_batch_size"),
        (lambda: resolve({"exporterr": "memory"}), None),
    ],
)
def test_a_config_error_carries_its_key(call: Any, key: str | None) -> None:
    with pytest.raises(vob.ConfigError) as raised:
        call()
    assert raised.value.key == key
