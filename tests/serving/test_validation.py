"""The one validation layer between the wire and the model (issue 54, item 1): every case of the
issue's table it covers is a request against a running server (REST and gRPC), answered with
its 4xx / gRPC code and a one-line JSON error, leaving nothing behind in the users' cache, and
the server serving on; plus the layer's functions (recops_tf/serving/validation.py) and the
cache's accounting on their own.

Case numbers are the issue's: 1 a version of 5,000 digits or non-ASCII digits in the path, 2
``Content-Encoding: gzip`` on a plain body, 3 a timestamp past int64, 4 a user stuck after an
event at 2**63-1, 5 ``[[true]]`` / ``[[2.0]]`` read as item ids, 7 rejected requests leaving
cache entries and ids not counted, 8 a TensorProto declaring 2**25 elements, 10 evictions
counted twice under concurrency; the side notes: aiohttp's parser errors in plain text,
duplicate candidates answered as given."""
import concurrent.futures
import gzip
import json
import logging
import socket
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from test_server import _apis, _export, _Server

from recops_tf.serving import cache as cache_module
from recops_tf.serving import validation
from recops_tf.serving.models import RequestError
from recops_tf.serving.validation import MAX_TIMESTAMP, Budget

PREDICT = "/v1/models/default:predict"
RECOMMEND = "/v1/models/default:recommend"
ONE_ROW = {"instances": [{"items": [1, 2], "timestamps": [1, 2]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server of a tiny export with a 1 MiB users' cache (the issue's --cache-mb 1)."""
    base = tmp_path_factory.mktemp("models")
    _export(base / "1")
    running = _Server(base, cache_bytes=1 << 20)
    yield running
    running.close()


@pytest.fixture
def no_internal_errors(caplog):
    """Fails the test if the server logged an internal error (a 500 / INTERNAL)."""
    caplog.set_level(logging.INFO, logger="recops_tf.serving")
    yield
    errors = [r.getMessage() for r in caplog.records
              if r.name == "recops_tf.serving" and r.levelno >= logging.ERROR]
    assert not errors, errors


def _refused(answer, code, *words):
    status, body = answer
    assert status == code and isinstance(body, dict) and set(body) == {"error"}, answer
    message = body["error"]
    assert "\n" not in message and "Traceback" not in message and "Error:" not in message
    for word in words:
        assert word in message, (word, message)
    return message


def _still_serving(server):
    status, body = server.http(PREDICT, ONE_ROW)
    assert status == 200, body


def _cache(server):
    return server.running.server.versions.get().cache


# -- case 1: the version in a path ---------------------------------------------------------
@pytest.mark.parametrize("text", ["9" * 5000, str(1 << 63), "0", "00", "%C2%B3", "%D9%A1",
                                  "%EF%BC%91", "1.0", "-1", "abc"],
                         ids=["5000-digits", "2**63", "0", "00", "superscript-3",
                              "arabic-indic-1", "fullwidth-1", "1.0", "-1", "abc"])
@pytest.mark.parametrize("suffix", ["", "/metadata", ":predict", ":recommend"])
def test_a_path_names_a_version_by_ascii_digits_within_int64(server, text, suffix,
                                                             no_internal_errors):
    """5,000 digits were a 500 (int()'s digit limit); "١" (Arabic-indic one), which the
    route's \\d took and int() reads as 1, was version 1: each is a 404 naming the version."""
    body = None if suffix in ("", "/metadata") else (
        ONE_ROW if suffix == ":predict" else {"user_id": "v", "items": ["i1"]})
    message = _refused(server.http(f"/v1/models/default/versions/{text}{suffix}", body), 404,
                       "version", "not served")
    assert len(message) < 300, message
    assert server.http("/v1/models/default/versions/1")[0] == 200
    assert server.http("/v1/models/default/versions/0001")[0] == 200  # ASCII digits: 1


# -- case 2 and the parser's errors --------------------------------------------------------
def _raw(server, data):
    """`data` sent as is; ``(status, content type, body)`` of the answer."""
    with socket.create_connection(("127.0.0.1", server.running.rest_port), timeout=60) as s:
        s.sendall(data)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")]
            if length and len(body) >= length[0]:
                break
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    kind = next((line.split(":", 1)[1].strip() for line in lines
                 if line.lower().startswith("content-type:")), "")
    return int(lines[0].split()[1]), kind, body


def _post(path, body, headers):
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in
                                                         headers.items())
            + "Connection: close\r\n\r\n").encode() + body


def test_a_body_that_is_not_what_its_content_encoding_says_is_a_400(server,
                                                                     no_internal_errors):
    """Case 2: gzip declared on a plain body was a 500 (the decoder's error)."""
    plain = json.dumps(ONE_ROW).encode()
    status, kind, body = _raw(server, _post(PREDICT, plain, {"Content-Encoding": "gzip"}))
    assert (status, kind) == (400, "application/json"), (status, kind, body)
    assert "Content-Encoding" in json.loads(body)["error"]
    status, kind, body = _raw(server, _post(PREDICT, gzip.compress(plain),
                                            {"Content-Encoding": "gzip"}))
    assert status == 200 and json.loads(body)["predictions"], body
    _still_serving(server)


@pytest.mark.parametrize("data,words", [
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: x\r\n\r\n", "header"),
    (b"GARBAGE\r\n\r\n", "method"),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n",
     "more than"),
], ids=["bad-header", "bad-method", "header-too-long"])
def test_the_http_parsers_errors_are_json_too(server, data, words):
    """The side note: what aiohttp refuses before the application sees it was answered in
    plain text; now ``{"error": "bad HTTP request: ..."}`` with the same status."""
    status, kind, body = _raw(server, data)
    assert 400 <= status < 500 and kind == "application/json", (status, kind, body)
    message = json.loads(body)["error"]
    assert message.startswith("bad HTTP request") and words in message.lower(), message
    assert "\n" not in message and "aaaa" not in message and "GARBAGE" not in message
    _still_serving(server)


