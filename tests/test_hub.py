"""Hub checkpoints against a real HTTP server on 127.0.0.1 that speaks the Hub's URL layout.

huggingface_hub is pointed at the server as a user would point it at a mirror, with
HF_ENDPOINT; the cache is a fresh HF_HOME under tmp_path. Nothing reaches the internet:
even without the server, the endpoint is a closed local port.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest
import torch
from conftest import make_tiny_checkpoint

from transformer_gmm import CheckpointError, TransformerGMM, storage
from transformer_gmm.nn import MixtureTransformer
from transformer_gmm.storage import checkpoints, hub, time_limits
from transformer_gmm.storage.checkpoints import load_model, resolve_checkpoint

# --- a Hub on 127.0.0.1 ------------------------------------------------------------------


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """Serves model repos the way huggingface.co does, for what snapshot_download calls.

    - ``GET /api/models/{repo}/revision/{rev}``: model info with ``sha`` and ``siblings``;
    - ``GET /api/models/{repo}/tree/{rev}``: the file list with git and LFS hashes;
    - ``HEAD``/``GET /{repo}/resolve/{rev}/{file}``: the file, with ``X-Repo-Commit``,
      ``ETag`` (git blob sha1), and for ``*.safetensors`` (kept in LFS on the Hub)
      ``X-Linked-Etag`` (sha256) and ``X-Linked-Size``.

    - ``POST /api/repos/create`` and ``/api/validate-yaml`` (of a model card): answered,
      with the repository's URL and no errors, but nothing is stored; any other ``POST``
      (what an upload sends next: ``preupload``) gets no answer, as from a Hub that stops
      answering midway.

    Errors carry the ``X-Error-Code`` huggingface_hub maps to its exceptions. Every request
    is recorded in ``requests`` as (method, path).
    """

    def __init__(self) -> None:
        self.repos: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.headers_seen: list[dict[str, str]] = []  # lower-case names
        self.served: dict[tuple[str, str], bytes] = {}  # (repo_id, file) -> bytes sent instead
        # (repo_id, file) -> bytes of the body sent before the server stops sending, with
        # the connection left open: a transfer that stalls midway.
        self.stalls: dict[tuple[str, str], int] = {}
        self.unstall = threading.Event()  # set by stop(): lets the stalled handlers end
        hub_ = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hub_.handle(self, "GET")

            def do_HEAD(self) -> None:
                hub_.handle(self, "HEAD")

            def do_POST(self) -> None:
                hub_.handle_post(self)

            def log_message(self, *args) -> None:  # keep the test output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll interval: shutdown() waits for one, and every test stops a server.
        serve = functools.partial(self.server.serve_forever, poll_interval=0.01)
        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.unstall.set()
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
            self.thread.join()

    # --- content ---------------------------------------------------------------------

    def publish(
        self,
        repo_id: str,
        files: dict[str, bytes] | Path,
        *,
        branch: str = "main",
        token: str | None = None,
    ) -> str:
        """Commit ``files`` (or a folder's files) to ``branch``; returns the commit hash."""
        if isinstance(files, Path):
            files = {p.name: p.read_bytes() for p in sorted(files.iterdir()) if p.is_file()}
        repo = self.repos.setdefault(repo_id, {"refs": {}, "commits": {}, "token": token})
        parent = repo["refs"].get(branch, "")
        digest = hashlib.sha1(parent.encode())
        for name, data in sorted(files.items()):
            digest.update(name.encode() + b"\0" + data)
        commit = digest.hexdigest()
        repo["commits"][commit] = dict(files)
        repo["refs"][branch] = commit
        return commit

    # --- serving ---------------------------------------------------------------------

    def handle(self, request: BaseHTTPRequestHandler, method: str) -> None:
        path = urlsplit(request.path).path
        self.requests.append((method, path))
        self.headers_seen.append({k.lower(): v for k, v in request.headers.items()})
        parts = [unquote(part) for part in path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] in ("revision", "tree"):
            repo_id, kind, revision = f"{parts[2]}/{parts[3]}", parts[4], parts[5]
            found = self.find(request, repo_id, revision)
            if found is not None:
                commit, files = found
                body = self.model_info(repo_id, commit, files) if kind == "revision" else None
                body = body if body is not None else self.tree(files)
                self.send(request, method, 200, json.dumps(body).encode(), {})
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id, revision, name = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
            found = self.find(request, repo_id, revision)
            if found is not None:
                self.resolve(request, method, repo_id, *found, name)
        else:
            self.send(request, method, 404, b"not found", {})

    def handle_post(self, request: BaseHTTPRequestHandler) -> None:
        path = urlsplit(request.path).path
        self.requests.append(("POST", path))
        self.headers_seen.append({k.lower(): v for k, v in request.headers.items()})
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        if path == "/api/repos/create":
            fields = json.loads(body)
            answer = {"url": f"{self.url}/{fields['organization'] or 'me'}/{fields['name']}"}
        elif path == "/api/validate-yaml":
            answer = {"errors": [], "warnings": []}
        else:  # no answer until the server stops
            self.unstall.wait()
            request.close_connection = True
            return
        self.send(request, "POST", 200, json.dumps(answer).encode(), {})

    def find(self, request, repo_id: str, revision: str) -> tuple[str, dict] | None:
        repo = self.repos.get(repo_id)
        authorized = repo is not None and (
            repo["token"] is None
            or request.headers.get("Authorization") == f"Bearer {repo['token']}"
        )
        if not authorized:  # the Hub answers the same for a missing and a private repo
            self.send(
                request, "GET", 401, b"Repository not found", {"X-Error-Code": "RepoNotFound"}
            )
            return None
        commit = repo["refs"].get(revision, revision)
        if commit not in repo["commits"]:
            self.send(request, "GET", 404, b"Invalid rev", {"X-Error-Code": "RevisionNotFound"})
            return None
        return commit, repo["commits"][commit]

    @staticmethod
    def model_info(repo_id: str, commit: str, files: dict[str, bytes]) -> dict:
        siblings = [{"rfilename": name} for name in sorted(files)]
        return {"id": repo_id, "modelId": repo_id, "sha": commit, "siblings": siblings}

    @staticmethod
    def tree(files: dict[str, bytes]) -> list[dict]:
        entries = []
        for name, data in sorted(files.items()):
            entry = {"type": "file", "path": name, "size": len(data), "oid": git_blob_sha1(data)}
            if name.endswith(".safetensors"):
                sha256 = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"oid": sha256, "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return entries

    def resolve(self, request, method, repo_id, commit, files, name) -> None:
        if name not in files:
            headers = {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}
            self.send(request, method, 404, b"Entry not found", headers)
            return
        data = files[name]
        headers = {"X-Repo-Commit": commit, "ETag": f'"{git_blob_sha1(data)}"'}
        if name.endswith(".safetensors"):
            headers["X-Linked-Etag"] = f'"{hashlib.sha256(data).hexdigest()}"'
            headers["X-Linked-Size"] = str(len(data))
        body = self.served.get((repo_id, name), data)
        self.send(request, method, 200, body, headers, self.stalls.get((repo_id, name)))

    def send(
        self,
        request,
        method: str,
        status: int,
        body: bytes,
        headers: dict[str, str],
        stall_after: int | None = None,
    ) -> None:
        request.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            request.send_header(key, value)
        request.end_headers()
        if method == "HEAD":
            return
        if stall_after is None:
            request.wfile.write(body)
            return
        # The whole length is announced, part of the body is sent, then nothing more: the
        # client sees an open connection that has gone quiet. Every request for the file,
        # a resumed one (Range) included, stalls the same way, as a hung server would.
        request.wfile.write(body[:stall_after])
        request.wfile.flush()
        self.unstall.wait()
        request.close_connection = True


# --- isolating huggingface_hub ------------------------------------------------------------


def set_hf_variable(monkeypatch, name: str, value: str | None, **constants_) -> None:
    """Set an HF_* variable as if before import: huggingface_hub reads them into its
    ``constants`` module when imported, so the derived constants are patched too."""
    from huggingface_hub import constants

    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    for constant, constant_value in constants_.items():
        monkeypatch.setattr(constants, constant, constant_value)


def point_at(monkeypatch, endpoint: str) -> None:
    """HF_ENDPOINT=endpoint, with the two constants derived from it at import."""
    set_hf_variable(
        monkeypatch,
        "HF_ENDPOINT",
        endpoint,
        ENDPOINT=endpoint,
        HUGGINGFACE_CO_URL_TEMPLATE=endpoint + "/{repo_id}/resolve/{revision}/{filename}",
    )


def set_offline(monkeypatch, offline: bool) -> None:
    set_hf_variable(monkeypatch, "HF_HUB_OFFLINE", "1" if offline else None, HF_HUB_OFFLINE=offline)


def isolate_hf(tmp_path: Path, monkeypatch) -> Path:
    """A fresh HF_HOME under tmp_path, no token, online, telemetry off, and an endpoint on
    a closed local port so that a test without the server still never reaches the internet.
    Returns the hub cache folder."""
    home = tmp_path / "hf-home"
    cache = home / "hub"
    set_hf_variable(monkeypatch, "HF_HOME", str(home), HF_HOME=str(home))
    set_hf_variable(monkeypatch, "HF_HUB_CACHE", str(cache), HF_HUB_CACHE=str(cache))
    set_hf_variable(monkeypatch, "HF_TOKEN", None, HF_TOKEN_PATH=str(home / "token"))
    set_hf_variable(monkeypatch, "HF_HUB_DISABLE_TELEMETRY", "1", HF_HUB_DISABLE_TELEMETRY=True)
    set_offline(monkeypatch, False)
    point_at(monkeypatch, "http://127.0.0.1:9")  # the discard port: connection refused
    # A Hub id is resolved once per process; each test is a fresh "process".
    monkeypatch.setattr(hub, "_RESOLVED", {})
    return cache


def serve(monkeypatch):
    """Start a FakeHub, point huggingface_hub at it, and stop it afterwards."""
    server = FakeHub()
    point_at(monkeypatch, server.url)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch) -> Path:
    return isolate_hf(tmp_path, monkeypatch)


