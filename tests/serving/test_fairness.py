"""Fairness, isolation, readiness and drain of `recops-tf serve` (issue 54, items 2 and 5):
case 9 (a client of large requests slowed the small ones 60x: its 3 MB :predict joined their
batches and was parsed on the event loop), the side note on readiness (/healthz said ready
before the model's first calls were made), the header and body read timeouts, and case 14 (an
upload in progress at SIGTERM got its connection closed without an answer).

Every assertion is structural (a request held on purpose, a call counted), never a timing ratio:
these tests share a loaded machine."""
import concurrent.futures
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from test_server import _ENV, _apis, _export, _Server

from recops_tf.serving import models
from recops_tf.serving import server as server_module
from recops_tf.serving.batching import Batcher

PREDICT = "/v1/models/default:predict"
SMALL = {"instances": [{"items": [1, 2, 3], "timestamps": [1, 2, 3]}]}


def _large_body(n=6000):
    """One row of `n` events: over LARGE_ELEMENTS values and INLINE_BYTES of JSON."""
    rng = np.random.default_rng(0)
    return {"instances": [{"items": rng.integers(1, 31, n).tolist(),
                           "timestamps": list(range(1, n + 1))}]}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("models")
    _export(path / "1")
    return path


@pytest.fixture
def server(base):
    running = _Server(base, read_timeout=0.5)
    yield running
    running.close()


# -- case 9: a large request waits on its own lane, never in a batch ------------------------
def test_small_requests_are_answered_while_a_large_one_is_held_on_its_lane(server,
                                                                           monkeypatch):
    """The large requests' lane is held (its one thread blocked on an event): a large REST
    :predict and a large gRPC Predict wait there, while small requests of both APIs are
    answered from batches; no request of over LARGE_ELEMENTS values ever enters the batcher."""
    enqueued = []
    original = Batcher.enqueue

    def spy(self, version, signature, tensors, on_done=None):
        enqueued.append(sum(v.size for v in tensors.values()))
        return original(self, version, signature, tensors, on_done)

    monkeypatch.setattr(Batcher, "enqueue", spy)
    lane = server.running.lane
    release, holding = threading.Event(), threading.Event()
    lane.submit(lambda: (holding.set(), release.wait(60)))
    assert holding.wait(30)
    big = _large_body()
    proto = _apis.PredictRequest()
    proto.model_spec.name = "default"
    for key, value in big["instances"][0].items():
        proto.inputs[key].CopyFrom(tf.make_tensor_proto(np.array([value], np.int64)))
    assert proto.ByteSize() > server_module.INLINE_BYTES
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        large_rest = pool.submit(server.http, PREDICT, big)
        large_grpc = pool.submit(server.stubs.Predict, proto, timeout=60)
        small = [pool.submit(server.http, PREDICT, SMALL) for _ in range(8)]
        grpc_small = _apis.PredictRequest()
        grpc_small.model_spec.name = "default"
        for key in ("items", "timestamps"):
            grpc_small.inputs[key].CopyFrom(tf.make_tensor_proto(np.array([[1, 2]], np.int64)))
        small_grpc = [pool.submit(server.stubs.Predict, grpc_small, timeout=60)
                      for _ in range(4)]
        for f in small:
            assert f.result(timeout=60)[0] == 200
        for f in small_grpc:
            f.result(timeout=60)
        assert not large_rest.done() and not large_grpc.done()  # still held on the lane
        release.set()
        status, body = large_rest.result(timeout=60)
        assert status == 200, body
        assert len(body["predictions"]) == 1
        large_grpc.result(timeout=60)
    assert enqueued and max(enqueued) <= server_module.LARGE_ELEMENTS, enqueued


def test_a_large_request_is_never_batched_with_small_ones(server):
    signature = server.running.server.versions.get().signature(None)
    small = {"items": np.ones([1, 10], np.int64), "timestamps": np.ones([1, 10], np.int64)}
    big = {"items": np.ones([1, 5000], np.int64), "timestamps": np.ones([1, 5000], np.int64)}
    assert server.running.server.batchable(signature, small)
    assert not server.running.server.batchable(signature, big)


# -- readiness: after a warm-up call of everything requests call ------------------------------
def test_every_signature_and_function_is_called_before_the_server_is_ready(base,
                                                                            monkeypatch):
    called = []
    original = models.Call.__call__

    def spy(self, *args, **kwargs):
        called.append(self.fn)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(models.Call, "__call__", spy)
    running = _Server(base)
    try:
        version = running.running.server.versions.get()
        before = set(map(id, called))  # no request sent yet
        wanted = {id(s.fn.fn) for s in version.signatures.values()} | {
            id(c.fn) for c in version.functions.values()}
        assert len(wanted) == 7 and wanted <= before, (len(wanted), len(wanted & before))
        assert running.http("/healthz") == (200, {"status": "ready"})
    finally:
        running.close()


