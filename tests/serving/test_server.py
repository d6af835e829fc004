"""`recops-tf serve` with real clients: TF Serving's REST and gRPC APIs against the in-process
SavedModel call, bad requests (a 4xx each, and the server keeps serving), dynamic batching,
the users' key/value cache against a full recompute (float32 and bfloat16 models, after
eviction, across a version change under load), metrics, health, SIGTERM."""
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import keras
import numpy as np
import pytest
import tensorflow as tf

from recops_tf import recommender as rec
from recops_tf.recommender.exporting import export
from recops_tf.serving import Options, Running, _apis

NUM_ITEMS, WINDOW = 30, 24
_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def _export(path, seed=0, policy="float32"):
    """A small HSTU recommender with random weights everywhere (the relative bias and the
    seen-item bias too, so the cache path is exercised by them), exported as `path`."""
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        model = rec.GenerativeRecommender(NUM_ITEMS, d_model=16, num_blocks=2, num_heads=2,
                                          head_dim=8, max_seq_len=WINDOW, seen_bias=True,
                                          seed=seed)
        one = tf.RaggedTensor.from_row_lengths(tf.constant([1], tf.int64), [1])
        model({"items": one, "timestamps": one})
        rng = np.random.default_rng(seed)
        for w in model.weights:
            if "bias" in w.path and w.dtype == "float32":
                w.assign(rng.normal(0, 0.3, w.shape).astype("float32"))
        names = [f"i{i}" for i in range(1, NUM_ITEMS + 1)]
        export(model, rec.Dataset([], [], NUM_ITEMS, "test", item_names=names), str(path))
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
    return model


