"""Time limits on the Hub requests of a download or a push.

``huggingface_hub`` (1.x, on httpx) sends most API requests (the repository and file
listings a download makes, every request of an upload) with no timeout, so a server that
accepts the connection and never answers makes them wait forever, and a file transfer
that stalls is tried six times. :func:`time_limits` bounds them, for our requests only.
"""

from __future__ import annotations

import contextlib
import re
import threading
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass


def request_timeout() -> float:
    """Seconds to wait for the Hub to answer a request: ``HF_HUB_ETAG_TIMEOUT`` (10 s)."""
    from huggingface_hub import constants

    return float(getattr(constants, "HF_HUB_ETAG_TIMEOUT", 10))



def download_timeout() -> float:
    """Seconds a Hub request may stay silent once under way: ``HF_HUB_DOWNLOAD_TIMEOUT`` (10)."""
    from huggingface_hub import constants

    return float(getattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 10))



# huggingface_hub (1.x, on httpx) sends most API requests (the repository and file listings
# a download makes, every request of an upload) with no timeout, so a server that accepts
# the connection and never answers makes them wait forever; a file transfer that stalls is
# tried six times, 6 x HF_HUB_DOWNLOAD_TIMEOUT + 5 s in all, and a file's metadata request
# up to six more times with a 60 s timeout. Its settings are global, so instead of changing
# them, our requests carry a header that two event hooks on its HTTP session recognise: the
# request hook removes the header (it is not for the server), bounds the request's timeouts
# and counts the attempts; the response hook notes each answer. Other requests pass
# untouched. A header, because huggingface_hub downloads in worker threads, which do not
# inherit context variables; a context variable too, for the requests of the calling thread
# that carry none of our headers (an upload to storage outside the Hub).
_SCOPE_HEADER = "X-Transformer-GMM-Scope"
_SCOPE_KEY = "transformer_gmm_scope"  # the request extension that keeps the scope on redirects
_SILENT_ATTEMPTS = 2  # silent attempts of one request after which a download or push gives up
_TIMEOUT_KEYS = ("connect", "read", "write", "pool")  # httpx's timeouts, each per operation
_RANGE = re.compile(r"bytes=(\d+)-")
_HOOKS_LOCK = threading.Lock()
_CURRENT_SCOPE: ContextVar[str | None] = ContextVar("transformer_gmm_hub_scope", default=None)


class _Stalled(Exception):
    """A Hub request went silent :data:`_SILENT_ATTEMPTS` times in a row."""


@dataclass
class _Attempts:
    start: int  # the first byte asked for: it grows when a resumed download had got data
    silent: int = 0  # attempts that got no answer, or whose body stopped, in a row
    status: int | None = None  # the last attempt's HTTP status; None until it answers


class _Scope:
    """The Hub requests of one download or push: their time limit and their attempts."""

    def __init__(self, default: float, limit: float) -> None:
        self.default, self.limit = default, limit  # for requests with no timeout; the most
        self.attempts: dict[tuple[str, str], _Attempts] = {}
        self.lock = threading.Lock()  # huggingface_hub sends from several threads

    def attempt(self, method: str, url: str, start: int, timeout: float) -> None:
        with self.lock:
            attempts = self.attempts.get((method, url))
            if attempts is None or start > attempts.start:  # a first try, or progress
                self.attempts[(method, url)] = _Attempts(start)
                return
            # A retry. After no answer, or an answer whose body stopped (a redirect's
            # target stopped, for 3xx), the server is silent; an error status that asks
            # for a retry (429, 5xx) is an answer, left to huggingface_hub's back-off.
            if attempts.status is None or attempts.status < 400:
                attempts.silent += 1
            attempts.status = None
            if attempts.silent >= _SILENT_ATTEMPTS:
                setting = "HF_HUB_ETAG_TIMEOUT" if method == "HEAD" else "HF_HUB_DOWNLOAD_TIMEOUT"
                raise _Stalled(
                    f"{method} {url.split('?')[0]} went silent {attempts.silent} times in a "
                    f"row, for {timeout:g} s each time: {setting}"
                )

    def answered(self, method: str, url: str, status: int) -> None:
        with self.lock:
            attempts = self.attempts.get((method, url))
            if attempts is not None:
                attempts.status = status