@pytest.fixture
def fake_hub(monkeypatch):
    yield from serve(monkeypatch)


@pytest.fixture
def tiny_folder(tmp_path) -> Path:
    return make_tiny_checkpoint(tmp_path / "tiny")


@pytest.fixture
def published(fake_hub, tiny_folder) -> str:
    """org/name on the fake Hub, holding the tiny checkpoint; returns its commit hash."""
    return fake_hub.publish("org/name", tiny_folder)


def outputs(model: MixtureTransformer) -> torch.Tensor:
    torch.manual_seed(0)
    with torch.no_grad():
        return model(torch.randn(1, 20, model.config.d_max), 3).means


# --- first download, cache, offline --------------------------------------------------------


def test_first_download_lands_in_the_hf_cache_and_loads(published, fake_hub, hf_cache, tiny_folder):
    model = load_model("org/name")
    assert torch.equal(outputs(model), outputs(checkpoints.load_checkpoint(tiny_folder)))
    folder = resolve_checkpoint("org/name")
    assert folder == hf_cache / "models--org--name" / "snapshots" / published
    assert (hf_cache / "models--org--name" / "refs" / "main").read_text() == published
    gets = {path for method, path in fake_hub.requests if method == "GET"}
    assert "/api/models/org/name/revision/main" in gets
    assert f"/org/name/resolve/{published}/model.safetensors" in gets