def test_a_clients_malformed_request_is_no_error_in_the_log(server, caplog):
    """Found by the fuzz leg (test_serving_fuzz.py): aiohttp logged each request its parser
    refuses (a bad method, a bad chunk) and each body that does not decode as its
    Content-Encoding says, read and dropped after a 404 or 405, with its traceback at ERROR: a
    traceback on the server's stderr per bad request. Now one line at DEBUG; the answers are
    as before."""
    caplog.set_level(logging.INFO)
    junk = b"\x00junk" * 4
    for data, code in [
            (b"GARBAGE / HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            (b"POST /v1/models/default:predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
             b"chunked\r\n\r\n{}\r\n\r\n", 400),
            (b"POST /v1/models/nope:classify HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip"
             b"\r\nContent-Length: %d\r\n\r\n" % len(junk) + junk, 404),
            (b"PUT /v1/models/default HTTP/1.1\r\nHost: x\r\nContent-Encoding: deflate\r\n"
             b"Content-Length: %d\r\n\r\n" % len(junk) + junk, 405)]:
        status, kind, body = _raw(server, data)
        assert (status, kind) == (code, "application/json"), (status, kind, body, data)
        assert set(json.loads(body)) == {"error"}
    _still_serving(server)
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not logged, [(r.name, r.getMessage()) for r in logged]


# -- cases 3 and 4: timestamps -------------------------------------------------------------
@pytest.mark.parametrize("body,what", [
    ({"user_id": "t", "items": ["i1"], "timestamps": [1 << 63]}, "'timestamps'"),
    ({"user_id": "t", "items": ["i1", "i2"], "timestamps": [5, (1 << 64) - 1]},
     "'timestamps'"),
    ({"user_id": "t", "items": ["i1"], "timestamps": [-(1 << 63)]}, "'timestamps'"),
    ({"user_id": "t", "items": ["i1"], "timestamps": [(1 << 63) - 1]}, "'timestamps'"),
    ({"user_id": "t", "items": ["i1"], "history": {"items": ["i2"], "timestamps": [1 << 63]}},
     "'history.timestamps'"),
    ({"user_id": "t", "items": ["i1"], "timestamps": [True]}, "'timestamps'"),
], ids=["2**63", "2**64-1", "-2**63", "2**63-1", "history-2**63", "true"])
def test_timestamps_out_of_range_are_a_400(server, body, what, no_internal_errors):
    """Case 3: a timestamp >= 2**63 was a 500 (OverflowError)."""
    _refused(server.http(RECOMMEND, body), 400, what)
    assert "t" not in _cache(server).users
    _still_serving(server)


