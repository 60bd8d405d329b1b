"""The Hub deadline: no fit, load, ``info`` or ``download`` waits on the network longer
than ``TRANSFORMER_GMM_HUB_DEADLINE`` seconds in all, whatever the server does.

Per-request timeouts bound each silence, not a whole request: a server that sends one
byte every half second never lets one expire. These servers, on 127.0.0.1, do that with
the headers or the body of every answer, or never answer at all. The deadline is 1 s
here, so each test takes a few seconds.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterator

import pytest
from test_hub import FakeHub, call_in_thread, isolate_hf, point_at, set_hf_variable

from transformer_gmm import CheckpointError, TransformerGMM, storage
from transformer_gmm.cli import main
from transformer_gmm.storage import checkpoints, hub, time_limits
from transformer_gmm.storage.checkpoints import load_model

DEADLINE = 1.0
SLACK = 3.0  # the fit itself, thread start-up, and a loaded machine
TRICKLE_PERIOD = 0.5  # seconds between two bytes


class TrickleServer:
    """A server on 127.0.0.1 that answers every request in one of three hostile ways.

    - ``"stall"``: reads the request and sends nothing;
    - ``"headers"``: sends a status line, then header bytes one every half second, so the
      headers never end;
    - ``"body"``: sends complete headers announcing a large JSON body, then the body one
      byte every half second.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.stopped = threading.Event()
        self.connections: list[socket.socket] = []
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:  # the listener was closed
                return
            self.connections.append(connection)
            threading.Thread(target=self._answer, args=(connection,), daemon=True).start()

    def _answer(self, connection: socket.socket) -> None:
        with contextlib.suppress(OSError):
            connection.recv(65536)  # the request (its headers fit in one read)
            self.requests += 1
            if self.mode == "stall":
                self.stopped.wait()
                return
            if self.mode == "headers":
                head, tail = b"HTTP/1.1 200 OK\r\n", b"X-Padding: " + b"a" * 10**6
            else:
                head = (
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000000\r\n\r\n"
                )
                tail = b" " * 10**6  # JSON whitespace: the body never turns invalid
            connection.sendall(head)
            for byte in tail:
                if self.stopped.wait(TRICKLE_PERIOD):
                    return
                connection.sendall(bytes([byte]))

    def stop(self) -> None:
        self.stopped.set()
        self.listener.close()
        for connection in self.connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch):
    cache = isolate_hf(tmp_path, monkeypatch)
    monkeypatch.setenv("TRANSFORMER_GMM_HUB_DEADLINE", str(DEADLINE))
    return cache


@pytest.fixture
def cached(tmp_path, monkeypatch) -> Iterator[str]:
    """org/name downloaded into the cache from a well-behaved Hub, as in a new process
    afterwards; yields its commit hash."""
    from conftest import make_tiny_checkpoint

    good = FakeHub()
    try:
        point_at(monkeypatch, good.url)
        commit = good.publish("org/name", make_tiny_checkpoint(tmp_path / "tiny"))
        load_model("org/name")
    finally:
        good.stop()
    monkeypatch.setattr(hub, "_RESOLVED", {})
    monkeypatch.setattr(checkpoints, "_CACHE", OrderedDict())
    yield commit


@contextlib.contextmanager
def hostile_hub(monkeypatch, mode: str) -> Iterator[TrickleServer]:
    server = TrickleServer(mode)
    point_at(monkeypatch, server.url)
    try:
        yield server
    finally:
        server.stop()


def timed(call, limit: float = 60.0):
    """Run ``call``, recording its warnings; returns (error, seconds, warning messages)."""
    caught: list[str] = []

    def run() -> None:
        with warnings.catch_warnings(record=True) as recorded:
            warnings.simplefilter("always")
            try:
                call()
            finally:
                caught.extend(str(w.message) for w in recorded)

    error, seconds = call_in_thread(run, limit)
    return error, seconds, caught


MODES = ["stall", "headers", "body"]