def test_a_new_version_is_available_only_after_its_warm_up(tmp_path, base, monkeypatch):
    shutil.copytree(base / "1", tmp_path / "1")
    release, warming = threading.Event(), threading.Event()
    original = models.Version.warm_up

    def held(self):
        if self.number == 2:
            warming.set()
            assert release.wait(60)
        return original(self)

    monkeypatch.setattr(models.Version, "warm_up", held)
    running = _Server(tmp_path)
    try:
        shutil.copytree(base / "1", tmp_path / "2")
        assert warming.wait(60)
        status, body = running.http("/v1/models/default/versions/2")
        assert status == 200 and body["model_version_status"][0]["state"] == "LOADING", body
        status, body = running.http("/v1/models/default/versions/1")
        assert body["model_version_status"][0]["state"] == "AVAILABLE"
        assert running.http("/healthz")[0] == 200  # version 1 serves meanwhile
        status, body = running.http(PREDICT, SMALL)
        assert status == 200
        release.set()
        deadline = time.monotonic() + 60
        while running.running.server.versions.get().number != 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status, body = running.http("/v1/models/default/versions/2")
        assert body["model_version_status"][0]["state"] == "AVAILABLE"
    finally:
        release.set()
        running.close()


# -- the header and body read timeouts -------------------------------------------------------
def _answer(sock, timeout=30):
    """Everything the server sends until it closes the connection."""
    sock.settimeout(timeout)
    chunks = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _response(sock, timeout=30):
    """One HTTP response (its Content-Length's body): ``(status, headers lowercased, body)``."""
    sock.settimeout(timeout)
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        assert chunk, raw
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, body
        body += chunk
    return int(head.split(b" ", 2)[1]), head.lower(), json.loads(body)


def _status_and_error(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


def test_headers_slower_than_the_read_timeout_get_a_408_and_the_connection_closed(server):
    with socket.create_connection(("127.0.0.1", server.running.rest_port)) as sock:
        sock.sendall(b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\n")
        status, body = _status_and_error(_answer(sock))
    assert status == 408 and "headers" in body["error"] and "--read-timeout" in body["error"]
    assert server.http(PREDICT, SMALL)[0] == 200  # and the server serves on


def test_a_body_slower_than_the_read_timeout_gets_a_408_and_the_connection_closed(server):
    payload = json.dumps(SMALL).encode()
    with socket.create_connection(("127.0.0.1", server.running.rest_port)) as sock:
        sock.sendall(b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(payload) + payload[:10])
        status, head, body = _response(sock)  # then aiohttp reads and drops what comes for
        # up to 10 s (its lingering close: the client reads its answer before the close)
    assert status == 408 and "body" in body["error"] and b"connection: close" in head, body
    assert set(body) == {"error"} and "\n" not in body["error"]
    assert server.http(PREDICT, SMALL)[0] == 200
    metrics = server.http("/monitoring/prometheus/metrics")[1]
    assert 'recops_serving_requests_total{api="rest_predict",status="408"} 1.0' in metrics


# -- case 14: requests being read at SIGTERM are answered -------------------------------------
def test_requests_being_read_at_sigterm_are_read_to_their_end_and_answered(base):
    proc = subprocess.Popen([sys.executable, "-m", "recops_tf", "serve", "--model", str(base),
                             "--rest-port", "0", "--grpc-port", "-1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_ENV)
    try:
        line = proc.stdout.readline()
        assert "REST on" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(line.split("REST on 127.0.0.1:")[1].split(",")[0])
        payload = json.dumps(SMALL).encode()
        head = (b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload))
        upload = socket.create_connection(("127.0.0.1", port))  # headers and half its body
        upload.sendall(head + payload[:len(payload) // 2])
        headers = socket.create_connection(("127.0.0.1", port))  # half its headers
        headers.sendall(head[:30])
        idle = socket.create_connection(("127.0.0.1", port))  # nothing sent
        time.sleep(0.5)  # the server has read what was sent
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while True:  # draining once it refuses new connections
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
            except ConnectionRefusedError:
                break
            assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
            time.sleep(0.05)
        upload.sendall(payload[len(payload) // 2:])
        headers.sendall(head[30:] + payload)
        for sock in (upload, headers):
            raw = _answer(sock)
            assert raw.startswith(b"HTTP/1.1 200"), raw[:300]
            assert b"connection: close" in raw.lower()
            assert json.loads(raw.partition(b"\r\n\r\n")[2])["predictions"]
            sock.close()
        assert _answer(idle) == b""  # closed at once, with nothing to answer
        idle.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_cli_read_timeout_must_be_positive(value, capsys):
    from recops_tf import cli

    assert cli.main(["serve", "--model", ".", "--read-timeout", value]) == 2
    err = capsys.readouterr().err
    assert f"--read-timeout {value}" in err and len(err.strip().splitlines()) == 1, err
