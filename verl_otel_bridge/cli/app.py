"""The ``verl-otel-bridge`` command: ``doctor``, ``demo``, ``show``, ``report``, ``watch`` and ``replay``.

``doctor``
    Installed versions, the resolved configuration and where each value came
    from (secrets masked), which exporter ``auto`` would choose and why, and
    whether the RL-Insight server answers. Exit code 0 when spans would reach
    what the configuration asks for (under plain ``auto``, the local fallback
    when RL-Insight is unusable), 1 otherwise; ``--json`` for scripts.
``demo``
    The simulated, traced agent loop of :mod:`verl_otel_bridge.cli.demo`.
``show CAPTURE... [--text] [--step N]``
    The span tree of captures (``exporter: jsonl``: files, run folders, step folders), the conversation rebuilt.
``replay CAPTURE... --to rl_insight|otlp|console``
    Re-export captures recorded offline, with the original ids and times.
``report CAPTURE... [--html OUT] [--step N]``
    Per step (captures as ``show`` reads them): the slowest sessions, unfinished and hung ones, errors, zero-advantage
    groups, reward against duration and turns (:mod:`verl_otel_bridge._internal.report`).
``watch CAPTURE... [--once]``
    The newest step of captures while they are written, refreshed in place (:mod:`verl_otel_bridge._internal.watch`).

The command line needs the ``cli`` extra (``click`` and ``rich``). They are
imported only inside :func:`main` and :func:`build_cli`, so the functions that
do the work (:func:`verl_otel_bridge.cli.doctor.diagnose`,
:class:`verl_otel_bridge._internal.captures.read.CaptureRecords`,
:func:`verl_otel_bridge.cli.replay.replay_records`) are usable without them.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from verl_otel_bridge._internal.accounting import SpanCounts
from verl_otel_bridge._internal.config import BridgeConfig
from verl_otel_bridge._internal.private_files import open_private_output
from verl_otel_bridge._internal.records import JsonWriter
from verl_otel_bridge._internal.stragglers import DEFAULT_MIN_S
from verl_otel_bridge._internal.watch.live import DEFAULT_IDLE_AFTER_S
from verl_otel_bridge._version import __version__, install_command
from verl_otel_bridge.cli.doctor import SERVER_TIMEOUT_S, diagnose
from verl_otel_bridge.cli.replay import replay_pipeline, replay_records, start_ray_for

if TYPE_CHECKING:
    import click

#: What to run when the ``cli`` extra is missing.
INSTALL_HINT = install_command("cli")

#: Files at least this large get a progress bar in ``replay``.
PROGRESS_MIN_BYTES = 1 << 20
#: What ``show`` keeps to draw its tree at most: spans, and their bytes as read (it reads on and counts the rest).
MAX_SHOWN_SPANS = 100_000
MAX_SHOWN_BYTES = 256 * 1024 * 1024


# -- command line ----------------------------------------------------------------


def _missing_dependency() -> str | None:
    for name in ("click", "rich"):
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``verl-otel-bridge`` console script."""
    missing = _missing_dependency()
    if missing is not None:
        print(
            f"verl-otel-bridge: the command line needs {missing!r}, which is not installed; "
            f"install it with: {INSTALL_HINT}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    build_cli().main(args=list(argv) if argv is not None else None, prog_name="verl-otel-bridge")


def build_cli() -> click.Group:
    """The ``click`` command group (needs the ``cli`` extra)."""
    import click
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def out() -> Console:
        return Console(highlight=False, soft_wrap=False)

    def err() -> Console:
        return Console(stderr=True, highlight=False, soft_wrap=True)  # file:line: lines stay whole

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(__version__, prog_name="verl-otel-bridge")
    def cli() -> None:
        """OpenTelemetry spans for verl agent loops: check the setup, run the demo, read, report and replay captures."""

    @cli.command(short_help="Check the setup: versions, configuration, where spans would go.")
    @click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
    @click.option(
        "--timeout",
        default=SERVER_TIMEOUT_S,
        show_default=True,
        type=click.FloatRange(min=0, min_open=True),
        help="Seconds to wait for the RL-Insight server and each OTLP endpoint (more than 0).",
    )
    @click.pass_context
    def doctor(ctx: click.Context, as_json: bool, timeout: float) -> None:
        """Versions, configuration, where spans would go and why; exit 1 if they would not reach what the
        configuration asks for (under plain exporter=auto, the local fallback is fine)."""
        try:
            report = diagnose(timeout_s=timeout)
        except ValueError as exc:  # e.g. --timeout nan, which the range lets through
            raise click.BadParameter(str(exc), param_hint="--timeout") from None
        if as_json:
            click.echo(JsonWriter(indent=2, default=str)(report))
        else:
            _render_doctor(out(), report)
        ctx.exit(0 if report["ok"] else 1)

    @cli.command(short_help="Run the simulated, traced agent loop.")
    @click.option(
        "--output",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("demo-output"),
        show_default=True,
        help="Where the run's capture, status.json and report are kept.",
    )
    def demo(output: Path) -> None:
        """Run the simulated, traced multi-turn agent loop (the same as ``make demo``)."""
        from verl_otel_bridge.cli.demo import main as demo_main

        demo_main(output)

    def no_spans(
        paths: Sequence[Path], skipped: Sequence[tuple[str, str]], step: int | None = None
    ) -> click.ClickException:
        if step is not None:
            present = _step_folders(paths)
            if present:
                return click.ClickException(
                    f"no step {step} in {', '.join(map(str, paths))}; the step folders there: {', '.join(present)}"
                )
        why = "; ".join(f"{path}: {reason}" for path, reason in skipped[:5]) or "no capture file in them"
        return click.ClickException(
            f"no span record in {', '.join(map(str, paths))} (a capture is what exporter jsonl writes: a run "
            f"folder, a step folder, or *.jsonl / *.jsonl.gz files); {why}"
        )

    def straggler_options(command: Callable[..., None]) -> Callable[..., None]:
        """``--straggler-factor`` and ``--straggler-min-s``: the straggler rule of ``report`` and ``watch``."""
        factor = click.option(
            "--straggler-factor",
            default=BridgeConfig.straggler_factor,
            show_default=True,
            type=click.FloatRange(min=0, min_open=True),
            help="A finished session slower than this many times its step's median is a straggler ...",
        )
        floor = click.option(
            "--straggler-min-s",
            default=DEFAULT_MIN_S,
            show_default=True,
            type=click.FloatRange(min=0),
            help="... when it is also longer than this many seconds.",
        )
        return factor(floor(command))

    @cli.command(short_help="Print the span tree of JSONL captures.")
    @click.argument("captures", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
    @click.option(
        "--max-attributes", default=6, show_default=True, type=click.IntRange(min=0), help="Attributes shown per span."
    )
    @click.option("--text", "with_text", is_flag=True, help="Also print each span's text (the conversation) whole.")
    @click.option("--step", type=int, default=None, help="Only this global_steps value's folder of a run.")
    def show(captures: tuple[Path, ...], max_attributes: int, with_text: bool, step: int | None) -> None:
        """Print the span tree of captures (exporter: jsonl); bad lines and files without spans are said, not fatal.

        CAPTURE are files (*.jsonl, *.jsonl.gz) or folders: a run folder, a step folder, a folder of them.
        Each generate turn's input is rebuilt whole (the capture stores each turn's new text once).
        """
        from verl_otel_bridge._internal.captures.read import CaptureRecords, find_captures
        from verl_otel_bridge._internal.tree import TEXT_KEYS, display, render_tree

        found = find_captures(captures, step=step)
        reading = CaptureRecords(found.files)
        records: list[dict[str, Any]] = []
        kept_bytes = left_out = 0
        for record in reading:
            if len(records) >= MAX_SHOWN_SPANS or kept_bytes >= MAX_SHOWN_BYTES:
                left_out += 1  # read on, for the counts, but keep no more
                continue
            records.append(record)
            kept_bytes += reading.last_size
        skipped = [*found.skipped, *reading.empty]
        if not records:
            raise no_spans(captures, skipped, step)
        console = err()
        _report_bad(console, reading.bad_examples, reading.bad_lines)
        _report_skipped(console, skipped, found.skipped_count + len(reading.empty))
        tree = render_tree(records, max_attributes=max_attributes, text_keys=TEXT_KEYS if with_text else ())
        for line in tree.splitlines():
            # Line by line, buffered: one large write cut short by a closed pipe can return without an error.
            sys.stdout.write(f"{line}\n")
        sys.stdout.flush()
        traces = len({display(r.get("trace_id")) for r in records})
        more = f"; {left_out} more spans read but not shown (narrow the captures, e.g. --step)" if left_out else ""
        console.print(Text(f"{len(records)} spans in {traces} traces; {reading.bad_lines} bad lines{more}"))

    @cli.command(short_help="Per-step stragglers, hung sessions, errors and rewards of JSONL captures.")
    @click.argument("captures", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
    @click.option(
        "--html", "html_out", type=click.Path(dir_okay=False, path_type=Path), help="Also write this HTML file."
    )
    @click.option("--step", type=int, default=None, help="Only this global_steps value.")
    @click.option("--top", default=5, show_default=True, type=click.IntRange(min=1), help="Slowest sessions per step.")
    @click.option(
        "--text", "with_text", is_flag=True, help="Also print each slowest session's first input and last output."
    )
    @straggler_options
    def report(
        captures: tuple[Path, ...],
        html_out: Path | None,
        step: int | None,
        top: int,
        with_text: bool,
        straggler_factor: float,
        straggler_min_s: float,
    ) -> None:
        """Per global_steps: sessions, duration p50/p90/max, the slowest sessions, unfinished and hung sessions,
        errors, groups of one uid whose rewards are all equal, and reward against duration and turns.

        CAPTURE are files (*.jsonl, *.jsonl.gz) or folders: a run folder, a step folder (--step N opens only
        that step's folder of a run), a folder of runs; they are streamed. Files without spans are skipped and said.
        """
        from verl_otel_bridge._internal.report.text import renderables
        from verl_otel_bridge.report import build_report

        if html_out is not None:
            problem = _unwritable(html_out)
            if problem is not None:
                raise click.BadParameter(f"{html_out}: {problem}", param_hint="--html")
        built = build_report(
            captures, step=step, top=top, straggler_factor=straggler_factor, straggler_min_s=straggler_min_s
        )
        if not built.records:
            raise no_spans(captures, built.skipped, step)
        if step is not None and not built.steps:
            present = ", ".join(str(s) if s != "" else "(no global_steps)" for s in built.steps_present) or "none"
            raise click.ClickException(f"no step {step} in these captures; the steps present: {present}")
        console = out()
        for part in renderables(built, text=with_text):
            console.print(part)
        if html_out is not None:
            from verl_otel_bridge._internal.report.html import render_html

            try:
                with os.fdopen(open_private_output(html_out, truncate=True), "w", encoding="utf-8") as page:
                    page.write(render_html(built))
            except OSError as exc:
                raise click.ClickException(f"--html {html_out}: cannot write it ({exc.strerror or exc})") from None
            err().print(Text(f"wrote {html_out}"))

    @cli.command(short_help="Watch captures as they are written: the newest step, hung sessions, errors.")
    @click.argument("captures", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
    @click.option("--once", is_flag=True, help="Print one snapshot of what the captures hold now, and exit.")
    @click.option(
        "--interval",
        default=1.0,
        show_default=True,
        type=click.FloatRange(min=0.05, max=3600),
        help="Seconds between refreshes.",
    )
    @click.option(
        "--hung-after",
        default=DEFAULT_IDLE_AFTER_S,
        show_default=True,
        type=click.FloatRange(min=0),
        help="An open session whose last span started longer ago than this many seconds looks hung.",
    )
    @click.option("--top", default=5, show_default=True, type=click.IntRange(min=1), help="Slowest sessions kept.")
    @straggler_options
    @click.pass_context
    def watch(
        ctx: click.Context,
        captures: tuple[Path, ...],
        once: bool,
        interval: float,
        hung_after: float,
        top: int,
        straggler_factor: float,
        straggler_min_s: float,
    ) -> None:
        """Follow JSON Lines captures while a run writes them (files, *.jsonl or *.jsonl.gz, or folders: a run
        folder, a step folder, a folder of runs (its newest run), whose new files are followed too) and show,
        about once per interval, the newest step: sessions finished and open, rates, durations, reward,
        zero-advantage groups, hung sessions, the slowest and stragglers, errors by type and tool, the trainer's
        phases and the previous step in one line.

        Without a terminal it prints one plain line per interval. Ctrl-C or SIGTERM ends it (exit code 0).
        """
        from verl_otel_bridge._internal.stragglers import StragglerRule
        from verl_otel_bridge._internal.watch import loop, screen
        from verl_otel_bridge._internal.watch.follow import Follower
        from verl_otel_bridge._internal.watch.live import LiveView

        follower = Follower(list(captures))
        view = LiveView(rule=StragglerRule(straggler_factor, straggler_min_s), idle_after_s=hung_after, top=top)
        title = " ".join(str(c) for c in follower.paths)
        if follower.others:
            title += f" (the newest of {len(follower.others) + 1} runs: name a run folder to watch another)"
        console = out()
        if once:
            loop.catch_up(follower, view)
            snapshot = loop.snapshot_now(view)
            if not view.builder.records:
                raise no_spans(captures, sorted(snapshot.broken))
            for part in screen.renderables(snapshot, title):
                console.print(part)
            return
        loop.run(console, follower, view, title=title, interval_s=interval)
        ctx.exit(0)

    @cli.command(short_help="Re-export JSONL captures to RL-Insight, OTLP or the console.")
    @click.argument("captures", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
    @click.option(
        "--to",
        "target",
        required=True,
        type=click.Choice(["rl_insight", "otlp", "console"]),
        help="Where to send the spans.",
    )
    @click.option(
        "--batch-size",
        type=click.IntRange(min=1),
        default=None,
        help="Spans per export call [default: max_export_batch_size, 512].",
    )
    @click.option("--step", type=int, default=None, help="Only this global_steps value's folder of a run.")
    @click.option(
        "--init-ray/--no-init-ray",
        default=True,
        show_default=True,
        help="For rl_insight: start Ray if RL-Insight needs it and it is not running.",
    )
    @click.pass_context
    def replay(
        ctx: click.Context,
        captures: tuple[Path, ...],
        target: str,
        batch_size: int | None,
        step: int | None,
        init_ray: bool,
    ) -> None:
        """Re-export captures (files, run or step folders), with their original ids and times, to RL-Insight,
        OTLP or the console."""
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        from verl_otel_bridge._internal.captures.read import find_captures

        console = err()
        try:
            config = BridgeConfig.resolve()
        except ValueError as exc:
            console.print(Text(str(exc)))
            ctx.exit(2)
        found = find_captures(captures, step=step)
        if not found.files:
            raise no_spans(captures, found.skipped, step)
        counts = SpanCounts()
        try:
            # The console destination writes to the stdout it is built with: one that ends the replay
            # when its reader goes away (``replay --to console | head``).
            with contextlib.redirect_stdout(UntilReaderGone(sys.stdout)):
                pipeline = replay_pipeline(config, target, counts)
        except ValueError as exc:  # e.g. otlp without its extra, an unwritable jsonl fallback
            console.print(Text(str(exc)))
            ctx.exit(2)
        ray = None
        if target == "rl_insight" and init_ray:
            try:
                ray = start_ray_for(config, lambda line: console.print(Text(line)))
            except Exception as exc:  # noqa: BLE001 - without Ray, spans go to the fallback and the summary says so
                console.print(Text(f"starting Ray failed ({type(exc).__name__}: {exc}); RL-Insight will be unusable"))
        size = sum(_size(file) for file in found.files)
        progress = Progress(
            TextColumn("replaying"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=size < PROGRESS_MIN_BYTES,
        )
        try:
            with progress:
                task = progress.add_task("replay", total=size)
                assert pipeline.chain is not None  # replay_pipeline's config is enabled
                summary = replay_records(
                    found.files,
                    pipeline.chain,
                    counts,
                    batch_size=batch_size or config.max_export_batch_size,
                    on_progress=lambda n: progress.advance(task, n),
                )
            route = pipeline.rl_insight.status() if pipeline.rl_insight is not None else None
        except ReaderGone:
            end_quietly(ctx)
        finally:
            if pipeline.chain is not None:
                pipeline.chain.close()
            if ray is not None:
                with contextlib.suppress(Exception):
                    ray.shutdown()
        _report_bad(console, summary.bad, summary.bad_lines)
        _report_skipped(console, [*found.skipped, *summary.empty], found.skipped_count + len(summary.empty))
        title = captures[0].name if len(captures) == 1 else f"{len(captures)} captures"
        table = Table(title=f"replay {title} -> {target}", show_header=True)
        for column in ("read", "bad lines", "exported", "fallback", "failed"):
            table.add_column(column, justify="right")
        table.add_row(
            *(str(v) for v in (summary.read, summary.bad_lines, summary.exported, summary.fallback, summary.failed))
        )
        console.print(table)
        if route is not None and summary.fallback:
            gone = " and are gone when this command exits" if config.fallback == "memory" else ""
            console.print(
                Text(
                    f"RL-Insight was not usable ({route['reason']}): {route['detail']}; "
                    f"{summary.fallback} spans went to the {config.fallback} fallback{gone}. "
                    "See: verl-otel-bridge doctor"
                )
            )
        ctx.exit(0 if summary.failed == 0 and summary.fallback == 0 else 1)

    return cli


class ReaderGone(BaseException):
    """Standard output's reader went away (``| head``). A ``BaseException``, so that it passes the destinations'
    guards (which count and log every ``Exception``) and ends the command instead of each later batch failing."""


class UntilReaderGone:
    """``stream``, whose ``write`` and ``flush`` raise :class:`ReaderGone` once the reader closed the pipe."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            raise ReaderGone from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise ReaderGone from None


def end_quietly(ctx: click.Context) -> NoReturn:
    """End the command with exit code 1 and no message when standard output's reader went away, as click
    itself does for the commands that print through it: what is still buffered goes to the null device."""
    with contextlib.suppress(OSError, ValueError):  # a stream with no file descriptor (a test's)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    ctx.exit(1)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _report_bad(console: Any, bad: Sequence[tuple[str, int, str]], count: int, shown: int = 5) -> None:
    """The first ``shown`` bad lines as ``file:line: problem`` (the report's format too), then how many more."""
    from rich.text import Text

    from verl_otel_bridge._internal.tree import printable

    for file, number, problem in bad[:shown]:
        console.print(Text(printable(f"{file}:{number}: {problem}")))
    if count > min(shown, len(bad)):
        console.print(Text(f"... and {count - min(shown, len(bad))} more bad lines"))


def _report_skipped(console: Any, skipped: Sequence[tuple[str, str]], count: int, shown: int = 5) -> None:
    """The first ``shown`` files skipped as ``skipped PATH: why``, then how many more."""
    from rich.text import Text

    from verl_otel_bridge._internal.tree import printable

    for path, why in skipped[:shown]:
        console.print(Text(printable(f"skipped {path}: {why}")))
    if count > min(shown, len(skipped)):
        console.print(Text(f"... and {count - min(shown, len(skipped))} more skipped"))


def _step_folders(paths: Sequence[Path]) -> list[str]:
    """The step folders' steps (``global_steps=<n>``) under ``paths``, in step order; ``(no global_steps)``
    for the folder of spans without one."""
    from verl_otel_bridge._internal.captures.layout import step_of_dir
    from verl_otel_bridge._internal.captures.read import find_captures

    steps = {step_of_dir(file.parent.name) for file in find_captures(paths).files}
    numbered = sorted(step for step in steps if isinstance(step, int) and not isinstance(step, bool))
    return [str(step) for step in numbered] + (["(no global_steps)"] if None in steps else [])


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written as a new or replaced file, or None (asked first: a bad path fails fast)."""
    if path.is_dir():
        return "is a directory"
    if path.exists():
        return None if os.access(path, os.W_OK) else "cannot be written (permission denied)"
    parent = path.parent
    if not parent.is_dir():
        return f"its directory {parent} does not exist"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"its directory {parent} cannot be written"


def _render_doctor(console: Any, report: Mapping[str, Any]) -> None:
    """``doctor``'s report for people: tables for versions and configuration, then the route and the verdict."""
    from rich.table import Table
    from rich.text import Text

    def say(line: str, style: str = "") -> None:
        console.print(Text(line, style=style))  # Text: values are never read as rich markup

    versions = Table(title="Installed")
    versions.add_column("component")
    versions.add_column("version")
    for name, version in report["versions"].items():
        missing = "-" if name == "rl_insight.__version__" else "not installed"
        versions.add_row(Text(name), Text(missing if version is None else str(version)))
    console.print(versions)

    config = report["config"]
    table = Table(title="Configuration (secrets masked)")
    table.add_column("key")
    table.add_column("value")
    table.add_column("from")
    for key, entry in config["values"].items():
        value = entry["value"]
        table.add_row(
            Text(key), Text(value if isinstance(value, str) else json.dumps(value, default=str)), Text(entry["source"])
        )
    console.print(table)
    if config["error"]:
        say(f"configuration error: {config['error']}", "bold red")

    route = report["route"]
    if route is not None:
        say("Where spans go", "bold")
        exporter = route["exporter"]
        say(
            f"  exporter: {', '.join(exporter) if isinstance(exporter, list) else exporter} "
            f"(RL-Insight wanted: {route['rl_insight_wanted']})"
        )
        say(f"  spans go to: {route['destination']} (preferred: {route['preferred']}; reason: {route['reason']})")
        say(f"  why: {route['detail']}")
        if route["transport"]:
            say(f"  transport: {route['transport']}")
        if route["ray"]:
            say(f"  ray: {route['ray']}")
        local = route["local"]
        if local is not None:
            role = "fallback" if route["preferred"] == "rl_insight" else "exporter"
            say(f"  {role} {local['exporter']}: {local['detail']}")
        for copy in route["copies"]:
            say(f"  copy to {copy['exporter']}: {copy['detail']}")

        say("RL-Insight server", "bold")
        server = report["server"]
        if server is None:
            say("  no server URL set (RL_INSIGHT_SERVER_URL)")
        elif server["reachable"]:
            ports = ", ".join(f"{k}={v}" for k, v in server["ports"].items()) or "none"
            say(
                f"  {server['url']}: reachable (status {server['status']}); otlp_port={server['otlp_port']}; "
                f"advertised ports: {ports}"
            )
            if server["trace_endpoint"]:
                say(f"  trace endpoint: {server['trace_endpoint']}")
        else:
            say(f"  {server['url']}: not reachable ({server['error']})")

    verl = report.get("verl")
    if verl is not None:
        say(f"verl {verl['version']} ({verl['location']})", "bold")
        plugin = verl["plugin"]
        say(f"  loads verl.plugins entry points: {'yes' if verl['loads_plugins'] else 'no'}")
        say(f"  the plugin: {'loaded by ' + plugin['loaded_by'] if plugin['loaded_by'] else 'not loaded'}")
        if plugin["error"]:
            say(f"  it cannot load: {plugin['error']}")
        targets = verl["targets"]
        expected = targets["checked"] - len(targets["not_as_expected"])
        say(f"  what it wraps: {expected} of {targets['checked']} as expected")
        say(f"  tracing: {verl['tracing']}")
        say(f"  its spans go to: {verl['destination']}")
        say(f"  RLInsightLogger verl builds: {verl['rl_insight_logger']}")

    captures = report.get("captures")
    if captures is not None:
        say("Captures", "bold")
        say(f"  {captures['dir']}: {len(captures['runs'])} run folders (the newest first)")
        for run in captures["runs"]:
            say(
                f"  {run['run']}: {run['steps']} steps (newest {run['newest_step']}), {run['files']} files, "
                f"{run['bytes']} bytes"
            )
    for problem in report["problems"]:
        say(f"problem: {problem}", "red")
    for hint in report["hints"]:
        say(f"fix: {hint}")
    for note in report["notes"]:
        say(f"note: {note}")
    if report["ok"]:
        say(f"OK: spans reach {route['destination']}", "bold green")
    else:
        say("NOT OK: spans would not reach what the configuration asks for", "bold red")


if __name__ == "__main__":
    main()
