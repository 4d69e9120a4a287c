"""The operator's errors, typed by whether a retry can help (kopf retries TemporaryError after ``delay``).

``translate`` is the only place an ``ApiException`` becomes one of these; ``kube.py`` calls it at
its boundary. 404 and 409-on-create are not errors there (gone / already there). Mistakes in a
user's SolarRun never arrive here: they end the run ``Failed`` with a reason.
"""

from __future__ import annotations

import json

import kopf


class ApiUnavailable(kopf.TemporaryError):
    """The API server did not answer, or answered 429/5xx/409: try again shortly. ``retry_after``: the
    server's own delay, when it sent one."""

    def __init__(self, message: str, *, delay: float, retry_after: float | None = None) -> None:
        super().__init__(message, delay=delay)
        self.retry_after = retry_after


class Forbidden(kopf.TemporaryError):
    """401/403: RBAC or a quota refused us; an administrator can fix it, so keep trying (slowly)."""


class Rejected(kopf.PermanentError):
    """400/422: the server refused an object built from the run's spec (e.g. an invalid volume source)."""


class NotOurs(kopf.PermanentError):
    """A job with the stage's name exists but the run did not create it: never touch it."""


def _message(exc) -> str:
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return str(getattr(exc, "reason", exc))


RETRY_DELAY, MAX_RETRY_DELAY = 5.0, 60.0


def retry_after(exc) -> float | None:
    """The server's Retry-After in seconds (429 and 503 send it), when it is a number."""
    headers = getattr(exc, "headers", None) or {}
    value = next((v for k, v in dict(headers).items() if str(k).lower() == "retry-after"), None)
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None  # an HTTP date: the fixed delay instead


def translate(exc, what: str) -> kopf.TemporaryError | kopf.PermanentError:
    """An ``ApiException`` (or a connection error) while doing ``what`` -> the error to raise. kopf
    re-runs the handler after ``delay``: the server's Retry-After when it sends one (capped at a
    minute), else a few seconds."""
    status = getattr(exc, "status", None)
    text = f"{what}: {_message(exc)}" if status else f"{what}: {exc}"
    if status in (400, 422):
        return Rejected(text)
    if status in (401, 403):
        return Forbidden(text, delay=MAX_RETRY_DELAY)
    wait = retry_after(exc)
    delay = RETRY_DELAY if wait is None else min(max(wait, 1.0), MAX_RETRY_DELAY)
    return ApiUnavailable(text, delay=delay, retry_after=delay if wait is not None else None)


FIRST_BACKOFF = 1.0


def backoff(exc: ApiUnavailable, retry: int) -> ApiUnavailable:
    """The same error, to be retried after the server's Retry-After when it sent one, else after a
    backoff that doubles with kopf's ``retry`` count (1, 2, 4 ... s), capped at ``MAX_RETRY_DELAY``."""
    delay = exc.retry_after if exc.retry_after is not None else min(FIRST_BACKOFF * 2 ** max(retry, 0),
                                                                    MAX_RETRY_DELAY)
    return ApiUnavailable(str(exc), delay=delay, retry_after=exc.retry_after)