def test_a_branch_is_looked_up_once_per_process(published, fake_hub, three_blobs):
    first = load_model("org/name")
    fake_hub.requests.clear()
    assert load_model("org/name") is first
    TransformerGMM(3, checkpoint="org/name", random_state=0).fit(three_blobs)
    assert fake_hub.requests == []


def test_pinned_cached_revision_makes_no_request(published, fake_hub, monkeypatch):
    first = load_model(f"org/name@{published}")
    monkeypatch.setattr(hub, "_RESOLVED", {})  # a new process, the same disk cache
    fake_hub.requests.clear()
    assert load_model(f"org/name@{published}") is first  # in-memory cache: same object
    assert load_model("org/name@" + published) is load_model(f"org/name@{published}")
    assert fake_hub.requests == []  # not one request: the commit is immutable and cached
    fake_hub.stop()
    monkeypatch.setattr(hub, "_RESOLVED", {})
    assert resolve_checkpoint(f"org/name@{published}").name == published


def test_branch_loads_from_cache_with_the_server_stopped(published, fake_hub, monkeypatch):
    expected = outputs(load_model("org/name"))
    fake_hub.stop()
    monkeypatch.setattr(hub, "_RESOLVED", {})
    monkeypatch.setattr(checkpoints, "_CACHE", OrderedDict())
    assert torch.equal(outputs(load_model("org/name")), expected)


