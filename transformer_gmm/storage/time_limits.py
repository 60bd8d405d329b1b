"""Time limits on the Hub requests of a download or a push.

``huggingface_hub`` (1.x, on httpx) sends most API requests (the repository and file
listings a download makes, every request of an upload) with no timeout, so a server that
accepts the connection and never answers makes them wait forever, and a file transfer
that stalls is tried six times. :func:`time_limits` bounds them, for our requests only.

Timeouts bound each silence, not a whole request: a server that sends one byte every
half second never lets one expire. :func:`before_deadline` bounds the whole network part
of a call by :func:`deadline` seconds.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from .format import CheckpointError

T = TypeVar("T")
DEADLINE_VARIABLE = "TRANSFORMER_GMM_HUB_DEADLINE"


def request_timeout() -> float:
    """Seconds to wait for the Hub to answer a request: ``HF_HUB_ETAG_TIMEOUT`` (10 s)."""
    from huggingface_hub import constants

    return float(getattr(constants, "HF_HUB_ETAG_TIMEOUT", 10))


def download_timeout() -> float:
    """Seconds a Hub request may stay silent once under way: ``HF_HUB_DOWNLOAD_TIMEOUT`` (10)."""
    from huggingface_hub import constants

    return float(getattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 10))


def deadline() -> float:
    """Seconds one fit, load, ``info`` or ``download`` may spend on the Hub in all.

    ``TRANSFORMER_GMM_HUB_DEADLINE`` when set (read at each call), else twice the longer of
    :func:`download_timeout` and :func:`request_timeout`, plus 3 s: 23 s by default, the
    time a Hub that stops answering takes to end a download.

    Raises
    ------
    CheckpointError
        When the variable is not a positive, finite number of seconds.

    Examples
    --------
    >>> import os
    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"TRANSFORMER_GMM_HUB_DEADLINE": "60"}):
    ...     print(deadline())
    60.0
    """
    raw = os.environ.get(DEADLINE_VARIABLE, "").strip()
    if not raw:
        return 2 * max(download_timeout(), request_timeout()) + 3
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise CheckpointError(
            f"{DEADLINE_VARIABLE} must be a positive number of seconds, got {raw!r}. Set it "
            "to, say, 120 for a slow connection, or unset it for the default."
        )
    return seconds


class DeadlinePassed(Exception):
    """The network part of a call did not finish within :func:`deadline` seconds."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"did not finish within {seconds:g} s ({DEADLINE_VARIABLE})")
        self.seconds = seconds


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
    """The Hub requests of one download or push: their time limits and their attempts."""

    def __init__(self, default: float, limit: float, seconds: float | None = None) -> None:
        self.default, self.limit = default, limit  # for requests with no timeout; the most
        self.seconds = seconds  # the deadline, from now; None: no deadline
        self.expires = None if seconds is None else time.monotonic() + seconds
        self.attempts: dict[tuple[str, str], _Attempts] = {}
        self.lock = threading.Lock()  # huggingface_hub sends from several threads

    def check_deadline(self) -> None:
        """Raise :class:`DeadlinePassed` once the deadline has passed."""
        if self.expires is not None and time.monotonic() >= self.expires:
            raise DeadlinePassed(self.seconds)

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
    scope.check_deadline()  # a request left behind by a caller that stopped waiting
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
    """httpx response hook: note that a request of a :func:`time_limits` block answered,
    and put the body it has still to read under the block's deadline."""
    request = response.request
    scope = _SCOPES.get(request.extensions.get(_SCOPE_KEY, ""))
    if scope is None:
        return
    scope.answered(request.method, str(request.url), response.status_code)
    if scope.expires is not None:
        # The hook runs once the headers are in, before the body is read, even for a
        # request that is not streamed: each piece of the body is then checked.
        base = _sync_stream_base(type(response.stream))
        if base is not None:
            response.stream = _deadline_stream_type(base)(response.stream, scope)


def _sync_stream_base(stream_type: type) -> type | None:
    """httpx's ``SyncByteStream`` (httpx or httpx2, whichever huggingface_hub uses) among
    the bases of ``stream_type``; None for an async or unknown stream, left as it is."""
    return next((cls for cls in stream_type.__mro__ if cls.__name__ == "SyncByteStream"), None)


@functools.cache
def _deadline_stream_type(base: type) -> type:
    """A ``base`` stream that raises :class:`DeadlinePassed` at the first piece of the body
    that arrives after the deadline: a body sent one byte at a time ends there, instead of
    keeping a request left behind busy for as long as the server sends."""

    class DeadlineStream(base):
        def __init__(self, stream, scope: _Scope) -> None:
            self.stream, self.scope = stream, scope

        def __iter__(self) -> Iterator[bytes]:
            self.scope.check_deadline()
            for chunk in self.stream:
                self.scope.check_deadline()
                yield chunk

        def close(self) -> None:
            self.stream.close()

    return DeadlineStream


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
def time_limits(seconds: float | None = None) -> Iterator[dict[str, str]]:
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

    With ``seconds``, the requests also stop at the deadline that many seconds from now:
    one that starts later, or reads a piece of its body later, raises
    :class:`DeadlinePassed`. (A request still reading headers that trickle in ends with
    its connection; :func:`before_deadline` does not wait for it.)

    Parameters
    ----------
    seconds : float, optional
        The deadline; by default none.

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
    limit = max(download_timeout(), request_timeout())
    _SCOPES[scope_id] = _Scope(download_timeout(), limit, seconds)
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
        if isinstance(cause, DeadlinePassed):
            return str(cause)
        if isinstance(cause, _Stalled):
            return f"went silent ({cause})"
        if "timeout" in name.lower():
            return f"did not answer within {download_timeout():g} s (HF_HUB_DOWNLOAD_TIMEOUT)"
        if name in ("ConnectError", "ConnectionError", "ConnectionRefusedError"):
            detail = str(cause).splitlines()[0] if str(cause) else ""
            return f"could not be reached ({name}: {detail})"
        cause = cause.__cause__ or cause.__context__
    return None


def before_deadline(call: Callable[[dict[str, str]], T], seconds: float) -> T:
    """``call(headers)`` under :func:`time_limits` with a deadline of ``seconds``: its
    result, or :class:`DeadlinePassed` once the deadline has passed, whatever the Hub does.

    The call runs in a daemon thread, and this thread waits for it at most ``seconds``:
    timeouts bound each silence of a request, never a whole one, so only a wait of our
    own bounds a server that answers one byte at a time. A call left behind stops at its
    next request or its next piece of body; it holds none of the caller's locks, and it
    never keeps the process from exiting. Nothing process-wide is changed.

    Parameters
    ----------
    call : callable
        Takes the headers of :func:`time_limits`; sends its requests with them.
    seconds : float
        The deadline, from now.

    Returns
    -------
    result
        What ``call`` returned.

    Examples
    --------
    >>> before_deadline(lambda headers: "answered", 5.0)
    'answered'
    """
    outcome: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        try:
            with time_limits(seconds) as headers:
                outcome["result"] = call(headers)
        except BaseException as error:  # handed to the waiting thread, which raises it
            outcome["error"] = error
        finally:
            done.set()

    # A copy of the caller's context: the call sees what the caller set (offline mode in a
    # context variable, say), and what it sets stays in its own thread.
    context = contextvars.copy_context()
    worker = threading.Thread(target=context.run, args=(run,), daemon=True)
    worker.name = "transformer_gmm-hub"
    worker.start()
    if not done.wait(min(seconds, threading.TIMEOUT_MAX)):
        raise DeadlinePassed(seconds)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]