def test_a_user_at_the_last_timestamp_keeps_being_served(server, no_internal_errors):
    """Case 4: an event at 2**63-1 was accepted, and every later request of that user
    without timestamps was a 500 (the implied timestamps overflowed): the user was stuck. Now
    2**63-1 is refused, and a user at the last timestamp allowed is served on and on."""
    _refused(server.http(RECOMMEND, {"user_id": "edge", "items": ["i1"],
                                     "timestamps": [(1 << 63) - 1]}), 400, "out of range")
    status, body = server.http(RECOMMEND, {"user_id": "edge", "items": ["i1"],
                                           "timestamps": [MAX_TIMESTAMP]})
    assert status == 200, body
    for n in range(2, 6):
        status, body = server.http(RECOMMEND, {"user_id": "edge", "items": ["i2", "i3"]})
        assert status == 200 and body["cache"] == "hit", body
        assert body["history_length"] == 1 + 2 * (n - 1)
    status, body = server.http(RECOMMEND, {"user_id": "edge", "items": []})
    assert status == 200, body
    entry = _cache(server).users["edge"]
    assert entry.timestamps[0] == MAX_TIMESTAMP
    assert list(np.diff(entry.timestamps)) == [1] * (len(entry.timestamps) - 1)
    # A new user whose history ends at the last timestamp, then events without timestamps.
    status, body = server.http(RECOMMEND, {"user_id": "edge2", "items": ["i1"],
                                           "timestamps": [MAX_TIMESTAMP], "history": {
        "items": ["i2", "i3"], "timestamps": [MAX_TIMESTAMP - 1, MAX_TIMESTAMP]}})
    assert status == 200 and body["history_length"] == 3, body
    status, body = server.http(RECOMMEND, {"user_id": "edge2", "items": ["i4"]})
    assert status == 200 and body["history_length"] == 4, body
    # ... and the first timestamp allowed, history without timestamps before it.
    status, body = server.http(RECOMMEND, {"user_id": "edge3", "items": ["i1"],
                                           "timestamps": [-MAX_TIMESTAMP],
                                           "history": {"items": ["i2", "i3"]}})
    assert status == 200 and body["history_length"] == 3, body


# -- case 5: exact dtypes ------------------------------------------------------------------
def _deep(depth):
    """One value in `depth` nested lists."""
    value = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("items,timestamps,words", [
    ([[True]], [[1]], "got true/false"),
    ([[2.0]], [[1]], "not a 64-bit integer"),
    ([[1, True]], [[1, 2]], "true/false"),
    ([[1, 2.0]], [[1, 2]], "not a 64-bit integer"),
    ([[1]], [[1.0]], "not a 64-bit integer"),
    ([[1]], [[False]], "true/false"),
    ([[None]], [[1]], "null"),
    ([[{"b64": "AQ=="}]], [[1]], "an object"),
    ([[1 << 63]], [[1]], "out of int64's range"),
    ([[1]], [[-(1 << 63) - 1]], "not a 64-bit integer"),  # orjson: a float
    ([[[1]]], [[1]], "shape"),
    ([[1, [2]]], [[1, 2]], "a list"),
    ([[[1], 2]], [[1, 2]], "rectangular"),
    (_deep(33), [[1]], "nested more than 32 lists deep"),
    (_deep(65), [[1]], "nested more than 32 lists deep"),
    (_deep(300), [[1]], "nested more than 32 lists deep"),
], ids=["true", "2.0", "1-true", "1-2.0", "ts-1.0", "ts-false", "null", "object", "2**63",
        "-2**63-1", "rank", "mixed-depth", "mixed-depth-2", "33-deep", "65-deep", "300-deep"])
