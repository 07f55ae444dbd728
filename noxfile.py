"""Test environments: ``nox -s unit`` (every Python the package claims; ``nox -s unit-3.12`` one of them),
``nox -s unit_oldest`` (the oldest runtime dependencies allowed), ``nox -s doc_blocks`` (the code blocks of
README.md and docs/), ``nox -s integration`` (all four RL-Insight cases), ``nox -s browser``,
``nox -s terminal`` (``watch`` in tmux), ``nox -s verl`` (verl's real agent loops, one session per verl version;
``-- bench`` runs its benchmark),
``nox -s backends`` (Phoenix and MLflow).

One integration case alone: ``nox -s "integration(0.3.0)"`` or ``nox -t rl-insight-0.3.0``
(cases: none, 0.1.0, 0.2.0, 0.3.0). ``nox -l`` lists the sessions. Arguments after
``--`` go to pytest, e.g. ``nox -s "integration(0.3.0)" -- -k trace_span``.

Environment reuse: environments are built once per machine and kept outside the
checkout, in ``$VERL_OTEL_NOX_DIR`` (default ``~/.cache/verl-otel-bridge/nox``),
so a fresh clone (CI) reuses them: verl's alone is about 6 GB. Nox itself would
still rerun every install command on a kept environment and would not notice
changed inputs, so each environment stores a hash of its inputs (this
interpreter's version, ``pyproject.toml``, the session's requirement list) and
installs only when that hash changed. A shared environment holds the
dependencies only, never the package: each checkout runs the tests in a thin
environment of its own (``.nox/<environment>`` in the checkout) whose
``shared.pth`` adds the shared environment's packages and into which the package
is installed editable without dependencies (a few seconds, again only when its
inputs changed), so the entry points (``verl.plugins``, ``pytest11``,
``opentelemetry_traces_exporter``) and every import, in Ray workers too, resolve
to the checkout running the tests. Any number of checkouts run the same session
at the same time (a shared lock on the environment); installing into it takes
the lock alone. A dependency removed from ``pyproject.toml`` is not uninstalled
from a kept environment: rebuild with ``nox --reuse-venv=never``.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nox
import tomllib

nox.needs_version = ">=2024.10.9"  # reuse_venv option
nox.options.reuse_venv = "yes"
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["unit", "unit_oldest", "doc_blocks", "integration", "browser", "terminal", "backends"]
# A Python version this machine lacks is skipped with nox's message, also under CI.
nox.options.error_on_missing_interpreters = False

ROOT = Path(__file__).resolve().parent
#: Every Python the package claims; pyproject.toml's classifiers list exactly these (tests/unit/test_metadata.py).
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
nox.options.envdir = os.environ.get("VERL_OTEL_NOX_DIR", str(Path.home() / ".cache" / "verl-otel-bridge" / "nox"))
RL_INSIGHT_CASES = ("none", "0.1.0", "0.2.0", "0.3.0")
CASE_ENV = "RL_INSIGHT_TEST_CASE"
# Tests send traffic to 127.0.0.1 only: Ray must not pick an external address
# (read when ray is first imported), report usage stats, or use a proxy.
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


def _put_interpreters_on_path() -> None:
    """Find each of :data:`PYTHONS` where pyenv keeps it, ahead of pyenv's shims on PATH.

    A shim answers for every installed version but runs only the selected ones, so nox
    would find ``python3.13`` and fail to build its environment instead of skipping it.
    """
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = [
        str(binary.parent)
        for version in PYTHONS
        for binary in sorted(versions.glob(f"{version}.*/bin/python{version}"))[-1:]
    ]
    rest = [entry for entry in os.environ.get("PATH", "").split(os.pathsep) if not entry.endswith("/shims")]
    os.environ["PATH"] = os.pathsep.join([*found, *rest])


_put_interpreters_on_path()


def oldest_requirements() -> list[str]:
    """``name==lower bound`` for every runtime dependency of pyproject.toml."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = []
    for requirement in dependencies:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement)
        if found is None:
            raise ValueError(f"pyproject.toml: {requirement!r} has no plain lower bound to test")
        pins.append(f"{found[1]}=={found[2]}")
    return pins


