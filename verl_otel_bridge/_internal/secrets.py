"""The one place that decides what is secret and how it is hidden.

Every repr, log line, error message, ``status()`` and ``doctor`` report goes through
these functions: URL user information (``http://user:password@host``) becomes
``***@`` and a URL's query string (``?api_key=...``) ``?***``; the values of keys
that look like credentials (``*header*``, ``*token*``, ``*secret*``, ``*password*``,
at any depth) become ``***``; and :class:`Scrubber`
removes known secret strings from free text, such as an exception message that
quotes a URL or a header.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "***"
#: Keys whose values are never shown (case-insensitive substring match).
SECRET_KEY_PARTS = ("header", "token", "secret", "password", "authorization", "api_key", "apikey")
#: Shorter secrets are masked where they appear as values, but not searched for in other text.
MIN_SCRUBBED = 4
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#@\s]+)@")
# A URL's query string: up to its fragment, whitespace or a quote.
_QUERY = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s?#'\"]*)\?(?P<query>[^\s#'\"]+)")


def is_secret_key(key: object) -> bool:
    """True for keys whose values must not be shown."""
    lowered = str(key).lower()
    return any(part in lowered for part in SECRET_KEY_PARTS)


def mask_url(text: str) -> str:
    """``text`` with the user information of every URL in it replaced by ``***@``, its query by ``?***``."""
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m.group('head')}?{MASK}", text)


def masked(key: object, value: Any) -> Any:
    """``value`` safe to show under ``key``: secret keys masked at any depth, URL user information removed."""
    if is_secret_key(key) and value not in (None, "", (), [], {}):
        return MASK
    if isinstance(value, Mapping):
        return {str(k): masked(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked(key, v) for v in value]
    if isinstance(value, str):
        return mask_url(value)
    return value


def secrets_in(value: Any, key: object = "", *, hidden: bool = False) -> set[str]:
    """Every string in ``value`` that :func:`masked` would hide (long enough to search for elsewhere)."""
    hidden = hidden or is_secret_key(key)
    found: set[str] = set()
    if isinstance(value, Mapping):
        for k, v in value.items():
            found |= secrets_in(v, k, hidden=hidden)
    elif isinstance(value, (list, tuple)):
        for v in value:
            found |= secrets_in(v, key, hidden=hidden)
    elif isinstance(value, str):
        if hidden:
            found.add(value)
        for match in _USERINFO.finditer(value):
            userinfo = match.group("userinfo")
            found.update((userinfo, userinfo.partition(":")[2]))
        for match in _QUERY.finditer(value):
            query = match.group("query")
            found.add(query)
            found.update(part.partition("=")[2] for part in query.split("&"))
    return {secret for secret in found if len(secret) >= MIN_SCRUBBED}


class Scrubber:
    """Removes known secret strings (and URL user information) from any text or JSON-like value."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if len(s) >= MIN_SCRUBBED}, key=len, reverse=True)

    @classmethod
    def of(cls, *values: Any) -> Scrubber:
        """A scrubber for the secrets found in ``values`` (see :func:`secrets_in`)."""
        return cls(secrets_in(values))

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret in self._secrets:
                value = value.replace(secret, MASK)
            return mask_url(value)
        if isinstance(value, Mapping):
            return {k: self(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v) for v in value]
        return value