def test_a_rest_input_of_another_dtype_is_a_400(server, items, timestamps, words,
                                                no_internal_errors):
    """Case 5: ``[[true]]`` and ``[[2.0]]`` were read as items 1 and 2 (200). Found by the
    fuzz leg (test_serving_fuzz.py): lists nested 65 deep or more were a 500 (numpy's arrays
    have at most 64 dimensions); past 32 (validation.MAX_RANK) they are a 400."""
    for body in ({"inputs": {"items": items, "timestamps": timestamps}},
                 {"instances": [{"items": i, "timestamps": t}
                                for i, t in zip(items, timestamps)]}):
        _refused(server.http(PREDICT, body), 400, words)
    _still_serving(server)


def _proto(array, dtype=None, **fields):
    proto = tf.make_tensor_proto(np.asarray(array), dtype=dtype)
    for name, values in fields.items():
        proto.ClearField("tensor_content")
        getattr(proto, name).extend(values)
    return proto


def _predict(server, items, timestamps=None):
    request = _apis.PredictRequest()
    request.model_spec.name = "default"
    request.inputs["items"].CopyFrom(items)
    request.inputs["timestamps"].CopyFrom(
        timestamps if timestamps is not None else _proto(np.array([[1, 2]], np.int64)))
    try:
        return grpc.StatusCode.OK, server.stubs.Predict(request, timeout=60)
    except grpc.RpcError as e:
        return e.code(), e.details()


@pytest.mark.parametrize("items,words", [
    (lambda: _proto([[True, True]]), "is bool; the signature wants int64"),
    (lambda: _proto([[1.0, 2.0]], tf.float32), "is float32"),
    (lambda: _proto([[1, 2]], tf.int32), "is int32"),
    (lambda: _proto([["1", "2"]]), "is string"),
], ids=["bool", "float32", "int32", "string"])
def test_a_grpc_tensor_of_another_dtype_is_invalid_argument(server, items, words):
    """Case 5 over gRPC: the TensorProto's dtype is the signature's, exactly."""
    code, details = _predict(server, items())
    assert code == grpc.StatusCode.INVALID_ARGUMENT and words in details, (code, details)
    assert _predict(server, _proto(np.array([[1, 2]], np.int64)))[0] == grpc.StatusCode.OK


# -- case 8: element counts before any allocation ------------------------------------------
def _declaring(count, values=(1,)):
    """An int64 TensorProto declaring [1, count] with `values` in int64_val."""
    proto = tf.make_tensor_proto(np.zeros([0], np.int64))
    proto.tensor_shape.ClearField("dim")
    proto.tensor_shape.dim.add().size = 1
    proto.tensor_shape.dim.add().size = count
    proto.ClearField("tensor_content")
    proto.int64_val.extend(values)
    return proto