PACKAGE = "verl-otel-bridge"
#: pyproject.toml's build-system requirement: each thin environment builds the editable install
#: with the shared environment's setuptools (an isolated build would see the shared, older one too).
BUILD_REQUIREMENT = "setuptools>=77"


def install_once(session: nox.Session, *requirements: str) -> str:
    """Install ``requirements`` into the shared environment unless it already has these exact inputs;
    return the python of this checkout's thin environment on top of it (see the module docstring).

    ``requirements`` start with the package's own ``-e ROOT[extras]`` (it brings the extras'
    dependencies; the package itself is then removed again); the rest are pinned extras
    such as ``rl-insight==0.3.0``. Holds a shared lock on the environment until the
    session ends, so no other checkout reinstalls it under a running session.
    """
    location = Path(session.virtualenv.location)  # type: ignore[attr-defined]
    lock = (location.parent / f"{location.name}.lock").open("w")
    digest = hashlib.sha256()
    for part in (
        "dependencies only",
        BUILD_REQUIREMENT,
        sys.version,
        (ROOT / "pyproject.toml").read_text(),
        *requirements,
    ):
        digest.update(part.replace(str(ROOT), ".").encode() + b"\0")  # the same inputs in any checkout
    stamp = location / ".inputs.sha256"

    def current() -> bool:  # a checkout with an older noxfile may have installed the package into it
        installed = list(Path(_site_packages(str(location / "bin" / "python"))).glob("*verl_otel_bridge*"))
        return stamp.is_file() and stamp.read_text() == digest.hexdigest() and not installed

    fcntl.flock(lock, fcntl.LOCK_SH)  # released when the process ends
    if not current():
        fcntl.flock(lock, fcntl.LOCK_EX)  # wait for the sessions running on it
        if not current():
            stamp.unlink(missing_ok=True)
            session.install(BUILD_REQUIREMENT, *requirements)
            session.run("python", "-m", "pip", "uninstall", "--quiet", "--yes", PACKAGE)
            stamp.write_text(digest.hexdigest())
        fcntl.flock(lock, fcntl.LOCK_SH)
    else:
        session.log("environment inputs unchanged: skipping install")
    return _checkout_environment(session, location, digest.hexdigest())