_SCOPES: dict[str, _Scope] = {}


def _before_request(request) -> None:
    """httpx request hook: bound and count the requests of a :func:`time_limits` block."""
    scope_id = (
        request.headers.get(_SCOPE_HEADER)
        or request.extensions.get(_SCOPE_KEY)
        or _CURRENT_SCOPE.get()
    )
    if scope_id is None:
        return
    if _SCOPE_HEADER in request.headers:
        del request.headers[_SCOPE_HEADER]
    scope = _SCOPES.get(scope_id)
    if scope is None:  # the block has ended
        return
    request.extensions[_SCOPE_KEY] = scope_id
    timeouts = request.extensions.get("timeout") or {}
    timeouts = {
        key: scope.default if timeouts.get(key) is None else min(timeouts[key], scope.limit)
        for key in _TIMEOUT_KEYS
    }
    request.extensions["timeout"] = timeouts
    match = _RANGE.match(request.headers.get("Range", ""))
    start = int(match.group(1)) if match else 0
    scope.attempt(request.method, str(request.url), start, timeouts["read"])


def _after_response(response) -> None:
    """httpx response hook: note that a request of a :func:`time_limits` block answered."""
    request = response.request
    scope = _SCOPES.get(request.extensions.get(_SCOPE_KEY, ""))
    if scope is not None:
        scope.answered(request.method, str(request.url), response.status_code)


def _install_hooks() -> bool:
    """Add the hooks to huggingface_hub's HTTP session; False where it has none (before
    1.0, huggingface_hub used requests, whose sessions take no such hooks)."""
    try:
        from huggingface_hub.utils import get_session
    except ImportError:
        return False
    # Installed at every block: huggingface_hub replaces its session after a connection
    # error, and the new one lacks them.
    hooks = getattr(get_session(), "event_hooks", None)
    if not isinstance(hooks, dict) or not {"request", "response"} <= hooks.keys():
        return False
    with _HOOKS_LOCK:
        if _before_request not in hooks["request"]:
            hooks["request"].append(_before_request)
        if _after_response not in hooks["response"]:
            hooks["response"].append(_after_response)
    return True


@contextlib.contextmanager
def time_limits() -> Iterator[dict[str, str]]:
    """Headers that put the Hub requests sent with them under time limits.

    Pass the headers to ``huggingface_hub`` (``HfApi(headers=...)``,
    ``snapshot_download(headers=...)``); the requests the block's own thread sends are
    covered even without them. Within the block each of those requests waits at
    most :func:`download_timeout` seconds for each step (connecting, each read and write)
    where it sets no timeout of its own, and never longer than both the download and the
    :func:`request_timeout`; one that stays silent twice in a row (no answer, or a body
    that stops) raises instead of being tried again, so a silent Hub ends a download or an
    upload in about twice the limit. The other requests of the process are left as they
    are. With a ``huggingface_hub`` older than 1.0 the headers are empty and its own
    limits apply.

    Yields
    ------
    headers : dict of str to str

    Examples
    --------
    >>> with time_limits() as headers:
    ...     print(set(headers) <= {"X-Transformer-GMM-Scope"})
    True
    """
    if not _install_hooks():
        yield {}
        return
    scope_id = uuid.uuid4().hex
    _SCOPES[scope_id] = _Scope(download_timeout(), max(download_timeout(), request_timeout()))
    token = _CURRENT_SCOPE.set(scope_id)
    try:
        yield {_SCOPE_HEADER: scope_id}
    finally:
        _CURRENT_SCOPE.reset(token)
        del _SCOPES[scope_id]


def no_answer(error: BaseException) -> str | None:
    """Why the Hub gave no answer, if ``error`` (or its cause) says so: a timeout, a stalled
    request, no connection; None for anything else, the Hub's own answers included.
    """
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        name = type(cause).__name__
        if isinstance(cause, _Stalled):
            return f"went silent ({cause})"
        if "timeout" in name.lower():
            return f"did not answer within {download_timeout():g} s (HF_HUB_DOWNLOAD_TIMEOUT)"
        if name in ("ConnectError", "ConnectionError", "ConnectionRefusedError"):
            detail = str(cause).splitlines()[0] if str(cause) else ""
            return f"could not be reached ({name}: {detail})"
        cause = cause.__cause__ or cause.__context__
    return None