def test_a_grpc_tensor_declaring_more_than_the_limit_is_refused_before_it_is_built(
        server, no_internal_errors):
    """Case 8: a 74-byte Predict declaring [1, 2**25] with one int64_val was edge-padded to
    its full size (6.5 s, 2.8 GB); every declared size now counts against
    --max-request-elements (default 4,000,000) before anything is built."""
    limit = validation.DEFAULT_MAX_ELEMENTS
    for count in (limit + 1, 1 << 25, (1 << 63) - 1):  # (the old code took 4,000,001)
        code, details = _predict(server, _declaring(count), _declaring(count))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (count, code, details)
        assert "--max-request-elements" in details, details
    assert server.running.options.max_request_elements == limit
    # Two inputs within the limit each, over it together.
    code, details = _predict(server, _declaring(limit // 2 + 1), _declaring(limit // 2 + 1))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    _still_serving(server)


@pytest.mark.parametrize("items,words", [
    (lambda: _declaring(3, [1, 2, 3, 4, 5]), "holds 5 values; its shape [1, 3] holds 3"),
    (lambda: _proto(np.array([[1, 2]], np.int64), float_val=[1.0, 2.0]), "float_val"),
    (lambda: _proto(np.array([[1, 2]], np.int64), int_val=[1, 2]), "int_val"),
    (lambda: _with_content(b"\x01" * 7), "tensor_content holds 7 bytes"),
    (lambda: _with_content(b"\x01" * 16, int64_val=[1, 2]), "both"),
    (lambda: _with_dims([1, -2]), "negative"),
    (lambda: _with_dims([1] * 40), "dimensions"),
], ids=["too-many-values", "float_val", "int_val", "content-length", "content-and-values",
        "negative-dim", "rank-40"])
def test_a_grpc_tensor_not_in_one_of_tensorflows_forms_is_invalid_argument(server, items,
                                                                           words):
    code, details = _predict(server, items())
    assert code == grpc.StatusCode.INVALID_ARGUMENT and words in details, (code, details)


def _with_content(content, **fields):
    proto = tf.make_tensor_proto(np.array([[1, 2]], np.int64))
    proto.tensor_content = content
    for name, values in fields.items():
        getattr(proto, name).extend(values)
    return proto


def _with_dims(dims):
    proto = tf.make_tensor_proto(np.array([[1, 2]], np.int64))
    proto.ClearField("tensor_content")
    proto.tensor_shape.ClearField("dim")
    for d in dims:
        proto.tensor_shape.dim.add().size = d
    proto.int64_val.append(1)
    return proto


def test_a_grpc_tensor_in_tensorflows_short_forms_is_read_as_tensorflow_reads_it(server):
    """Fewer values than the shape: the last repeated (TensorFlow's Tensor::FromProto, and
    tf.make_tensor_proto(5, shape=[3]) sends such); the answer is the full tensor's."""
    short = _predict(server, _declaring(3, [4, 7]), _declaring(3, [10, 20, 30]))
    full = _predict(server, _proto(np.array([[4, 7, 7]], np.int64)),
                    _proto(np.array([[10, 20, 30]], np.int64)))
    assert short[0] == full[0] == grpc.StatusCode.OK, (short, full)
    np.testing.assert_array_equal(tf.make_ndarray(short[1].outputs["items"]),
                                  tf.make_ndarray(full[1].outputs["items"]))


def test_rest_element_counts_against_the_limit(server, monkeypatch, no_internal_errors):
    """REST's values (all inputs together; :recommend's lists together) count against
    --max-request-elements too: 413, before an array is built."""
    monkeypatch.setattr(server.running.server.options, "max_request_elements", 10)
    _refused(server.http(PREDICT, {"inputs": {"items": [[1] * 6], "timestamps": [[1] * 6]}}),
             413, "--max-request-elements 10")
    _refused(server.http(PREDICT, {"instances": [{"items": [1] * 11, "timestamps": [1] * 11}]}),
             413, "--max-request-elements 10")
    _refused(server.http(RECOMMEND, {"user_id": "big", "items": ["i1"] * 6,
                                     "candidates": [f"i{i}" for i in range(1, 6)]}),
             413, "--max-request-elements 10")
    assert server.http(PREDICT, {"inputs": {"items": [[1] * 5], "timestamps": [[1] * 5]}})[
        0] == 200
    assert "big" not in _cache(server).users


# -- case 7 and 10: the users' cache -------------------------------------------------------
def test_a_rejected_recommend_leaves_nothing_in_the_cache(server, no_internal_errors):
    """Case 7: 100 KB user ids with ``items: []`` (each a 400) left a cache entry each, ids
    not counted. Now an id is at most 1,024 bytes, and a refused request of a new user,
    whatever refuses it, keeps nothing."""
    cache = _cache(server)
    before = (set(cache.users), cache.bytes_used)
    for n in range(30):
        _refused(server.http(RECOMMEND, {"user_id": f"{n:06d}" + "x" * 100_000, "items": []}),
                 400, "'user_id' is 100,006 bytes long; at most 1024")
    long_id = "é" * 512 + "x"  # 1,025 bytes in UTF-8
    _refused(server.http(RECOMMEND, {"user_id": long_id, "items": ["i1"]}), 400, "1,025 bytes")
    refused = [  # each a new user, each refused at another step
        ({"items": []}, "no history"),
        ({"items": ["nope"]}, "catalogue"),
        ({"items": ["i1", "i2"], "timestamps": [5, 1]}, "must not decrease"),
        ({"items": ["i1"], "history": {"items": ["i2"], "timestamps": [9]},
          "timestamps": [3]}, "must not decrease"),
        ({"items": ["i1"], "k": 0}, "'k'"),
        ({"items": ["i1"], "candidates": ["i1", "i1"]}, "twice"),
    ]
    for n, (body, words) in enumerate(refused * 5):
        _refused(server.http(RECOMMEND, dict(body, user_id=f"{n:04d}" + "y" * 1000)), 400,
                 words)
    assert (set(cache.users), cache.bytes_used) == before
    assert _gauge(server) == cache.bytes_used
    _still_serving(server)


def test_a_refused_request_of_a_known_user_leaves_its_entry_as_it_was(server):
    body = {"user_id": "known", "items": ["i1", "i2"], "timestamps": [10, 20]}
    assert server.http(RECOMMEND, body)[0] == 200
    entry = _cache(server).users["known"]
    kept = entry.items.tolist(), entry.timestamps.tolist(), entry.bytes
    _refused(server.http(RECOMMEND, {"user_id": "known", "items": ["i3"], "timestamps": [5]}),
             400, "must not decrease")
    assert (entry.items.tolist(), entry.timestamps.tolist(), entry.bytes) == kept
    status, body = server.http(RECOMMEND, {"user_id": "known", "items": ["i3"],
                                           "timestamps": [30]})
    assert status == 200 and body["cache"] == "hit" and body["history_length"] == 3


def _gauge(server, name="recops_serving_user_cache_bytes"):
    _, text = server.http("/monitoring/prometheus/metrics")
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith(name + " ")))