def _checkout_environment(session: nox.Session, shared: Path, inputs: str) -> str:
    """This checkout's thin environment on ``shared``: ``shared.pth`` plus the package, editable, no dependencies."""
    thin = ROOT / ".nox" / shared.name
    python = thin / "bin" / "python"
    thin.parent.mkdir(exist_ok=True)
    with (thin.parent / f"{shared.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = thin / ".inputs.sha256"
        if stamp.is_file() and stamp.read_text() == inputs:
            return str(python)
        shutil.rmtree(thin, ignore_errors=True)
        session.run(str(shared / "bin" / "python"), "-m", "venv", "--without-pip", str(thin), external=True)
        shared_site = _site_packages(str(shared / "bin" / "python"))
        Path(_site_packages(str(python)), "shared.pth").write_text(f"import site; site.addsitedir({shared_site!r})\n")
        install = ["-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", str(ROOT)]
        session.run(str(python), *install, external=True)
        _copy_scripts(shared / "bin", thin / "bin")
        stamp.write_text(inputs)
    return str(python)


def _copy_scripts(shared: Path, thin: Path) -> None:
    """The shared environment's console scripts (``opentelemetry-instrument``, ...), run by the thin python."""
    own = f"#!{shared / 'python'}"
    for script in shared.iterdir():
        target = thin / script.name
        if target.exists() or not script.is_file():
            continue
        with script.open("rb") as f:
            first = f.readline()
        if first.rstrip().decode(errors="replace") != own:
            continue  # not a console script of the shared python
        target.write_bytes(f"#!{thin / 'python'}\n".encode() + script.read_bytes()[len(first) :])
        target.chmod(0o755)


def _site_packages(python: str) -> str:
    done = subprocess.run(  # noqa: S603 - this session's own interpreter
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@nox.session(python=PYTHONS, tags=["unit"])
def unit(session: nox.Session) -> None:
    """Unit tests: the package with its ``test`` extra, no RL-Insight, on each Python the package claims."""
    python = install_once(session, "-e", f"{ROOT}[test]")
    session.run(python, "-m", "pytest", "tests/unit", *session.posargs, external=True)


#: Exits non-zero unless every ``name==version`` argument is what is installed.
CHECK_PINS = """
import sys
from importlib.metadata import version
from packaging.version import Version
wrong = [pin for pin in sys.argv[1:] if Version(version(pin.split("==")[0])) != Version(pin.split("==")[1])]
sys.exit(f"installed, but not the oldest allowed: {wrong}" if wrong else 0)
"""


@nox.session(python=PYTHONS[0], tags=["unit"])
def unit_oldest(session: nox.Session) -> None:
    """Unit tests on the oldest Python and the oldest ``opentelemetry-api``/``-sdk``/``packaging`` allowed."""
    pins = oldest_requirements()
    # setuptools>=77 builds the editable install only with packaging>=24.2, so the shared environment
    # keeps a current packaging for the build, and the oldest one goes into this checkout's thin
    # environment, ahead of the shared packages on sys.path.
    runtime_only = [pin for pin in pins if pin.startswith("packaging==")]
    # The test extra's reference encoder (opentelemetry-exporter-otlp-proto-common) stays at its
    # newest: it needs no opentelemetry-api, and the encoding tests compare against today's.
    build_packaging = ["packaging>=24.2"] if runtime_only else []
    python = install_once(
        session, "-e", f"{ROOT}[test]", *[pin for pin in pins if pin not in runtime_only], *build_packaging
    )
    if runtime_only:
        thin_site = _site_packages(python)
        # With its own dependencies: packaging 21.0 needs pyparsing, which nothing newer brings.
        session.run(
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--upgrade",
            "--target",
            thin_site,
            *runtime_only,
            external=True,
        )
    # pip would quietly keep a newer release if a test dependency needed one: fail instead.
    session.run(python, "-c", CHECK_PINS, *pins, silent=True, external=True)
    session.run(python, "-m", "pytest", "tests/unit", *session.posargs, external=True)


@nox.session(tags=["docs"])
def doc_blocks(session: nox.Session) -> None:
    """tests/docs: every code block of README.md and docs/ run as a reader runs it (``needs`` blocks: ``verl``)."""
    python = install_once(session, "-e", f"{ROOT}[test]")
    session.run(python, "-m", "pytest", "tests/docs", *session.posargs, external=True)


@nox.session(tags=["integration"])
@nox.parametrize(
    "rl_insight",
    [nox.param(case, id=case, tags=[f"rl-insight-{case}"]) for case in RL_INSIGHT_CASES],
)
def integration(session: nox.Session, rl_insight: str) -> None:
    """Integration tests against one released rl-insight (or none installed)."""
    requirements = ["-e", f"{ROOT}[test]", "opentelemetry-proto"]
    if rl_insight != "none":
        requirements.append(f"rl-insight=={rl_insight}")
    python = install_once(session, *requirements)
    # pytest's exit code 5 (nothing collected) fails the session, like any non-zero.
    session.run(
        python,
        "-m",
        "pytest",
        "tests/integration",
        *session.posargs,
        env={**LOOPBACK_ENV, CASE_ENV: rl_insight},
        external=True,
    )


@nox.session(tags=["browser"])
def browser(session: nox.Session) -> None:
    """The HTML report rendered by headless chromium; installs Debian's chromium with apt-get when missing.

    Where chromium cannot be installed (no apt-get, not root), the tests skip and say why.
    """
    problem = _ensure_chromium(session)
    python = install_once(session, "-e", f"{ROOT}[test]")
    session.run(python, "-m", "pytest", "tests/browser", *session.posargs, env=_chromium_env(problem), external=True)


def _chromium_env(problem: str | None) -> dict[str, str]:
    """What tells the tests why chromium is missing (they skip with that reason), or nothing."""
    return {"VERL_OTEL_CHROMIUM_UNAVAILABLE": problem} if problem else {}


def _ensure_chromium(session: nox.Session) -> str | None:
    """Install chromium unless it is on PATH; None when it is there, else why not."""
    return _ensure_debian_package(session, "chromium", ("chromium", "chromium-browser"))


def _ensure_debian_package(session: nox.Session, package: str, commands: tuple[str, ...]) -> str | None:
    """Install Debian's ``package`` with apt-get unless one of ``commands`` is on PATH; None when it is
    there, else why not."""
    if any(shutil.which(command) for command in commands):
        return None
    if shutil.which("apt-get") is None:
        return f"{package} is not installed and this machine has no apt-get to install it"
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"] if shutil.which("sudo") else None
    if prefix is None:
        return f"{package} is not installed, and installing it needs root or sudo"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", package]):
        session.log(" ".join([*prefix, *command]))
        done = subprocess.run([*prefix, *command], env=env, capture_output=True, text=True, timeout=1800)  # noqa: S603 - fixed commands
        if done.returncode != 0:
            return f"{' '.join(command)} failed ({done.returncode}): {done.stderr.strip()[-500:]}"
    found = any(shutil.which(command) for command in commands)
    return None if found else f"apt-get installed {package}, but no {commands[0]} is on PATH"


@nox.session(tags=["terminal"])
def terminal(session: nox.Session) -> None:
    """tests/terminal: ``verl-otel-bridge watch`` in a real terminal (tmux) while a process writes a capture;
    installs Debian's tmux with apt-get when missing (where it cannot, the tests skip and say why)."""
    problem = _ensure_debian_package(session, "tmux", ("tmux",))
    python = install_once(session, "-e", f"{ROOT}[test]")
    env = {"VERL_OTEL_TMUX_UNAVAILABLE": problem} if problem else {}
    session.run(python, "-m", "pytest", "tests/terminal", *session.posargs, env=env, external=True)


# verl's agent-loop modules import cachetools, uvicorn and fastapi, which ``verl`` itself
# does not require; the facade's side-by-side tests need a real RL-Insight in the same env.
VERL_VERSIONS = ("0.9.1",)


@nox.session(tags=["verl"])
@nox.parametrize("verl", [nox.param(version, id=version) for version in VERL_VERSIONS])
def verl(session: nox.Session, verl: str) -> None:
    """tests/verl: verl's real agent loops on CPU (in-process and on Ray) traced by the plugin.

    As root, pytest runs in a loopback-only network namespace, where ``test_phoenix.py`` starts Phoenix
    from the ``backends(phoenix)`` environment (built by ``nox -s backends``, which ``make test`` runs first).

    ``nox -s verl -- bench [options]`` runs ``bench/verl_overhead.py`` in this environment instead,
    ``nox -s verl -- bench-trainer [options]`` ``bench/trainer_phases.py``, ``nox -s verl -- bench-captures [options]``
    ``bench/capture_volume.py``.
    """
    python = install_once(
        session,
        "-e",
        f"{ROOT}[test,verl]",
        f"verl=={verl}",
        "cachetools",
        "uvicorn",
        "fastapi",
        "rl-insight==0.3.0",
        "pytest-asyncio",  # verl's own agent-loop tests (tests/verl/test_verls_own_tests.py) have async ones
    )
    benches = {
        "bench": "bench/verl_overhead.py",
        "bench-trainer": "bench/trainer_phases.py",
        "bench-captures": "bench/capture_volume.py",
    }
    if session.posargs[:1] and session.posargs[0] in benches:
        session.run(python, benches[session.posargs[0]], *session.posargs[1:], env=LOOPBACK_ENV, external=True)
        return
    # The published verl packages some tests read (fetched once per machine): here, where the index is reachable.
    session.run(python, "tests/verl_sources.py", silent=True, external=True)
    command = [python, "-m", "pytest", "tests/verl", *session.posargs]
    phoenix = Path(nox.options.envdir) / "backends-phoenix" / "bin" / "phoenix"
    if not _can_isolate_network():
        session.log("not root: tests/verl run in this network namespace, without Phoenix (test_phoenix.py skips)")
        session.run(*command, env=LOOPBACK_ENV, external=True)
    elif not phoenix.is_file():
        session.log(f"no {phoenix}: test_phoenix.py skips (nox -s 'backends(phoenix)' builds it)")
        session.run(*_in_loopback_namespace(command), env=LOOPBACK_ENV, external=True)
    else:
        # tests/verl/test_phoenix.py starts Phoenix from the backends environment, next to verl's agent loop.
        env = {**LOOPBACK_ENV, "VERL_OTEL_PHOENIX": str(phoenix)}
        session.run(*_in_loopback_namespace(command), env=env, external=True)
    # The doc blocks that need verl, Ray or RL-Insight (skipped by ``doc_blocks``) run here.
    session.run(python, "-m", "pytest", "tests/docs", "-k", "needs", env=LOOPBACK_ENV, external=True)


def _can_isolate_network() -> bool:
    """Whether :func:`_in_loopback_namespace` works here (``unshare -n`` needs root)."""
    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("ip") is not None


def _in_loopback_namespace(command: list[str]) -> list[str]:
    """``command`` run in a new network namespace whose only interface is loopback, brought up: there a
    server's wildcard listener is reachable from loopback only."""
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command]


#: Pinned to the releases docs/backends.md was written against. One environment each: Phoenix
#: needs graphql-core>=3.3, MLflow's graphene 3 needs <3.3 (in one environment pip settles on
#: graphene 2.0 and MLflow's UI answers its GraphQL queries with 500).
BACKENDS = {"phoenix": "arize-phoenix==20.26.1", "mlflow": "mlflow==3.17.2"}


@nox.session(tags=["backends"])
@nox.parametrize("backend", [nox.param(name, id=name) for name in BACKENDS])
def backends(session: nox.Session, backend: str) -> None:
    """tests/backends: ``exporter: otlp`` read back through a real Phoenix or MLflow server on loopback."""
    # Not the `test` extra: its opentelemetry-instrumentation-urllib3 (at most 0.66b1) needs an older
    # OpenTelemetry than Phoenix's opentelemetry-exporter-otlp 1.45.2, and pip backtracks for minutes.
    python = install_once(
        session, "-e", f"{ROOT}[cli,otlp]", "pytest>=8", "pytest-timeout>=2.3", "psutil", BACKENDS[backend]
    )
    problem = _ensure_chromium(session)  # for the screenshots docs/backends.md shows
    env = {**LOOPBACK_ENV, **_chromium_env(problem)}
    # Phoenix's OTLP gRPC listener binds [::] whatever PHOENIX_HOST says: pytest and every
    # server it starts run in a new network namespace whose only interface is loopback.
    session.run(
        *_in_loopback_namespace([python, "-m", "pytest", f"tests/backends/test_{backend}.py", *session.posargs]),
        env=env,
        external=True,
    )


@nox.session(tags=["bench"])
def bench(session: nox.Session) -> None:
    """bench/run.py: writes bench/results.json, docs/performance.md and docs/performance.png."""
    python = install_once(session, "-e", f"{ROOT}[bench]")
    session.run(python, "bench/run.py", *session.posargs, env=LOOPBACK_ENV, external=True)