class _Server:
    def __init__(self, base, **options):
        self.running = Running(Options(model=str(base), rest_port=0, grpc_port=0,
                                       poll_seconds=0.2, **options), announce=lambda *a, **k: 0)
        self.thread = threading.Thread(target=self.running.loop.run_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.running.rest_port}"
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.running.grpc_port}")
        self.stubs = _apis.stubs(self.channel)

    def http(self, path, body=None, method=None):
        data = None if body is None else (body if isinstance(body, bytes) else
                                          json.dumps(body).encode())
        request = urllib.request.Request(self.url + path, data=data, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as f:
                raw = f.read()
                return f.status, (json.loads(raw) if f.headers.get_content_type() ==
                                  "application/json" else raw.decode())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def close(self):
        self.channel.close()
        self.running.loop.call_soon_threadsafe(self.running.loop.stop)
        self.thread.join()
        self.running.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    _export(base / "1")
    server = _Server(base)
    yield server, tf.saved_model.load(str(base / "1" / "saved_model"))
    server.close()


def _rows(rng, n, length):
    """`n` histories of 1..length items, 0-padded at the end, and their timestamps."""
    items = np.zeros([n, length], np.int64)
    for r in range(n):
        size = int(rng.integers(1, length + 1))
        items[r, :size] = rng.integers(1, NUM_ITEMS + 1, size)
    stamps = np.where(items > 0, np.cumsum(rng.integers(1, 5000, items.shape), 1), 0)
    return items, stamps


def test_rest_and_grpc_answer_as_the_savedmodel(served):
    server, module = served
    items, stamps = _rows(np.random.default_rng(0), 3, 12)
    want = module.signatures["serving_default"](items=tf.constant(items),
                                                timestamps=tf.constant(stamps))
    status, body = server.http("/v1/models/default:predict", {"instances": [
        {"items": i.tolist(), "timestamps": t.tolist()} for i, t in zip(items, stamps)]})
    assert status == 200
    assert [p["items"] for p in body["predictions"]] == want["items"].numpy().tolist()
    np.testing.assert_allclose([p["scores"] for p in body["predictions"]], want["scores"],
                               rtol=1e-6)
    status, body = server.http("/v1/models/default/versions/1:predict", {
        "signature_name": "serving_default",
        "inputs": {"items": items.tolist(), "timestamps": stamps.tolist()}})
    assert status == 200 and body["outputs"]["items"] == want["items"].numpy().tolist()
    request = _apis.PredictRequest()
    request.model_spec.name = "default"
    request.inputs["items"].CopyFrom(tf.make_tensor_proto(items))
    request.inputs["timestamps"].CopyFrom(tf.make_tensor_proto(stamps))
    answer = server.stubs.Predict(request, timeout=60)
    assert answer.model_spec.version.value == 1
    np.testing.assert_array_equal(tf.make_ndarray(answer.outputs["items"]), want["items"])
    np.testing.assert_allclose(tf.make_ndarray(answer.outputs["scores"]), want["scores"],
                               rtol=1e-6)
    # The one-user signature, columnar (it has a scalar input: never batched).
    one = module.recommend(tf.constant([3, 4, 5], tf.int64), tf.constant([1, 2, 3], tf.int64),
                           tf.constant(4))
    status, body = server.http("/v1/models/default:predict", {
        "signature_name": "recommend", "inputs": {"items": [3, 4, 5], "timestamps": [1, 2, 3],
                                                  "k": 4}})
    assert status == 200 and body["outputs"]["items"] == one["items"].numpy().tolist()


def test_status_metadata_health_and_metrics(served):
    server, _ = served
    status, body = server.http("/v1/models/default")
    assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"
    status, body = server.http("/v1/models/default/metadata")
    defs = body["metadata"]["signature_def"]["signature_def"]
    assert status == 200 and set(defs) == {"serving_default", "recommend"}
    assert defs["serving_default"]["inputs"]["items"]["dtype"] == "DT_INT64"
    request = _apis.GetModelStatusRequest()
    request.model_spec.name = "default"
    got = server.stubs.GetModelStatus(request, timeout=60).model_version_status
    assert [(s.version, s.state) for s in got] == [(1, _apis.ModelVersionStatus.AVAILABLE)]
    meta = _apis.GetModelMetadataRequest()
    meta.model_spec.name = "default"
    meta.metadata_field.append("signature_def")
    sigs = _apis.SignatureDefMap()
    server.stubs.GetModelMetadata(meta, timeout=60).metadata["signature_def"].Unpack(sigs)
    assert "serving_default" in sigs.signature_def
    assert server.http("/healthz") == (200, {"status": "ready"})
    status, text = server.http("/monitoring/prometheus/metrics")
    assert status == 200 and "recops_serving_requests_total" in text
    assert "recops_serving_request_latency_seconds_bucket" in text


BAD_REQUESTS = [
    ("/v1/models/default:predict", b"{not json", 400, "malformed JSON"),
    ("/v1/models/default:predict", {"instances": [{"items": [1, 99], "timestamps": [1, 2]}]},
     400, "past the catalogue"),
    ("/v1/models/default:predict", {"instances": [{"items": [0, 1], "timestamps": [1, 2]}]},
     400, "padding"),
    ("/v1/models/default:predict", {"instances": [{"items": [1, 2], "timestamps": [1]}]},
     400, "shape of items"),
    ("/v1/models/default:predict", {"instances": [{"items": [1, 2], "timestamps": [1, 2]},
                                                  {"items": [1], "timestamps": [1]}]},
     400, "rectangular"),
    ("/v1/models/default:predict", {"inputs": {"items": [[1, 2]], "timestamps": [[1]]}},
     400, "shape of items"),
    ("/v1/models/default:predict", {"inputs": {"items": [[1.5]], "timestamps": [[1]]}},
     400, "integers"),
    ("/v1/models/default:predict", {"inputs": {"items": [["a"]], "timestamps": [[1]]}},
     400, "numbers"),
    ("/v1/models/default:predict", {"inputs": {"items": [1, 2], "timestamps": [1, 2]}},
     400, "shape"),
    ("/v1/models/default:predict", {"inputs": {"items": [[1]]}}, 400, "missing"),
    ("/v1/models/default:predict", {"inputs": {"items": [[1]], "timestamps": [[1]],
                                               "extra": [1]}}, 400, "unknown input"),
    ("/v1/models/default:predict", {"signature_name": "nope", "instances": [1]}, 400,
     "not found"),
    ("/v1/models/default:predict", {"instances": []}, 400, "non-empty"),
    ("/v1/models/default:predict", [1, 2], 400, "JSON object"),
    ("/v1/models/default:predict", {"instances": [1], "inputs": [1]}, 400, "exactly one"),
    ("/v1/models/nope:predict", {"instances": [1]}, 404, "not found"),
    ("/v1/models/default/versions/9:predict", {"instances": [1]}, 404, "version 9"),
    ("/v1/models/default/versions/9", None, 404, "version 9"),
    ("/v2/whatever", None, 404, "Not Found"),
    ("/v1/models/default:recommend", {"items": ["i1"]}, 400, "user_id"),
    ("/v1/models/default:recommend", {"user_id": "x", "items": ["zzz"]}, 400, "catalogue"),
    ("/v1/models/default:recommend", {"user_id": "x", "items": ["i1"], "k": 0}, 400, "'k'"),
    ("/v1/models/default:recommend", {"user_id": "x", "items": ["i1"], "timestamps": [1, 2]},
     400, "timestamps"),
    ("/v1/models/default:recommend", {"user_id": "fresh"}, 400, "no history"),
    ("/v1/models/default:recommend", {"user_id": "x", "items": ["i1", "i2"],
                                      "timestamps": [5, 1]}, 400, "must not decrease"),
    ("/v1/models/default:recommend", {"user_id": "x", "items": ["i1"], "candidates": []},
     400, "empty"),
    ("/v1/models/default:recommend", {"user_id": "x", "items": ["i1"], "bogus": 1}, 400,
     "unknown fields"),
]


@pytest.mark.parametrize("path,body,code,words", BAD_REQUESTS,
                         ids=[f"{i}-{r[3]}" for i, r in enumerate(BAD_REQUESTS)])
def test_a_bad_request_gets_its_4xx_and_the_server_keeps_serving(served, path, body, code,
                                                                 words):
    server, _ = served
    status, answer = server.http(path, body)
    assert status == code and set(answer) == {"error"}, answer
    assert words in answer["error"] and "Traceback" not in answer["error"], answer
    status, _ = server.http("/v1/models/default:predict", {"instances": [
        {"items": [1, 2], "timestamps": [1, 2]}]})
    assert status == 200


def test_grpc_errors_and_size_limits(served):
    server, _ = served
    request = _apis.PredictRequest()
    request.model_spec.name = "default"
    request.inputs["items"].CopyFrom(tf.make_tensor_proto(np.array([[1, 99]], np.int64)))
    request.inputs["timestamps"].CopyFrom(tf.make_tensor_proto(np.array([[1, 2]], np.int64)))
    with pytest.raises(grpc.RpcError) as bad:
        server.stubs.Predict(request, timeout=60)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "past the catalogue" in bad.value.details()
    request.model_spec.name = "other"
    with pytest.raises(grpc.RpcError) as missing:
        server.stubs.Predict(request, timeout=60)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    big = np.ones([1, (5 << 20) // 8], np.int64)
    request.model_spec.name = "default"
    request.inputs["items"].CopyFrom(tf.make_tensor_proto(big))
    with pytest.raises(grpc.RpcError) as large:
        server.stubs.Predict(request, timeout=60)
    assert large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    status, answer = server.http("/v1/models/default:predict", b"[" + b"1," * (3 << 20) + b"1]")
    assert status == 413 and "larger than" in answer["error"]
    assert server.http("/healthz")[0] == 200


def test_concurrent_requests_are_batched_and_answered_as_alone(served):
    server, module = served
    rng = np.random.default_rng(1)
    requests = [_rows(rng, 1, int(rng.integers(2, 20))) for _ in range(24)]
    before = _batch_stats(server)

    def ask(pair):
        items, stamps = pair
        return server.http("/v1/models/default:predict", {"instances": [
            {"items": items[0].tolist(), "timestamps": stamps[0].tolist()}]})

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(ask, requests))
    for (items, stamps), (status, body) in zip(requests, answers):
        want = module.signatures["serving_default"](items=tf.constant(items),
                                                    timestamps=tf.constant(stamps))
        assert status == 200 and body["predictions"][0]["items"] == want["items"].numpy()[
            0].tolist()
        np.testing.assert_allclose(body["predictions"][0]["scores"], want["scores"][0],
                                   rtol=1e-5, atol=1e-5)
    count, total = (a - b for a, b in zip(_batch_stats(server), before))
    assert total == 24 and count < 24, (count, total)  # some calls held several requests


def test_a_request_on_the_only_connection_is_answered_without_the_batcher(served):
    """One keep-alive connection and nothing else in flight: the :predict runs on the event
    loop (no batch thread); with a second connection open it goes through the batcher."""
    import http.client
    server, module = served
    batcher = server.running.server.batcher
    enqueued = []
    original = batcher.enqueue

    def counting(*args, **kwargs):
        enqueued.append(1)
        return original(*args, **kwargs)

    items, stamps = _rows(np.random.default_rng(3), 1, 9)
    body = json.dumps({"instances": [{"items": items[0].tolist(),
                                      "timestamps": stamps[0].tolist()}]})
    want = module.signatures["serving_default"](items=tf.constant(items),
                                                timestamps=tf.constant(stamps))

    def ask(conn):
        conn.request("POST", "/v1/models/default:predict", body,
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())["predictions"][0]
        assert response.status == 200 and answer["items"] == want["items"][0].numpy().tolist()

    port = server.running.rest_port
    one = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    batcher.enqueue = counting
    try:
        for _ in range(3):
            ask(one)
        assert not enqueued
        other = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        other.connect()
        time.sleep(0.2)  # the server has accepted it
        ask(one)
        assert enqueued == [1]
        other.close()
    finally:
        batcher.enqueue = original
        one.close()


def test_concurrent_grpc_requests_are_batched_and_answered_as_alone(served):
    """gRPC Predicts await their batch on the event loop (grpc.aio), as REST's do; a
    malformed request among them gets its own error and fails no other."""
    server, module = served
    rng = np.random.default_rng(2)
    requests = [_rows(rng, 1, int(rng.integers(2, 20))) for _ in range(24)]
    before = _batch_stats(server)

    def ask(index):
        items, stamps = requests[index]
        request = _apis.PredictRequest()
        request.model_spec.name = "default"
        request.inputs["items"].CopyFrom(tf.make_tensor_proto(
            items if index != 5 else -items))  # 5: ids below 1
        request.inputs["timestamps"].CopyFrom(tf.make_tensor_proto(stamps))
        try:
            return server.stubs.Predict(request, timeout=60)
        except grpc.RpcError as e:
            return e

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(ask, range(len(requests))))
    for index, ((items, stamps), answer) in enumerate(zip(requests, answers)):
        if index == 5:
            assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT, answer
            continue
        want = module.signatures["serving_default"](items=tf.constant(items),
                                                    timestamps=tf.constant(stamps))
        np.testing.assert_array_equal(tf.make_ndarray(answer.outputs["items"]), want["items"])
        np.testing.assert_allclose(tf.make_ndarray(answer.outputs["scores"]), want["scores"],
                                   rtol=1e-5, atol=1e-5)
    count, total = (a - b for a, b in zip(_batch_stats(server), before))
    assert total >= 23 and count < total, (count, total)  # some calls held several requests


def test_the_servers_calls_equal_the_plain_calls(served):
    """`models.Call` (flat inputs; TF's single-threaded executor for a function without
    branches) answers as the plain call of each signature and function of an export; a
    branch (``extend``'s ``tf.cond``) keeps the default executor; a bad input still raises the
    export's own message."""
    from recops_tf.serving.models import SINGLE_THREADED, Call, op_error
    _, module = served
    rng = np.random.default_rng(11)
    items, stamps = _rows(rng, 3, 9)
    plain = module.signatures["serving_default"]
    fast = Call(plain)
    assert fast.flat and fast.executor == SINGLE_THREADED
    a = plain(items=tf.constant(items), timestamps=tf.constant(stamps))
    b = fast(items=tf.constant(items), timestamps=tf.constant(stamps))
    np.testing.assert_array_equal(a["items"], b["items"])
    np.testing.assert_array_equal(a["scores"], b["scores"])
    h = tf.constant(items[0][items[0] > 0])
    ts = tf.constant(stamps[0][items[0] > 0])
    fns = {n: getattr(module, n).get_concrete_function() for n in (
        "user_state", "top_k", "score_items", "extend", "extend_in_place")}
    calls = {n: Call(f) for n, f in fns.items()}
    assert {n: c.executor for n, c in calls.items()} == dict(
        user_state=SINGLE_THREADED, top_k=SINGLE_THREADED, score_items=SINGLE_THREADED,
        extend="", extend_in_place=SINGLE_THREADED)
    state = fns["user_state"](h, ts)["state"]
    np.testing.assert_array_equal(calls["user_state"](h, ts)["state"], state)
    args = (state, h, tf.constant(4), tf.constant(True))
    np.testing.assert_array_equal(calls["top_k"](*args)["items"], fns["top_k"](*args)["items"])
    args = (state, h, tf.constant([3, 1, 2], tf.int64))
    np.testing.assert_array_equal(calls["score_items"](*args)["scores"],
                                  fns["score_items"](*args)["scores"])
    n = len(h.numpy())
    rows = fns["extend"](h[:n - 1], ts[:n - 1], tf.zeros([0, 64], tf.float32),
                         tf.zeros([0], tf.int64))["rows"]
    args = (h[n - 1:], ts[n - 1:], rows, ts[:n - 1])
    want = fns["extend"](*args)
    for name in ("extend", "extend_in_place"):
        got = calls[name](*args)
        np.testing.assert_allclose(got["state"], want["state"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got["state"], state, rtol=1e-5, atol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        calls["extend_in_place"](tf.constant([0], tf.int64), ts[:1], rows, ts[:n - 1])
    assert op_error(e.value) == "items: item ids start at 1"


def _batch_stats(server):
    _, text = server.http("/monitoring/prometheus/metrics")
    get = lambda name: float(next(line.split()[-1] for line in text.splitlines()  # noqa: E731
                                  if line.startswith(name + " ")))
    return get("recops_serving_batch_size_count"), get("recops_serving_batch_size_sum")


def _full(module, items, stamps, k=5, exclude=False):
    state = module.user_state(tf.constant(items[-WINDOW:], tf.int64),
                              tf.constant(stamps[-WINDOW:], tf.int64))["state"]
    out = module.top_k(state, tf.constant(items[-WINDOW:], tf.int64), tf.constant(k),
                       tf.constant(exclude))
    return out["items"].numpy().tolist(), out["scores"].numpy()


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_user_cache_equals_a_full_recompute(tmp_path, policy):
    _export(tmp_path / "m" / "1", seed=3, policy=policy)
    module = tf.saved_model.load(str(tmp_path / "m" / "1" / "saved_model"))
    # A pool of 4 pages of 4 rows: two users of up to 8 events fit, a third evicts one.
    width = json.loads((tmp_path / "m" / "1" / "info.json").read_text())["cache_width"]
    itemsize = 2 if policy == "mixed_bfloat16" else 4
    server = _Server(tmp_path / "m", cache_bytes=4 * 4 * width * itemsize, cache_page_rows=4)
    tol = dict(rtol=2e-2, atol=2e-2) if policy == "mixed_bfloat16" else dict(rtol=1e-4,
                                                                             atol=1e-4)
    try:
        rng = np.random.default_rng(5)
        histories = {u: ([], []) for u in ("a", "b", "c")}
        clock = 1_000
        for step in range(10):
            for user in ("a", "b", "c") if step < 6 else ("a",):
                n = 3 if step == 0 else 1
                new = rng.integers(1, NUM_ITEMS + 1, n).tolist()
                stamps = (clock + np.arange(n) * 700).tolist()
                clock += 700 * n + int(rng.integers(1, 90_000))
                items, ts = histories[user]
                body = {"user_id": user, "items": [f"i{i}" for i in new], "timestamps": stamps,
                        "k": 5, "history": {"items": [f"i{i}" for i in items],
                                            "timestamps": ts}}
                status, got = server.http("/v1/models/default:recommend", body)
                assert status == 200, got
                items += new
                ts += stamps
                want_items, want_scores = _full(module, items, ts)
                assert got["history_length"] == min(len(items), WINDOW)
                np.testing.assert_allclose(got["scores"], want_scores, **tol)
                if policy == "float32":
                    assert [int(i[1:]) for i in got["items"]] == want_items
        _, text = server.http("/monitoring/prometheus/metrics")
        events = {e: float(next(line.split()[-1] for line in text.splitlines()
                                if line.startswith(f'recops_serving_user_cache_events_total'
                                                   f'{{event="{e}"}}')))
                  for e in ("hit", "miss", "eviction")}
        # Three users in a pool for two: evictions, and misses after them (recomputed from
        # the history the requests carried, with the same answers as above).
        assert events["eviction"] > 0 and events["miss"] > 3 and events["hit"] > 0, events
        # Past the window (24 events): the last 24 are re-encoded, still the full answer.
        items, ts = histories["a"]
        for _ in range(WINDOW):
            clock += 1000
            new = int(rng.integers(1, NUM_ITEMS + 1))
            status, got = server.http("/v1/models/default:recommend", {
                "user_id": "a", "items": [f"i{new}"], "timestamps": [clock], "k": 5,
                "exclude_seen": True})
            items.append(new)
            ts.append(clock)
            assert status == 200 and got["history_length"] == min(len(items), WINDOW)
        want_items, want_scores = _full(module, items, ts, exclude=True)
        np.testing.assert_allclose(got["scores"], want_scores, **tol)
        assert not set(int(i[1:]) for i in got["items"]) & set(items[-WINDOW:])
        # Candidates: their scores, best first.
        status, got = server.http("/v1/models/default:recommend", {
            "user_id": "a", "candidates": ["i1", "i2", "i3"], "k": 3})
        state = module.user_state(tf.constant(items[-WINDOW:], tf.int64),
                                  tf.constant(ts[-WINDOW:], tf.int64))["state"]
        want = module.score_items(state, tf.constant(items[-WINDOW:], tf.int64),
                                  tf.constant([1, 2, 3], tf.int64))["scores"].numpy()
        assert status == 200 and got["cache"] == "hit"
        np.testing.assert_allclose(sorted(got["scores"], reverse=True), got["scores"])
        np.testing.assert_allclose(sorted(want, reverse=True), got["scores"], **tol)
    finally:
        server.close()


def test_a_new_version_is_picked_up_under_load_without_a_lost_request(tmp_path):
    base = tmp_path / "m"
    _export(base / "1", seed=0)
    _export(tmp_path / "v2", seed=7)
    server = _Server(base)
    errors, versions, stop = [], set(), threading.Event()

    def load():
        while not stop.is_set():
            status, body = server.http("/v1/models/default:recommend", {
                "user_id": "u", "items": ["i1"], "k": 3, "history": {"items": ["i2"]}})
            if status != 200:
                errors.append(body)
            else:
                versions.add(body["model_version"])

    try:
        status, first = server.http("/v1/models/default:recommend",
                                    {"user_id": "v", "items": ["i1", "i2"]})
        assert status == 200 and first["cache"] == "miss"
        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        shutil.copytree(tmp_path / "v2", base / "2.tmp")
        os.rename(base / "2.tmp", base / "2")  # a version appears whole, as TF Serving wants
        deadline = time.monotonic() + 60
        while "2" not in versions and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join()
        assert not errors and versions == {"1", "2"}, (errors, versions)
        status, body = server.http("/v1/models/default")
        assert body["model_version_status"][0]["version"] == "2"
        # The old version's cache went with it: user v is unknown to version 2.
        status, again = server.http("/v1/models/default:recommend", {"user_id": "v",
                                                                     "items": ["i3"]})
        assert status == 200 and again["cache"] == "miss" and again["history_length"] == 1
        assert server.http("/v1/models/default/versions/1:predict", {"instances": [
            {"items": [1], "timestamps": [1]}]})[0] == 404
    finally:
        server.close()


def test_cli_serve_starts_answers_and_drains_on_sigterm(tmp_path):
    _export(tmp_path / "m" / "1")
    proc = subprocess.Popen([sys.executable, "-m", "recops_tf", "serve", "--model",
                             str(tmp_path / "m"), "--rest-port", "0", "--grpc-port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_ENV)
    try:
        line = proc.stdout.readline()
        assert "serving model 'default' version 1" in line, (line, proc.stderr.read()
                                                             if proc.poll() is not None else "")
        port = int(line.split("REST on 127.0.0.1:")[1].split(",")[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30) as f:
            assert f.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("argv,words", [
    (["--model", "/nonexistent"], "no such directory"),
    (["--model", ".", "--rest-port", "70000"], "a port is"),
    (["--model", "tests"], "no SavedModel"),
    (["--model", ".", "--cache-mb", "-1"], "--cache-mb -1"),
    (["--model", ".", "--poll-seconds", "0"], "--poll-seconds 0"),
    (["--model", ".", "--tensorflow-intra-op-parallelism", "-1"], "at least 0"),
])
def test_cli_serve_bad_inputs_exit_2(argv, words, capsys):
    from recops_tf import cli

    try:
        code = cli.main(["serve", *argv])
    except SystemExit as e:  # argparse's own check of a flag's value
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


# -- metrics: every request counted once, with the status it was answered with (issue 54,
# case 11 and case 6) ------------------------------------------------------------------------
def _request_counts(server):
    """``{(api, status): count}`` of ``recops_serving_requests_total`` (one scrape)."""
    status, text = server.http("/monitoring/prometheus/metrics")
    assert status == 200
    counts = {}
    for line in text.splitlines():
        if line.startswith("recops_serving_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            counts[found["api"], found["status"]] = float(value)
    return counts


def _counted(server, ask):
    """What `ask()` added to the request counts (besides the scrape that reads them)."""
    before = _request_counts(server)
    answer = ask()
    after = _request_counts(server)
    added = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
    assert added.pop(("rest_metrics", "200")) == 1  # the first scrape, counted once
    return {k: v for k, v in added.items() if v}, answer


ONE_ROW = {"instances": [{"items": [1, 2], "timestamps": [1, 2]}]}
COUNTED_REST = [  # (id, path, body, method, status, api)
    ("200-status", "/v1/models/default", None, None, 200, "rest_status"),
    ("200-predict", "/v1/models/default:predict", ONE_ROW, None, 200, "rest_predict"),
    ("200-health", "/healthz", None, None, 200, "rest_health"),
    ("400-malformed-json", "/v1/models/default:predict", b"{not json", None, 400,
     "rest_predict"),
    ("400-bad-input", "/v1/models/default:recommend", {"items": ["i1"]}, None, 400,
     "rest_recommend"),
    ("404-no-route", "/v2/whatever", None, None, 404, "rest_other"),
    ("404-unknown-version", "/v1/models/default/versions/9/metadata", None, None, 404,
     "rest_metadata"),
    ("405-wrong-method", "/v1/models/default:predict", None, "GET", 405, "rest_other"),
    ("405-wrong-method-post", "/v1/models/default", b"{}", "POST", 405, "rest_other"),
    ("413-too-large", "/v1/models/default:predict", b"[" + b"1," * (3 << 20) + b"1]", None,
     413, "rest_predict"),
]


@pytest.mark.parametrize("path,body,method,code,api", [c[1:] for c in COUNTED_REST],
                         ids=[c[0] for c in COUNTED_REST])
def test_a_rest_request_is_counted_once_with_its_status(served, path, body, method, code,
                                                        api):
    server, _ = served
    added, (status, answer) = _counted(server, lambda: server.http(path, body, method))
    assert status == code, answer
    assert added == {(api, str(code)): 1}, added


def test_an_internal_error_is_a_500_counted_as_such_and_logged(served, monkeypatch, caplog):
    """A 500 (an exception the server did not expect, here from the status call) is counted
    as 500 (it was counted as 200), answered without its internals, and logged with them."""
    server, _ = served

    def broken(*args):
        raise RuntimeError("boom: an internal detail")

    monkeypatch.setattr(server.running.server, "status", broken)
    added, (status, answer) = _counted(server, lambda: server.http("/v1/models/default"))
    assert status == 500 and added == {("rest_status", "500"): 1}, (status, answer, added)
    assert set(answer) == {"error"} and "boom" not in answer["error"], answer
    assert "server log" in answer["error"]
    request = _apis.GetModelStatusRequest()
    request.model_spec.name = "default"
    with pytest.raises(grpc.RpcError) as failed:
        _counted(server, lambda: server.stubs.GetModelStatus(request, timeout=60))
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert "boom" not in failed.value.details()
    logged = [r for r in caplog.records if r.name == "recops_tf.serving" and r.exc_info]
    assert len(logged) == 2 and all("boom" in str(r.exc_info[1]) for r in logged), logged


def _grpc_outcome(call):
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def test_a_grpc_request_is_counted_once_with_its_status_code(served):
    """gRPC requests are counted by the status code sent (OK, INVALID_ARGUMENT, ...);
    undecodable bytes are INVALID_ARGUMENT (grpc's own decoding answered UNKNOWN, uncounted)."""
    server, _ = served
    status = _apis.GetModelStatusRequest()
    status.model_spec.name = "default"
    bad = _apis.PredictRequest()
    bad.model_spec.name = "default"
    bad.inputs["items"].CopyFrom(tf.make_tensor_proto(np.array([[1, 99]], np.int64)))
    bad.inputs["timestamps"].CopyFrom(tf.make_tensor_proto(np.array([[1, 2]], np.int64)))
    good = _apis.PredictRequest()
    good.CopyFrom(bad)
    good.inputs["items"].CopyFrom(tf.make_tensor_proto(np.array([[1, 2]], np.int64)))
    other = _apis.PredictRequest()
    other.CopyFrom(good)
    other.model_spec.name = "other"
    raw = server.channel.unary_unary(_apis.PREDICT)  # bytes in, bytes out
    undecodable = "not a tensorflow.serving.PredictRequest"
    cases = [  # (call, api, status code, a fragment of its details)
        (lambda: server.stubs.GetModelStatus(status, timeout=60), "grpc_status", "OK", ""),
        (lambda: server.stubs.Predict(good, timeout=60), "grpc_predict", "OK", ""),
        (lambda: server.stubs.Predict(bad, timeout=60), "grpc_predict", "INVALID_ARGUMENT",
         "past the catalogue"),
        (lambda: raw(b"\x0a\x05ab", timeout=60), "grpc_predict", "INVALID_ARGUMENT",
         undecodable),
        (lambda: raw(b"\xff\xff\xff", timeout=60), "grpc_predict", "INVALID_ARGUMENT",
         undecodable),
        (lambda: server.stubs.Predict(other, timeout=60), "grpc_predict", "NOT_FOUND",
         "model 'other'"),
    ]
    for call, api, code, words in cases:
        added, (got, details) = _counted(server, lambda: _grpc_outcome(call))
        assert got.name == code and added == {(api, code): 1}, (api, code, got, details, added)
        assert words in details, details