def _evictions(server):
    _, text = server.http("/monitoring/prometheus/metrics")
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(
        'recops_serving_user_cache_events_total{event="eviction"}')))


def test_the_cache_counts_ids_and_keeps_its_budget_and_evictions_are_counted_once(server):
    """Case 10: 400 new users from 16 threads at --cache-mb 1 counted 1,406 evictions (each
    request counted the others' evictions made meanwhile). Case 7: the budget counts each
    user's id, events and state beside the pages, and is kept."""
    cache = _cache(server)
    before = set(cache.users)
    evicted_before, metric_before = cache.evictions, _evictions(server)
    users = [f"{n:04d}" + "z" * 1000 for n in range(400)]

    def ask(user):
        return server.http(RECOMMEND, {"user_id": user, "items": ["i1", "i2", "i3"], "k": 3})

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, users))
    assert all(status == 200 for status, _ in answers), answers[:3]
    gone = (before | set(users)) - set(cache.users)
    assert cache.evictions - evicted_before == len(gone) > 0
    assert _evictions(server) - metric_before == len(gone)
    assert cache.bytes_used <= cache.budget == 1 << 20
    kept = [cache.users[u] for u in users if u in cache.users]
    assert kept and all(e.bytes >= 1000 + 2 * 3 * 8 + cache_module.ENTRY_BYTES for e in kept)
    pages = (cache.num_pages - len(cache.free)) * cache.page_bytes
    assert cache.bytes_used == pages + sum(e.bytes for e in cache.users.values())
    assert _gauge(server) == cache.bytes_used


