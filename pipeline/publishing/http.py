"""Reading a destination over HTTP: a 404 is an answer (None), any other
failure an error naming the destination."""

from __future__ import annotations

import urllib.error
import urllib.request
from email.message import Message

from pipeline.errors import PublishError


def fetch(url: str | urllib.request.Request, where: object, what: str, *, timeout: float = 30) -> bytes | None:
    """The body at a destination's URL, or None where it answers 404; any
    other failure is a PublishError naming the destination (`where`)."""
    found = fetch_with_headers(url, where, what, timeout=timeout)
    return found[0] if found is not None else None


def fetch_with_headers(
    url: str | urllib.request.Request, where: object, what: str, *, timeout: float = 30
) -> tuple[bytes, Message] | None:
    """As fetch, with the response's headers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read(), r.headers
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise PublishError(f"{where}: {what} failed: HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise PublishError(f"{where} is not reachable: {e}") from None
