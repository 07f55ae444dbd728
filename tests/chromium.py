"""Debian's chromium as the tests run it: headless, no network of its own, a fresh profile each time.

Shared by ``tests/browser`` (the HTML report) and ``tests/backends`` (the screenshots).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

#: Set by nox (``_chromium_env`` in noxfile.py) when chromium could not be installed, saying why.
UNAVAILABLE_ENV = "VERL_OTEL_CHROMIUM_UNAVAILABLE"
#: Without the background-networking flags chromium keeps trying to reach hosts this machine cannot.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def command(profile: Path) -> list[str]:
    """``chromium`` with :data:`FLAGS` and ``profile`` as its user data directory; skips the test without chromium."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(os.environ.get(UNAVAILABLE_ENV) or "chromium is not installed: apt-get install chromium")
    return [found, *FLAGS, f"--user-data-dir={profile}"]


#: Bound of every wait on the browser; never reached when the page renders.
DEVTOOLS_TIMEOUT_S = 90.0
#: Bound of the wait for a page's text: a single-page app's first render of a few hundred
#: spans takes seconds on an idle 2-core machine and far longer when other test sessions load it.
PAGE_TIMEOUT_S = 180.0


class _Devtools:
    """Chromium's DevTools protocol over ``--remote-debugging-pipe`` (fd 3 in, fd 4 out; messages end with NUL)."""

    def __init__(self, command: list[str]) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def pipes_on_3_and_4() -> None:
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.process = subprocess.Popen(
            [*command, "--remote-debugging-pipe"],
            pass_fds=(3, 4),
            preexec_fn=pipes_on_3_and_4,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and wait (bounded) for its answer; events in between are skipped."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + DEVTOOLS_TIMEOUT_S
        while True:
            while b"\0" in self._buffer:
                raw, _, self._buffer = self._buffer.partition(b"\0")
                answer = json.loads(raw)
                if answer.get("id") == self._next_id:
                    if "error" in answer:
                        raise AssertionError(f"{method}: {answer['error']}")
                    return answer.get("result", {})  # type: ignore[no-any-return]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise AssertionError(f"chromium did not answer {method} within {DEVTOOLS_TIMEOUT_S} s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise AssertionError(f"chromium exited while answering {method}")
            self._buffer += chunk

    def close(self) -> None:
        with contextlib.suppress(AssertionError, OSError):
            self.call("Browser.close")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        os.close(self._to_browser)
        os.close(self._from_browser)


def screenshot(
    url: str,
    target: Path,
    profile: Path,
    *,
    shows: Sequence[str],
    hides: Sequence[str] = (),
    within: str = "body",
    local_storage: Mapping[str, str] | None = None,
    size: tuple[int, int] = (1440, 900),
    timeout_s: float = PAGE_TIMEOUT_S,
) -> Path:
    """A PNG of ``url`` in ``target``, taken once one element matching the CSS selector ``within``
    shows every string of ``shows`` (waiting at most ``timeout_s``).

    Shown means on screen: a text node holds the string, its middle lies in the viewport, and
    the element there is the node's own (not a popup over it, nor clipped by a scrolling
    container). Fails if that is not so at capture time, or if the page's text then contains any
    string of ``hides`` (a popup over the view).

    ``local_storage`` is set in the page's origin before its scripts run: single-page apps keep
    "already seen" flags of their onboarding popups there, and column choices.
    """
    devtools = _Devtools([*command(profile), f"--window-size={size[0]},{size[1]}", "about:blank"])
    try:
        target_id = devtools.call("Target.createTarget", url="about:blank")["targetId"]
        session = devtools.call("Target.attachToTarget", targetId=target_id, flatten=True)["sessionId"]
        devtools.call(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=size[0],
            height=size[1],
            deviceScaleFactor=1,
            mobile=False,
        )
        devtools.call("Page.enable", session)
        if local_storage:
            setting = "".join(
                f"localStorage.setItem({json.dumps(k)}, {json.dumps(v)});" for k, v in local_storage.items()
            )
            source = f"if (location.origin === {json.dumps(_origin(url))}) {{ {setting} }}"
            devtools.call("Page.addScriptToEvaluateOnNewDocument", session, source=source)
        devtools.call("Page.navigate", session, url=url)
        check = f"({_SHOWN_JS})({json.dumps(within)}, {json.dumps(list(shows))})"

        def evaluate(expression: str) -> Any:
            return devtools.call("Runtime.evaluate", session, expression=expression, returnByValue=True)["result"].get(
                "value"
            )

        def shown() -> str:
            return str(evaluate("document.body ? document.body.innerText : ''"))

        def diagnosis() -> str:
            found = {
                string: (
                    evaluate(f"({_SHOWN_JS})('body', {json.dumps([string])})"),
                    evaluate(
                        f"[...document.querySelectorAll({json.dumps(within)})]"
                        f".some(e => (e.innerText || '').includes({json.dumps(string)}))"
                    ),
                )
                for string in shows
            }
            return "; ".join(
                f"{s!r}: on screen {seen}, in the text of a {within!r} {held}" for s, (seen, held) in found.items()
            )

        deadline = time.monotonic() + timeout_s
        while not evaluate(check):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{url} never showed {list(shows)} in one {within!r} ({diagnosis()}); it shows:\n{shown()[:3000]}"
                )
            time.sleep(0.2)
        # The text is there; let running transitions (fade-ins, layout) finish before the picture.
        devtools.call("Runtime.evaluate", session, expression=_SETTLE_JS, awaitPromise=True)
        text = shown()
        assert evaluate(check), f"{url} no longer shows {list(shows)} in one {within!r}; it shows:\n{text[:3000]}"
        covering = [hidden for hidden in hides if hidden in text]
        assert not covering, f"{url} shows {covering} over the view"
        data = devtools.call("Page.captureScreenshot", session, format="png")["data"]
    finally:
        devtools.close()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(base64.b64decode(data))
    return target


#: Whether one element matching a selector shows each string on screen (see :func:`screenshot`).
_SHOWN_JS = """
(within, strings) => {
  const onScreen = (root, s) => {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const at = node.data.indexOf(s);
      if (at < 0) continue;
      const range = document.createRange();
      range.setStart(node, at);
      range.setEnd(node, at + s.length);
      for (const box of range.getClientRects()) {
        const x = box.left + box.width / 2, y = box.top + box.height / 2;
        if (x < 0 || y < 0 || x >= innerWidth || y >= innerHeight) continue;
        const hit = document.elementFromPoint(x, y), own = node.parentElement;
        if (hit && own.contains(hit)) return true;
      }
    }
    return false;
  };
  return [...document.querySelectorAll(within)].some(e => strings.every(s => onScreen(e, s)));
}
"""

#: Resolves after two animation frames once no CSS animation or transition is running (at most 5 s).
_SETTLE_JS = """
new Promise(resolve => {
  const end = Date.now() + 5000;
  const step = () => {
    const busy = document.getAnimations().some(a => a.playState === "running");
    if (!busy || Date.now() > end) requestAnimationFrame(() => requestAnimationFrame(() => resolve(true)));
    else setTimeout(step, 50);
  };
  step();
})
"""


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