def test_without_a_page_pool_the_cache_still_counts_and_bounds_what_it_keeps():
    """--cache-mb 0 (no keys and values kept) said 0 bytes while every user's id and events
    were kept without bound: they are counted, within NO_POOL_BYTES."""
    cache = cache_module.UserCache(0, 64, np.float32)
    assert cache.num_pages == 0 and cache.budget == cache_module.NO_POOL_BYTES
    entry, _ = cache.user("u" * 1000)
    entry.items = entry.timestamps = np.arange(24, dtype=np.int64)
    entry.state = np.zeros(64, np.float32)
    cache.account(entry)
    cache.release(entry, drop_empty=True)
    assert cache.bytes_used == entry.bytes >= 1000 + 2 * 24 * 8 + 64 * 4
    small = cache_module.UserCache(0, 0, np.float32)
    small.budget = 20 * (cache_module.ENTRY_BYTES + 1100)
    evicted = []
    small.on_evict = lambda: evicted.append(1)
    for n in range(100):
        entry, _ = small.user(f"{n:03d}" + "k" * 1000)
        entry.items = entry.timestamps = np.arange(3, dtype=np.int64)
        small.account(entry)
        small.release(entry, drop_empty=True)
        assert small.bytes_used <= small.budget
    assert len(small.users) + len(evicted) == 100 and small.evictions == len(evicted)
    assert 15 <= len(small.users) <= 20


# -- duplicates, item types ----------------------------------------------------------------
def test_duplicate_candidates_are_a_400_naming_the_duplicate(server):
    """The side note: duplicate candidates were answered as given (the item twice in the
    answer). A duplicate is refused, named."""
    _refused(server.http(RECOMMEND, {"user_id": "d", "items": ["i1"],
                                     "candidates": ["i2", "i3", "i2"]}), 400, "'i2' twice")
    status, body = server.http(RECOMMEND, {"user_id": "d", "items": ["i1"],
                                           "candidates": ["i2", "i3"], "k": 2})
    assert status == 200 and sorted(body["items"]) == ["i2", "i3"], body


@pytest.mark.parametrize("items,words", [
    ([True], "got true/false"), ([2.0], "not a 64-bit integer"), ([None], "null"),
    ([["i1"]], "a list"), ("i1", "must be a list"),
], ids=["true", "2.0", "null", "list", "string"])
def test_recommend_items_are_names(server, items, words):
    _refused(server.http(RECOMMEND, {"user_id": "n", "items": items}), 400, words)
    _refused(server.http(RECOMMEND, {"user_id": "n", "items": ["i1"], "candidates": items}),
             400, words)


@pytest.mark.parametrize("user,words", [
    (True, "a string or an integer"), (1.5, "a string or an integer"),
    (None, "a string or an integer"), (["a"], "a string or an integer"),
    (-(1 << 63) - 1, "a string or an integer"),  # orjson: a float
])
def test_recommend_user_ids(server, user, words):
    _refused(server.http(RECOMMEND, {"user_id": user, "items": ["i1"]}), 400, words)


# -- the layer's functions -----------------------------------------------------------------
def test_user_keys():
    assert validation.user_key("a" * 1024) == "a" * 1024
    assert validation.user_key(-(1 << 63)) == ("u", -(1 << 63))
    for user, words in [("é" * 513, "1,026 bytes"), (1 << 64, "64-bit"), (True, "a string"),
                        (1.0, "a string")]:
        with pytest.raises(RequestError) as e:
            validation.user_key(user)
        assert e.value.status == 400 and words in e.value.message, e.value.message


def test_version_numbers():
    assert [validation.version_number(t) for t in ("1", "007", str((1 << 63) - 1))] == [
        1, 7, (1 << 63) - 1]
    for text in ("0", "", "³", "١", "１", "9" * 5000, str(1 << 63), "+1", " 1", "1 "):
        with pytest.raises(RequestError) as e:
            validation.version_number(text)
        assert e.value.status == 404 and len(e.value.message) < 300