def test_two_names_for_one_revision_share_one_model(published):
    assert load_model("org/name") is load_model(f"org/name@{published}")


@pytest.mark.parametrize("how", ["at import", "after import"])
def test_offline_with_cache_loads_without_requests(published, fake_hub, monkeypatch, how):
    load_model("org/name")
    monkeypatch.setattr(hub, "_RESOLVED", {})
    fake_hub.requests.clear()
    if how == "at import":
        set_offline(monkeypatch, True)
    else:  # e.g. os.environ["HF_HUB_OFFLINE"] = "1" in a notebook, after the imports
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_checkpoint("org/name").name == resolve_checkpoint(f"org/name@{published}").name
    assert fake_hub.requests == []


@pytest.mark.parametrize("how", ["at import", "after import"])
def test_offline_without_cache_says_how_to_download(published, fake_hub, monkeypatch, how):
    if how == "at import":
        set_offline(monkeypatch, True)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError) as info:
        TransformerGMM(3, checkpoint="org/name").fit(np.random.default_rng(0).normal(size=(30, 2)))
    message = str(info.value)
    assert "HF_HUB_OFFLINE is set" in message
    assert "`transformer-gmm download org/name`" in message
    assert "--to <folder>" in message and "models--org--name" in message
    assert fake_hub.requests == []


def test_incomplete_cache_offline_is_a_clear_error(published, monkeypatch):
    hub.download("org/name", files=("config.json", "README.md"))  # as `info` does
    set_offline(monkeypatch, True)
    with pytest.raises(CheckpointError, match="transformer-gmm download org/name"):
        resolve_checkpoint("org/name")


# --- a Hub that never answers --------------------------------------------------------------