@pytest.mark.parametrize("mode", MODES)
def test_fit_with_a_cached_copy_waits_at_most_the_deadline(cached, monkeypatch, three_blobs, mode):
    gmm = TransformerGMM(3, checkpoint="org/name", random_state=0)
    with hostile_hub(monkeypatch, mode) as server:
        error, seconds, caught = timed(lambda: gmm.fit(three_blobs))
    assert error is None, repr(error)
    assert server.requests >= 1  # the Hub was asked, and did not answer in time
    assert seconds < DEADLINE + SLACK
    assert gmm.means_.shape == (3, 2)
    assert any("cached copy" in message and "org/name" in message for message in caught)
    assert any("TRANSFORMER_GMM_HUB_DEADLINE" in message for message in caught)


@pytest.mark.parametrize("mode", MODES)
def test_load_without_a_cached_copy_fails_at_the_deadline(monkeypatch, mode):
    with hostile_hub(monkeypatch, mode):
        error, seconds, _ = timed(lambda: load_model("org/name"))
    assert isinstance(error, CheckpointError), repr(error)
    assert seconds < DEADLINE + SLACK
    message = str(error)
    assert "is not in the Hugging Face cache" in message
    assert f"did not finish within {DEADLINE:g} s (TRANSFORMER_GMM_HUB_DEADLINE)" in message
    assert "`transformer-gmm download org/name`" in message


@pytest.mark.parametrize("mode", ["headers", "body"])
def test_download_and_info_with_a_cached_copy(cached, monkeypatch, capsys, mode):
    with hostile_hub(monkeypatch, mode):
        error, seconds, caught = timed(lambda: storage.download("org/name"))
        assert error is None and seconds < DEADLINE + SLACK, (error, seconds)
        assert any("cached copy" in message for message in caught)
        monkeypatch.setattr(hub, "_RESOLVED", {})
        status = {}
        error, seconds, _ = timed(lambda: status.setdefault("info", main(["info", "org/name"])))
    assert error is None and seconds < DEADLINE + SLACK, (error, seconds)
    assert status["info"] == 0
    assert "Hugging Face Hub, org/name" in capsys.readouterr().out


def test_forced_download_does_not_settle_for_the_cache(cached, monkeypatch):
    with hostile_hub(monkeypatch, "body"):
        error, seconds, _ = timed(lambda: storage.download("org/name", force_download=True))
    assert isinstance(error, CheckpointError), repr(error)
    assert seconds < DEADLINE + SLACK
    assert "TRANSFORMER_GMM_HUB_DEADLINE" in str(error)


def test_cli_download_fails_at_the_deadline(monkeypatch, capsys):
    with hostile_hub(monkeypatch, "headers"):
        status = {}
        error, seconds, _ = timed(lambda: status.setdefault("rc", main(["download", "org/x"])))
    assert error is None and status["rc"] == 1 and seconds < DEADLINE + SLACK
    assert "TRANSFORMER_GMM_HUB_DEADLINE" in capsys.readouterr().err


def test_the_abandoned_request_stops_at_the_deadline(monkeypatch):
    # The body of an answer is read under the deadline too: the request left behind ends
    # at the next byte, instead of reading a trickle for as long as the server sends it.
    with hostile_hub(monkeypatch, "body") as server:
        before = threading.active_count()
        error, _, _ = timed(lambda: load_model("org/name"))
        assert isinstance(error, CheckpointError)
        end = time.monotonic() + 3 * TRICKLE_PERIOD + 2.0
        while (workers() or threading.active_count() > before) and time.monotonic() < end:
            time.sleep(0.05)
        assert not workers()
        assert threading.active_count() <= before  # the server's side ended with it
        assert not server.stopped.is_set()


def workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "transformer_gmm-hub" and t.is_alive()]


def test_the_deadline_setting(monkeypatch):
    monkeypatch.delenv("TRANSFORMER_GMM_HUB_DEADLINE")
    set_hf_variable(monkeypatch, "HF_HUB_DOWNLOAD_TIMEOUT", "10", HF_HUB_DOWNLOAD_TIMEOUT=10)
    assert time_limits.deadline() == 23.0  # 2 x HF_HUB_DOWNLOAD_TIMEOUT + 3 s
    monkeypatch.setenv("TRANSFORMER_GMM_HUB_DEADLINE", "0.5")
    assert time_limits.deadline() == 0.5
    for bad in ("soon", "0", "-1", "nan", "inf"):
        monkeypatch.setenv("TRANSFORMER_GMM_HUB_DEADLINE", bad)
        with pytest.raises(CheckpointError, match="TRANSFORMER_GMM_HUB_DEADLINE"):
            time_limits.deadline()