def test_json_tensors_take_exact_dtypes_and_count_before_building():
    budget = Budget(100)
    got = validation.json_tensor([[1, 2], [3, 4]], tf.int64, "x", budget)
    assert got.dtype == np.int64 and got.tolist() == [[1, 2], [3, 4]] and budget.left == 96
    assert validation.json_tensor([[1, 2.5]], tf.float32, "x", Budget(9)).dtype == np.float32
    assert validation.json_tensor([[True]], tf.bool, "x", Budget(9)).tolist() == [[True]]
    assert validation.json_tensor(7, tf.int32, "x", Budget(9)).shape == ()
    assert validation.json_tensor([[], []], tf.int64, "x", Budget(9)).shape == (2, 0)
    assert validation.json_tensor(["a", {"b64": "AQI="}], tf.string, "x", Budget(9)).tolist(
        ) == [b"a", b"\x01\x02"]
    for value, dtype, status in [([[1]], tf.bool, 400), ([1, True], tf.int64, 400),
                                 ([2.0], tf.int32, 400), ([1 << 31], tf.int32, 400),
                                 ([-1], tf.uint8, 400), ([True], tf.float32, 400),
                                 ([10 ** 400], tf.float32, 400), ([1e300], tf.float32, 400),
                                 ([{"b64": "!!"}], tf.string, 400), ([1], tf.string, 400),
                                 ([[1] * 11], tf.int64, 413), ([[[1]] * 6] * 2, tf.int64, 413)]:
        with pytest.raises(RequestError) as e:
            validation.json_tensor(value, dtype, "x", Budget(10))
        assert e.value.status == status, (value, dtype, e.value.message)


def test_proto_tensors_in_tensorflows_forms():
    want = np.array([[4, 7, 7]], np.int64)
    for proto in (_declaring(3, [4, 7]), tf.make_tensor_proto(want)):
        np.testing.assert_array_equal(
            validation.proto_tensor(proto, tf.int64, "x", Budget(3)), want)
    np.testing.assert_array_equal(
        validation.proto_tensor(_declaring(3, []), tf.int64, "x", Budget(3)), [[0, 0, 0]])
    half = tf.make_tensor_proto(np.array([1.5, 2.5], np.float16))
    assert validation.proto_tensor(half, tf.float16, "x", Budget(2)).tolist() == [1.5, 2.5]
    assert validation.proto_tensor(tf.make_tensor_proto([b"a", b"b"]), tf.string, "x",
                                   Budget(2)).tolist() == [b"a", b"b"]
    started = time.perf_counter()
    with pytest.raises(RequestError) as e:
        validation.proto_tensor(_declaring(1 << 62), tf.int64, "x", Budget(4_000_000))
    assert e.value.status == 413 and time.perf_counter() - started < 5
    narrow = tf.make_tensor_proto(np.array([1], np.int8))
    narrow.ClearField("tensor_content")
    narrow.ClearField("int_val")
    narrow.int_val.append(300)
    with pytest.raises(RequestError) as e:
        validation.proto_tensor(narrow, tf.int8, "x", Budget(9))
    assert e.value.status == 400 and "int8" in e.value.message


def test_the_cli_flag_reaches_the_server_and_is_checked(tmp_path, monkeypatch, capsys):
    from recops_tf import cli, serving

    seen = []

    def running(options):
        seen.append(options)
        raise OSError("stop here")

    monkeypatch.setattr(serving, "Running", running)
    assert cli.main(["serve", "--model", str(tmp_path), "--max-request-elements", "123"]) == 2
    assert seen[-1].max_request_elements == 123
    assert cli.main(["serve", "--model", str(tmp_path)]) == 2
    assert seen[-1].max_request_elements == validation.DEFAULT_MAX_ELEMENTS
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--model", str(tmp_path), "--max-request-elements", "0"])
    assert e.value.code == 2 and "--max-request-elements" in capsys.readouterr().err


def test_a_gzip_bomb_and_urllib_still_work(server):
    """A gzipped body over --max-request-mb once inflated is a 413 (aiohttp's limit applies to
    the inflated body), not a 400 of ours."""
    bomb = gzip.compress(b"[" + b"1," * (3 << 20) + b"1]")
    request = urllib.request.Request(server.url + PREDICT, data=bomb,
                                     headers={"Content-Encoding": "gzip"})
    try:
        urllib.request.urlopen(request, timeout=60)
        status = 200
    except urllib.error.HTTPError as e:
        status, body = e.code, json.loads(e.read())
    assert status == 413 and "larger than" in body["error"]