@contextlib.contextmanager
def silent_endpoint(monkeypatch):
    """Point huggingface_hub at an endpoint that accepts connections (the kernel's backlog
    does) and never answers."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        point_at(monkeypatch, f"http://127.0.0.1:{listener.getsockname()[1]}")
        yield
    finally:
        listener.close()  # resets the connections still waiting, so a stuck request ends


def call_in_thread(
    call: Callable[[], object], limit: float = 60.0
) -> tuple[Exception | None, float]:
    """Call in a thread and wait at most ``limit`` seconds, so that a call that hangs fails
    the test instead of hanging the run. Returns what it raised and how long it took."""
    outcome = {}

    def run() -> None:
        start = time.monotonic()
        try:
            call()
        except Exception as error:
            outcome["error"] = error
        outcome["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=limit)
    assert not thread.is_alive(), f"still waiting for the Hub after {limit:g} s"
    return outcome.get("error"), outcome["seconds"]


def fit_in_thread(estimator, X, limit: float = 60.0) -> tuple[Exception | None, float]:
    return call_in_thread(lambda: estimator.fit(X), limit)


def test_a_hub_that_never_answers_fails_within_seconds(monkeypatch, three_blobs):
    # One wait of HF_HUB_ETAG_TIMEOUT, here 2 s (10 by default: under 30 s), not retried.
    set_hf_variable(monkeypatch, "HF_HUB_ETAG_TIMEOUT", "2", HF_HUB_ETAG_TIMEOUT=2)
    with silent_endpoint(monkeypatch):
        gmm = TransformerGMM(3, checkpoint="acme/tgmm-test")
        error, seconds = fit_in_thread(gmm, three_blobs)
    assert isinstance(error, CheckpointError), repr(error)
    assert seconds < 3 * 2
    message = str(error)
    assert "did not answer within 2 s" in message and "HF_HUB_ETAG_TIMEOUT" in message
    assert "`transformer-gmm download acme/tgmm-test`" in message


def test_a_hub_that_never_answers_serves_the_cached_copy(
    published, fake_hub, monkeypatch, three_blobs
):
    expected = outputs(load_model("org/name"))
    fake_hub.stop()
    monkeypatch.setattr(hub, "_RESOLVED", {})  # a new process, the same disk cache
    monkeypatch.setattr(checkpoints, "_CACHE", OrderedDict())
    set_hf_variable(monkeypatch, "HF_HUB_ETAG_TIMEOUT", "1", HF_HUB_ETAG_TIMEOUT=1)
    with silent_endpoint(monkeypatch):
        gmm = TransformerGMM(3, checkpoint="org/name", random_state=0)
        error, seconds = fit_in_thread(gmm, three_blobs)
    assert error is None and seconds < 30 and gmm.means_.shape == (3, 2)
    assert torch.equal(outputs(load_model("org/name")), expected)


def test_a_transfer_that_stalls_midway_fails_within_seconds(
    published, fake_hub, monkeypatch, hf_cache, tiny_folder
):
    set_hf_variable(monkeypatch, "HF_HUB_DOWNLOAD_TIMEOUT", "2", HF_HUB_DOWNLOAD_TIMEOUT=2)
    weights = (tiny_folder / "model.safetensors").read_bytes()
    fake_hub.stalls[("org/name", "model.safetensors")] = len(weights) // 2
    error, seconds = call_in_thread(lambda: load_model("org/name"))
    assert isinstance(error, CheckpointError), repr(error)
    # Two silent attempts of 2 s, 1 s apart: about 6 s. huggingface_hub alone tries six
    # times, 6 x 2 + 5 = 17 s (65 s with the default 10 s).
    assert seconds < 15
    message = str(error)
    assert f"GET {fake_hub.url}/org/name/resolve/{published}/model.safetensors" in message
    assert "went silent 2 times in a row, for 2 s each time: HF_HUB_DOWNLOAD_TIMEOUT" in message
    assert "Check the connection and try again" in message
    assert "`transformer-gmm download org/name`" in message
    assert all("x-transformer-gmm-scope" not in seen for seen in fake_hub.headers_seen)
    # Half the weights reached the disk, in a temporary file that is gone now.
    repo = hf_cache / "models--org--name"
    assert not list(repo.rglob("*.incomplete"))
    assert not (repo / "snapshots" / published / "model.safetensors").exists()
    fake_hub.stalls.clear()  # the Hub answers again: the next load downloads the weights
    model = load_model("org/name")
    assert torch.equal(outputs(model), outputs(checkpoints.load_checkpoint(tiny_folder)))


def test_time_limits_touch_only_the_requests_sent_under_them():
    from huggingface_hub.utils import get_session

    unbounded = {"connect": None, "read": None, "write": None, "pool": None}
    request = get_session().build_request("GET", "http://127.0.0.1:9/x", timeout=None)
    time_limits._before_request(request)
    assert request.extensions["timeout"] == unbounded
    with time_limits.time_limits() as headers:
        request = get_session().build_request(
            "GET", "http://127.0.0.1:9/x", headers=headers, timeout=None
        )
        time_limits._before_request(request)
        # Sent by this thread without the header (an upload to storage): bounded too.
        plain = get_session().build_request("PUT", "http://127.0.0.1:9/y", timeout=None)
        time_limits._before_request(plain)
    limit = time_limits.download_timeout()
    assert request.extensions["timeout"] == dict.fromkeys(unbounded, limit)
    assert plain.extensions["timeout"] == dict.fromkeys(unbounded, limit)
    assert not set(headers) & set(request.headers)  # the header is not for the server


@pytest.mark.parametrize("silent", ["from the start", "after create_repo"])
def test_push_to_a_hub_that_stops_answering_fails_within_seconds(monkeypatch, tiny_folder, silent):
    set_hf_variable(monkeypatch, "HF_HUB_DOWNLOAD_TIMEOUT", "1", HF_HUB_DOWNLOAD_TIMEOUT=1)
    push = functools.partial(storage.push_to_hub, tiny_folder, "me/model", token="hf_w")
    with contextlib.ExitStack() as stack:
        if silent == "from the start":
            stack.enter_context(silent_endpoint(monkeypatch))
        else:
            fake_hub = stack.enter_context(contextlib.contextmanager(serve)(monkeypatch))
        # huggingface_hub sends these requests with no timeout: this waited forever.
        error, seconds = call_in_thread(push)
    assert isinstance(error, CheckpointError), repr(error)
    assert seconds < 10
    message = str(error)
    assert message.startswith("Pushing to 'me/model' failed: the Hub at http://127.0.0.1:")
    if silent == "from the start":
        assert "did not answer within 1 s (HF_HUB_DOWNLOAD_TIMEOUT)" in message
    else:
        assert fake_hub.requests[0] == ("POST", "/api/repos/create")
        preupload = f"POST {fake_hub.url}/api/models/me/model/preupload/main"
        assert f"{preupload} went silent 2 times in a row, for 1 s each time" in message
    assert "push again" in message


# --- revisions, missing repos, tokens --------------------------------------------------------


def test_revision_pin_selects_the_old_weights(fake_hub, tmp_path):
    old = fake_hub.publish("org/name", make_tiny_checkpoint(tmp_path / "v1", seed=1))
    fake_hub.publish("org/name", make_tiny_checkpoint(tmp_path / "v2", seed=2))
    fake_hub.publish("org/name", make_tiny_checkpoint(tmp_path / "v1", seed=1), branch="v1")
    v1 = outputs(checkpoints.load_checkpoint(tmp_path / "v1"))
    assert torch.equal(outputs(load_model(f"org/name@{old}")), v1)
    assert torch.equal(outputs(load_model("org/name@v1")), v1)
    assert not torch.equal(outputs(load_model("org/name")), v1)


def test_unknown_revision(published):
    with pytest.raises(CheckpointError, match="'org/name' has no revision 'nope'"):
        resolve_checkpoint("org/name@nope")


def test_missing_repo(fake_hub):
    with pytest.raises(CheckpointError) as info:
        resolve_checkpoint("org/missing")
    message = str(info.value)
    assert "'org/missing' was not found" in message and "hf auth login" in message


def test_private_repo_uses_the_token(fake_hub, tiny_folder, monkeypatch):
    fake_hub.publish("org/private", tiny_folder, token="hf_secret")
    with pytest.raises(CheckpointError, match="HF_TOKEN"):
        resolve_checkpoint("org/private")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert load_model("org/private").config.k_max == 4
    assert fake_hub.headers_seen[-1]["authorization"] == "Bearer hf_secret"


def test_a_repo_that_is_not_a_checkpoint(fake_hub):
    fake_hub.publish("org/other", {"README.md": b"# some other model\n", "weights.bin": b"x"})
    with pytest.raises(CheckpointError, match="has no config.json or model.safetensors"):
        resolve_checkpoint("org/other")


# --- integrity -------------------------------------------------------------------------------


def test_corrupted_download_is_caught_by_its_hash(published, fake_hub, tiny_folder):
    good = (tiny_folder / "model.safetensors").read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # one flipped byte in the tensor data: safetensors can't tell
    fake_hub.served[("org/name", "model.safetensors")] = bytes(bad)
    with pytest.raises(CheckpointError) as info:
        load_model("org/name")
    message = str(info.value)
    assert "model.safetensors is corrupted" in message
    assert "transformer-gmm download org/name --force" in message
    del fake_hub.served[("org/name", "model.safetensors")]
    hub.download("org/name", force_download=True)  # what the message says to do
    assert load_model("org/name").config.k_max == 4


def test_truncated_transfer_names_the_file(published, fake_hub, tiny_folder):
    good = (tiny_folder / "model.safetensors").read_bytes()
    fake_hub.served[("org/name", "model.safetensors")] = good[: len(good) // 2]
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model("org/name")


def test_published_garbage_weights_name_the_file(fake_hub, tiny_folder):
    (tiny_folder / "model.safetensors").write_bytes(b"\x00" * 100)
    fake_hub.publish("org/broken", tiny_folder)
    with pytest.raises(CheckpointError) as info:
        load_model("org/broken")
    message = str(info.value)
    assert "model.safetensors is truncated or corrupted" in message
    assert "transformer-gmm download org/broken --force" in message


def test_config_with_an_unknown_field_names_it(fake_hub, tiny_folder):
    config = json.loads((tiny_folder / "config.json").read_text())
    (tiny_folder / "config.json").write_text(json.dumps({**config, "attention_window": 32}))
    fake_hub.publish("org/newer", tiny_folder)
    with pytest.raises(CheckpointError, match="attention_window"):
        load_model("org/newer")


def test_local_dir_download_is_verified(published, tmp_path):
    folder = hub.download("org/name", local_dir=tmp_path / "copy")
    assert checkpoints.load_checkpoint(folder).config.k_max == 4
    config = folder / "config.json"
    config.write_text(config.read_text().replace('"d_max": 4', '"d_max":  4'))
    with pytest.raises(CheckpointError, match=r"config.json is corrupted"):
        hub.verify_file(config)


# --- estimators and models ---------------------------------------------------------------------


def test_estimator_end_to_end(published, three_blobs):
    gmm = TransformerGMM(3, checkpoint="org/name", random_state=0).fit(three_blobs)
    assert gmm.init_method_ == "transformer"
    assert np.allclose(np.sort(gmm.weights_), 1 / 3, atol=0.05)
    again = TransformerGMM.from_pretrained("org/name", n_components=3, random_state=0)
    assert again.get_params()["checkpoint"] == "org/name" and not hasattr(again, "means_")
    assert np.allclose(again.fit(three_blobs).means_, gmm.means_)


def test_from_pretrained_fails_early_for_a_bad_name(fake_hub):
    with pytest.raises(CheckpointError, match="org/missing"):
        TransformerGMM.from_pretrained("org/missing", n_components=3)


def test_estimator_save_pretrained_round_trip(published, tmp_path, three_blobs):
    folder = TransformerGMM(3, checkpoint="org/name").save_pretrained(tmp_path / "mine")
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    assert (folder / "README.md").read_text() == "Random weights, for tests only."
    assert torch.equal(outputs(load_model(folder)), outputs(load_model("org/name")))


def test_estimator_without_a_checkpoint_has_nothing_to_save(tmp_path):
    with pytest.raises(CheckpointError, match="no transformer checkpoint to save"):
        TransformerGMM(3, checkpoint=None).save_pretrained(tmp_path / "x")


def test_model_save_and_load_checkpoint(published, tmp_path):
    model = storage.load_checkpoint("org/name")
    assert model is not load_model("org/name")  # a private copy, free to train
    folder = storage.save_checkpoint(model, tmp_path / "saved", model_card="card")
    assert torch.equal(outputs(storage.load_checkpoint(folder)), outputs(model))


class RecordingHfApi:
    """Stands in for huggingface_hub.HfApi: uploading needs the real Hub's write API."""

    calls: list = []

    def __init__(self, token=None, **kwargs) -> None:
        self.token = token

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs, self.token))

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        files = sorted(p.name for p in Path(folder_path).iterdir())
        loaded = checkpoints.load_checkpoint(folder_path)  # what is uploaded loads back
        self.calls.append(("upload_folder", repo_id, files, loaded.config.k_max))
        return "https://hub.example/commit/1"


def test_push_to_hub_uploads_a_loadable_folder(monkeypatch, tiny_folder):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingHfApi)
    monkeypatch.setattr(RecordingHfApi, "calls", [])
    model = checkpoints.load_checkpoint(tiny_folder)
    assert storage.push_to_hub(model, "me/model", token="hf_w", private=True).endswith("/1")
    TransformerGMM(3, checkpoint=str(tiny_folder)).push_to_hub("me/gmm", token="hf_w")
    files = ["README.md", "config.json", "model.safetensors"]
    assert RecordingHfApi.calls == [
        ("create_repo", "me/model", {"private": True, "exist_ok": True}, "hf_w"),
        ("upload_folder", "me/model", files, 4),
        ("create_repo", "me/gmm", {"private": None, "exist_ok": True}, "hf_w"),
        ("upload_folder", "me/gmm", files, 4),
    ]


def test_push_to_hub_without_a_token(tiny_folder):
    with pytest.raises(CheckpointError, match="hf auth login"):
        storage.push_to_hub(checkpoints.load_checkpoint(tiny_folder), "me/model")
