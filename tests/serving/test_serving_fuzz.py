"""The fuzz leg of `recops-tf serve` (issue 54, item 6): Hypothesis-generated requests against
one server process (the tiny export of tests/serving/test_server.py), over REST and gRPC.

* REST: :predict and :recommend bodies, valid ones spoiled in one to three places (a value of
  another type, a huge or negative integer, NaN / Infinity as text, a ragged row, a list
  wrapped once more, a field dropped, an unknown field, an empty list, a list over
  --max-request-elements), arbitrary JSON, JSON cut or spoiled, nesting past orjson's 1,024
  levels, bodies over --max-request-mb, junk; gzip and deflate bodies, gzip declared on junk
  or on a cut stream; random paths under /v1/models/..., methods and headers. Never a 5xx;
  every 4xx is a JSON object with an "error" (HEAD answers have no body).
* raw HTTP on a socket: odd request lines and headers, bad Content-Length / Transfer-Encoding,
  pipelined requests, bytes that are not HTTP. The same property, or no answer at all.
* gRPC: PredictRequests built valid and spoiled (input names, TensorProto dtypes, shapes with
  negative, -1, huge or 30+ dimensions, values in the wrong field or too many, random
  tensor_content, model names, versions, signatures, output filters) or built at random; raw
  bytes to each method; GetModelStatus / GetModelMetadata of random names, versions and fields.
  OK or a client error (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED, ...), never UNKNOWN,
  INTERNAL, DEADLINE_EXCEEDED (a hang) or UNAVAILABLE (a death).

The process is checked after every example (still running), answers a known-good REST and gRPC
request every ``ALIVE_EVERY`` examples and at each property's end; at the end its Prometheus
counters hold no 5xx / INTERNAL / UNKNOWN and its stderr no traceback. It runs with small
limits (--max-request-mb 1, --max-request-elements 1000, --cache-mb 1, --read-timeout 2), so
that 413, RESOURCE_EXHAUSTED and 408 are reached by small examples.

Deterministic in CI: every property runs with ``derandomize=True`` (its examples are a function
of its source, the same at every run) and no example database: 500 REST requests, 200 raw HTTP
ones, 500 Predicts, 200 raw gRPC messages, 150 status / metadata requests; about 70 s in all on
two busy cores (half of it the export and the server's start). A longer search draws new
examples:

    RECOPS_FUZZ_EXAMPLES=10 RECOPS_FUZZ_RANDOM=1 python -m pytest tests/serving/test_serving_fuzz.py

``RECOPS_FUZZ_EXAMPLES`` multiplies every property's examples (default 1);
``RECOPS_FUZZ_RANDOM=1`` turns derandomization off (a failure prints the ``@seed`` that
reproduces it)."""
import collections
import copy
import gzip
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import zlib
from urllib.parse import quote

import grpc
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorflow.core.framework import types_pb2
from test_server import _ENV, _apis, _export

SCALE = float(os.environ.get("RECOPS_FUZZ_EXAMPLES", "1"))
RANDOM = os.environ.get("RECOPS_FUZZ_RANDOM", "") not in ("", "0")
MAX_ELEMENTS = 1000
ALIVE_EVERY = 25
NUM_ITEMS = 30
PREDICT = "/v1/models/default:predict"
RECOMMEND = "/v1/models/default:recommend"
ONE_ROW = {"instances": [{"items": [1, 2], "timestamps": [1, 2]}]}
# A client error over gRPC; anything else (UNKNOWN, INTERNAL: the server failed;
# DEADLINE_EXCEEDED: it hung; UNAVAILABLE: it died) fails a property.
CLIENT_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED,
                grpc.StatusCode.OUT_OF_RANGE}
# What the server's stderr must not hold: a traceback, an internal error, aiohttp's own errors.
BAD_LOG = ("Traceback", "internal error", "Error handling request", "Unhandled exception")


def _settings(examples):
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None,
                    derandomize=not RANDOM, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much,
                                           HealthCheck.large_base_example])


class _Process:
    """`recops-tf serve` in a process of its own (a crash there fails a property instead of
    ending the test run), its stderr in a file; clients of both APIs."""

    def __init__(self, base, stderr):
        self.stderr_path = stderr
        with open(stderr, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "recops_tf", "serve", "--model", str(base),
                 "--rest-port", "0", "--grpc-port", "0", "--max-request-mb", "1",
                 "--max-request-elements", str(MAX_ELEMENTS), "--cache-mb", "1",
                 "--read-timeout", "2", "--poll-seconds", "30"],
                stdout=subprocess.PIPE, stderr=err, text=True, env=_ENV)
        line = self.proc.stdout.readline()
        found = re.search(r"REST on [\d.]+:(\d+), gRPC on [\d.]+:(\d+)", line)
        if not found:
            self.proc.kill()
            raise RuntimeError(f"the server did not start: {line!r}\n{self.stderr()[-3000:]}")
        self.rest_port, self.grpc_port = int(found[1]), int(found[2])
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stubs = _apis.stubs(self.channel)
        self.raw = {path: self.channel.unary_unary(path) for path in (  # bytes in, bytes out
            _apis.PREDICT, _apis.GET_MODEL_METADATA, _apis.GET_MODEL_STATUS)}
        self.examples = 0
        self.outcomes = collections.Counter()  # a property's answers: statuses or codes

    def stderr(self):
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def http(self, method, path, body=None, headers=None):
        """``(status, content type, body)`` of a request on a connection of its own; None if
        the server closed it, without an answer the client could read, before the whole
        request was sent (an answer to the headers of a large body: 413, 404, ...)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.rest_port, timeout=30)
        try:
            try:
                conn.request(method, path, body=body, headers=headers or {},
                             encode_chunked="Transfer-Encoding" in (headers or {}))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the answer may still be there to read
            try:
                answer = conn.getresponse()
            except (ConnectionResetError, http.client.RemoteDisconnected):
                return None
            return answer.status, answer.getheader("Content-Type", ""), answer.read()
        finally:
            conn.close()

    def send(self, data, head_only=False):
        """`data` as is on a connection of its own: ``(status, content type, body)`` of the
        first final answer (without a body if `head_only`), None if the server closed the
        connection without one. A server that neither answers nor closes within 20 s fails."""
        with socket.create_connection(("127.0.0.1", self.rest_port), timeout=20) as s:
            try:
                s.sendall(data)
            except (BrokenPipeError, ConnectionResetError):  # answered and closed before all
                pass  # of it was sent: the answer may still be there to read
            received, closed = b"", False
            while True:
                if b"\r\n\r\n" in received:
                    head, _, rest = received.partition(b"\r\n\r\n")
                    lines = head.decode("latin-1").split("\r\n")
                    status = int(lines[0].split()[1])
                    if status < 200:  # 100 Continue: the answer follows
                        received = rest
                        continue
                    fields = {k.strip().lower(): v.strip() for k, _, v in (
                        line.partition(":") for line in lines[1:])}
                    length = 0 if head_only or status in (204, 304) else int(
                        fields.get("content-length", -1))
                    if 0 <= length <= len(rest) or closed and length < 0:
                        return status, fields.get("content-type", ""), rest[:max(length, 0)
                                                                            or len(rest)]
                if closed:
                    assert not received, f"an answer cut short: {received[:300]!r}"
                    return None
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                except socket.timeout:
                    raise AssertionError(f"no answer within 20 s: {received[:300]!r}") from None
                closed = not chunk
                received += chunk

    def alive(self):
        assert self.proc.poll() is None, f"the server died\n{self.stderr()[-5000:]}"

    def serving(self):
        """The server is up and answers a known-good request of each API."""
        self.alive()
        status, _, body = self.http("POST", PREDICT, json.dumps(ONE_ROW).encode(),
                                    {"Content-Type": "application/json"})
        assert status == 200 and json.loads(body)["predictions"], (status, body)
        answer = self.stubs.Predict(_good_predict(), timeout=60)
        assert tf.make_ndarray(answer.outputs["items"]).shape[0] == 1

    def after_example(self, outcome):
        self.outcomes[outcome] += 1
        self.alive()
        self.examples += 1
        if self.examples % ALIVE_EVERY == 0:
            self.serving()

    def counts(self):
        """``{(api, status): count}`` of recops_serving_requests_total."""
        status, _, text = self.http("GET", "/monitoring/prometheus/metrics")
        assert status == 200
        found = {}
        for line in text.decode().splitlines():
            if line.startswith("recops_serving_requests_total{"):
                labels, value = line.rsplit(" ", 1)
                names = dict(re.findall(r'(\w+)="([^"]*)"', labels))
                found[names["api"], names["status"]] = float(value)
        return found

    def run(self, prop, *wanted):
        """Runs the property `prop`; then the server serves, has counted no server error and
        logged no traceback meanwhile, and the answers include each of `wanted` (the examples
        reached past the first checks)."""
        self.outcomes.clear()
        before, logged = self.counts(), len(self.stderr())
        prop()
        print(dict(self.outcomes))
        self.serving()
        counts = self.counts()
        failed = {k: v - before.get(k, 0) for k, v in counts.items()
                  if v > before.get(k, 0) and (k[1][0] == "5" or k[1] in ("INTERNAL",
                                                                          "UNKNOWN"))}
        assert not failed, failed
        log = self.stderr()[logged:]
        assert not any(words in log for words in BAD_LOG), log[-5000:]
        for outcome in wanted:
            assert self.outcomes[outcome] > 0, (outcome, dict(self.outcomes))

    def close(self):
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    _export(base / "1")
    running = _Process(base, tmp_path_factory.mktemp("log") / "stderr.txt")
    yield running
    running.close()


def _good_predict():
    request = _apis.PredictRequest()
    request.model_spec.name = "default"
    request.inputs["items"].CopyFrom(tf.make_tensor_proto(np.array([[1, 2]], np.int64)))
    request.inputs["timestamps"].CopyFrom(tf.make_tensor_proto(np.array([[1, 2]], np.int64)))
    return request


def weighted(*choices):
    """One of `choices` (``(weight, strategy)`` pairs) by weight (Hypothesis' one_of draws
    its branches alike); shrinks towards the first."""
    index = [i for i, (weight, _) in enumerate(choices) for _ in range(weight)]
    return st.sampled_from(index).flatmap(lambda i: choices[i][1])


# -- JSON -----------------------------------------------------------------------------------
INT_EDGES = [0, -1, NUM_ITEMS + 1, 1 << 31, -(1 << 31) - 1, 1 << 61, (1 << 61) + 1,
             -(1 << 61) - 1, (1 << 63) - 1, 1 << 63, -(1 << 63), -(1 << 63) - 1, (1 << 64) - 1,
             1 << 64, 10 ** 30]
odd_ints = st.one_of(st.integers(-3, NUM_ITEMS + 2), st.sampled_from(INT_EDGES), st.integers())
texts = st.text(max_size=12)
item_names = st.sampled_from([f"i{n}" for n in range(1, NUM_ITEMS + 1)])
odd_names = st.one_of(st.sampled_from(["i0", "i31", "", "I1", " i1", "i1 ", "i٣", "i01"]),
                      odd_ints, texts)
odd_leaves = st.one_of(st.none(), st.booleans(), odd_ints, st.floats(), texts, odd_names,
                       st.fixed_dictionaries({"b64": texts}))
FIELDS = ["instances", "inputs", "signature_name", "items", "timestamps", "k", "user_id",
          "history", "candidates", "exclude_seen", "b64"]
json_values = st.recursive(odd_leaves, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(FIELDS), texts), inner, max_size=3)),
    max_leaves=12)


def _nodes(value, at=()):
    """The paths (tuples of keys and indices) of `value`'s nodes, itself first."""
    yield at
    if isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nodes(v, at + (i,))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _nodes(v, at + (k,))


def _get(value, at):
    for key in at:
        value = value[key]
    return value


@st.composite
def spoiled(draw, valid, most=3):
    """`valid` (a strategy of JSON bodies) with 0..`most` of its nodes spoiled."""
    body = copy.deepcopy(draw(valid))
    for _ in range(draw(weighted((2, st.just(0)), (5, st.just(1)), (2, st.integers(2, most))))):
        at = draw(st.sampled_from(list(_nodes(body))))
        node = _get(body, at)
        how = draw(st.sampled_from(["value", "value", "value", "wrap", "unwrap", "drop",
                                    "extend", "field", "empty", "many"]))
        if how == "value":
            new = draw(st.one_of(odd_leaves, json_values))
        elif how == "wrap":
            new = [node]
        elif how == "unwrap" and isinstance(node, list) and node:
            new = node[0]
        elif how == "drop" and at:
            del _get(body, at[:-1])[at[-1]]
            continue
        elif how == "extend" and isinstance(node, list):  # a ragged row, a longer list
            new = node + draw(st.lists(st.one_of(odd_leaves, st.just(node[:1])), min_size=1,
                                       max_size=2))
        elif how == "field" and isinstance(node, dict):
            new = {**node, draw(st.one_of(st.sampled_from(FIELDS), texts)): draw(json_values)}
        elif how == "empty":
            new = draw(st.sampled_from([[], {}, "", [[]]]))
        elif how == "many":  # past --max-request-elements
            new = [node] * draw(st.integers(MAX_ELEMENTS // 2, MAX_ELEMENTS + 100))
        else:
            continue
        if at:
            _get(body, at[:-1])[at[-1]] = new
        else:
            body = new
    return body


stamps = st.lists(st.integers(0, 10 ** 10), min_size=1, max_size=6).map(sorted)


@st.composite
def valid_predict(draw):
    """A :predict body the server answers 200: rows of 1-6 items (0-padded), in the row or
    the columnar form, of serving_default; or one history for the "recommend" signature."""
    if draw(st.integers(0, 4)) == 0:
        n = draw(st.integers(1, 6))
        return {"signature_name": "recommend", "inputs": {
            "items": draw(st.lists(st.integers(1, NUM_ITEMS), min_size=n, max_size=n)),
            "timestamps": sorted(draw(st.lists(st.integers(0, 10 ** 10), min_size=n,
                                               max_size=n))),
            "k": draw(st.integers(1, NUM_ITEMS))}}
    width = draw(st.integers(1, 6))
    items, times = [], []
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, width))
        items.append(draw(st.lists(st.integers(1, NUM_ITEMS), min_size=n, max_size=n)) +
                     [0] * (width - n))
        times.append(sorted(draw(st.lists(st.integers(0, 10 ** 10), min_size=width,
                                          max_size=width))))
    body = ({"inputs": {"items": items, "timestamps": times}} if draw(st.booleans()) else
            {"instances": [{"items": i, "timestamps": t} for i, t in zip(items, times)]})
    if draw(st.booleans()):
        body["signature_name"] = "serving_default"
    return body


@st.composite
def valid_recommend(draw):
    """A :recommend body, mostly answered 200: a user (a few known ones, so that the cache
    is hit; unicode; integers), new events, sometimes timestamps, history, k, exclusion,
    candidates."""
    body = {"user_id": draw(weighted(
        (4, st.sampled_from(["alice", "bob", "ü-sér", "😀", "0"])), (1, st.text(max_size=40)),
        (1, st.integers(-(1 << 63), (1 << 64) - 1))))}
    body["items"] = draw(st.lists(item_names, max_size=5))
    if body["items"] and draw(st.booleans()):
        n = len(body["items"])
        body["timestamps"] = sorted(draw(st.lists(st.integers(-(1 << 61), 1 << 61),
                                                  min_size=n, max_size=n)))
    if draw(st.integers(0, 3)) == 0:
        body["history"] = {"items": draw(st.lists(item_names, min_size=1, max_size=5))}
    if draw(st.booleans()):
        body["k"] = draw(st.integers(1, NUM_ITEMS))
    if draw(st.integers(0, 3)) == 0:
        body["exclude_seen"] = draw(st.booleans())
    if draw(st.integers(0, 3)) == 0:
        body["candidates"] = draw(st.lists(item_names, min_size=1, max_size=5, unique=True))
    return body


def _dumps(value, ascii_only=True):
    return json.dumps(value, ensure_ascii=ascii_only).encode()  # NaN, Infinity as JSON5 has


@st.composite
def bodies(draw, kind):
    """A body for a `kind` ("predict", "recommend" or "any") request: JSON spoiled as
    ``spoiled`` does; sometimes cut, misspelt, too deep, too large, or junk."""
    valid = {"predict": valid_predict(), "recommend": valid_recommend()}.get(
        kind, st.one_of(valid_predict(), valid_recommend()))
    form = draw(weighted((12, st.just("json")), (1, st.just("cut")), (1, st.just("deep")),
                         (1, st.just("large")), (1, st.just("junk")), (1, st.just("none"))))
    raw = _dumps(draw(spoiled(valid)), draw(st.booleans()))
    if form == "json":
        return raw
    if form == "cut":
        at = draw(st.integers(0, len(raw)))
        return draw(st.sampled_from([raw[:at], raw[:at] + b"\x00\xff" + raw[at:], raw + b"]",
                                     raw.replace(b"1", b"NaN", 1), raw.replace(b"1", b"1e999", 1),
                                     raw.replace(b"1", b"-Infinity", 1), b"\xef\xbb\xbf" + raw]))
    if form == "deep":
        depth = draw(st.one_of(st.sampled_from([32, 33, 64, 65, 1023, 1024, 1025]),
                               st.integers(1, 1100)))
        nest = b"[" * depth + b"1" + b"]" * depth
        return draw(st.sampled_from([
            nest, b'{"inputs": {"items": ' + nest + b', "timestamps": ' + nest + b"}}",
            b'{"user_id": "u", "items": ' + nest + b"}"]))
    if form == "large":
        n = draw(st.sampled_from([(1 << 19) - 20, (1 << 19) + 10, 600_000]))
        return b'{"inputs": {"items": [[' + b"1," * n + b'1]], "timestamps": [[1]]}}'
    if form == "junk":
        return draw(st.binary(max_size=64))
    return None


model_names = weighted((6, st.just("default")), (1, st.sampled_from(
    ["nope", "", "default ", "DEFAULT", "défault"])), (1, texts))
version_texts = st.sampled_from(
    ["1", "0", "01", "0001", "2", "-1", "1.0", "9" * 30, "9" * 5000, str(1 << 63),
     str((1 << 63) - 1), "³", "١", "１", " 1", ""]) | st.integers(-5, 1 << 64).map(str) | texts
suffixes = st.sampled_from(["", "/metadata", ":predict", ":recommend", ":classify", ":regress",
                            ":multi_inference", "/", ":", "/labels", "/metadata/",
                            ":predict:predict", "/versions"]) | texts


@st.composite
def paths(draw):
    """A path under /v1/models/ (model name, version, suffix each odd or not, percent-encoded
    or not), or one of a few others."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(["/", "/v1", "/v1/models", "/v1/models/", "/healthz",
                                     "/monitoring/prometheus/metrics", "/v2/models/default",
                                     "/v1/models//versions/1", "/v1/models/default/versions/",
                                     "//v1/models/default", "/v1/models/default/../default"]))
    safe = draw(st.sampled_from(["", "/:", "/:%"]))
    path = "/v1/models/" + quote(draw(model_names), safe=safe)
    if draw(st.booleans()):
        path += "/versions/" + quote(draw(version_texts), safe=safe)
    path += quote(draw(suffixes), safe=safe)
    if draw(st.integers(0, 9)) == 0:
        path += "?" + quote(draw(texts), safe="=&")
    return path


header_names = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,15}", fullmatch=True)
header_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=30)
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]) | \
    st.from_regex(r"[A-Z]{1,10}", fullmatch=True)


@st.composite
def rest_requests(draw):
    """``(method, path, body, headers)``: mostly a POST of a :predict or :recommend body
    (version 1 named or not), its Content-Encoding honest or not; else anything."""
    kind = draw(weighted((9, st.just("predict")), (6, st.just("recommend")),
                         (5, st.just("any"))))
    if kind == "any":
        method, path = draw(methods), draw(paths())
    else:
        method = "POST"
        path = ("/v1/models/default" + draw(st.sampled_from(["", "", "/versions/1"])) +
                ":" + kind)
    body = draw(bodies(kind))
    headers = {"Content-Type": draw(weighted((8, st.just("application/json")), (1, st.one_of(
        st.sampled_from(["text/plain", "", "multipart/form-data; b=x",
                         "application/json; charset=latin-1"]), header_values))))}
    encoding = draw(weighted((12, st.just("")), (1, st.sampled_from(
        ["gzip", "gzip-junk", "gzip-cut", "deflate", "deflate-junk", "br", "other"]))))
    if encoding and body is not None:
        name, _, spoil = encoding.partition("-")
        packed = gzip.compress(body) if name == "gzip" else zlib.compress(body)
        if spoil == "cut":
            packed = packed[:draw(st.integers(0, len(packed) - 1))]
        headers["Content-Encoding"] = draw(header_values) if name == "other" else name
        body = body if spoil == "junk" or name in ("br", "other") else packed
    headers.update(draw(st.dictionaries(header_names, header_values, max_size=2)))
    if body is not None and draw(st.integers(0, 29)) == 0:  # sent in chunks (a body cut
        headers["Transfer-Encoding"] = "chunked"  # short would wait --read-timeout: a 408)
    if draw(st.integers(0, 29)) == 0:
        headers["Expect"] = "100-continue"
    return method, path, body, headers


def _json_error(status, kind, body, what):
    """A 4xx answer's body is ``{"error": "..."}``."""
    assert kind.split(";")[0].strip() == "application/json", (status, kind, body[:300], what)
    answer = json.loads(body)
    assert isinstance(answer, dict) and isinstance(answer.get("error"), str), (answer, what)


def test_rest_fuzz(server):
    """Hypothesis' REST requests: never a 5xx; a 4xx's body is JSON with an "error"."""
    @_settings(500)
    @given(rest_requests())
    def each(request):
        method, path, body, headers = request
        got = server.http(method, path, body, headers)
        assert got is not None or len(body) > 1 << 16, request  # no answer: to a large body
        status, kind, answer = got or (None, "", b"")
        if got is not None:
            assert status < 500, (status, answer[:300], request)
            if status >= 400 and method != "HEAD":
                _json_error(status, kind, answer, request)
        server.after_example(status)

    server.run(each, 200, 400, 404, 413)



# -- raw HTTP -------------------------------------------------------------------------------
raw_methods = st.sampled_from([b"POST", b"GET", b"HEAD", b"PRI", b"CONNECT", b"get", b"",
                               b"G ET", b"\x16\x03\x01"]) | st.binary(min_size=1, max_size=8)
raw_targets = st.one_of(paths().map(str.encode), st.sampled_from([
    b"*", b"", b"http://x/v1/models/default:predict", b"/v1/models/default:predict#x",
    b"/v1/models/d\xc3\xa9fault", b"/v1/models/%zz", b"/v1/models/default versions",
    b"/" + b"a" * 9000]), st.binary(max_size=30))
raw_versions = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1x", b"",
                                b"HTTP/1", b"http/1.1", b"HTTP/0.9"])
raw_headers = st.lists(st.one_of(
    st.tuples(header_names.map(str.encode), header_values.map(str.encode)),
    st.tuples(st.sampled_from([b"Transfer-Encoding", b"Content-Encoding", b"Host",
                               b"Connection", b"Bad Header", b"", b":x", b"X\x00",
                               b"Content-Length"]),
              st.sampled_from([b"-1", b"0", b"1x", b"+5", b"0x10", b"99999999999999999999",
                               b"chunked", b"gzip", b"close", b"\xff"]) | st.binary(max_size=12))
), max_size=4)


@st.composite
def raw_requests(draw):
    """``(bytes, whether a HEAD)``: HTTP as no client library writes it (an odd request line,
    odd headers, Content-Length at most the body's: more waits --read-timeout for a 408, as
    test_fairness.py has it), or a request behind another, or bytes that are not HTTP."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200)) + b"\r\n\r\n", False
    method = draw(weighted((4, st.just(b"POST")), (1, raw_methods)))
    target = draw(weighted((3, st.just(b"/v1/models/default:predict")), (2, raw_targets)))
    line = method + b" " + target + b" " + draw(weighted((4, st.just(b"HTTP/1.1")),
                                                         (1, raw_versions)))
    body = draw(bodies("predict")) or b""
    headers = [(b"Host", b"x")] + draw(raw_headers)
    if draw(st.integers(0, 5)):
        headers.append((b"Content-Length",
                        str(len(body) - draw(weighted((3, st.just(0)), (1, st.integers(
                            0, min(len(body), 50)))))).encode()))
    data = line + b"\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n"
    data += body
    if draw(st.integers(0, 4)) == 0:  # a request behind the first
        data += b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    return data, method == b"HEAD"


def test_raw_http_fuzz(server):
    """Hypothesis' HTTP bytes: whatever aiohttp's parser or the server answers is never a
    5xx, and a 4xx is JSON with an "error"."""
    @_settings(200)
    @given(raw_requests())
    def each(request):
        data, head_only = request
        answer = server.send(data, head_only)
        if answer is not None:
            status, kind, body = answer
            assert status < 500, (answer, data[:300])
            if status >= 400 and not head_only:
                _json_error(status, kind, body, data[:300])
        server.after_example(answer and answer[0])

    server.run(each, 200, 400)



# -- gRPC -----------------------------------------------------------------------------------
DT = types_pb2
dtypes = weighted((3, st.sampled_from([DT.DT_INT32, DT.DT_BOOL, DT.DT_FLOAT, DT.DT_STRING,
                                       DT.DT_UINT64, DT.DT_HALF, DT.DT_BFLOAT16, DT.DT_INT8])),
                  (2, st.sampled_from(sorted(DT.DataType.values()))),
                  (1, st.integers(-(1 << 31), (1 << 31) - 1)))
DIM_EDGES = [-1, -2, 0, 1 << 25, 1 << 31, 1 << 62, (1 << 63) - 1, -(1 << 63), 999, 1001]
int32s = st.integers(-(1 << 31), (1 << 31) - 1)
int64s = weighted((3, st.integers(-2, NUM_ITEMS + 2)),
                  (1, st.sampled_from([(1 << 63) - 1, -(1 << 63), 1 << 61, -(1 << 61)])),
                  (1, st.integers(-(1 << 63), (1 << 63) - 1)))
VALUE_FIELDS = {
    "half_val": int32s, "float_val": st.floats(width=32), "double_val": st.floats(),
    "int_val": int32s, "string_val": st.binary(max_size=8), "scomplex_val": st.floats(width=32),
    "int64_val": int64s, "bool_val": st.booleans(), "dcomplex_val": st.floats(),
    "uint32_val": st.integers(0, (1 << 32) - 1), "uint64_val": st.integers(0, (1 << 64) - 1)}


@st.composite
def any_tensors(draw):
    """A TensorProto of any dtype (known or not) and shape (negative, huge, 30+ dimensions,
    unknown rank), values in any fields, tensor_content of random bytes."""
    proto = tf.make_tensor_proto(np.zeros([0], np.int64))
    proto.ClearField("tensor_content")
    proto.dtype = draw(st.one_of(st.just(DT.DT_INT64), dtypes))
    proto.tensor_shape.unknown_rank = draw(st.integers(0, 9)) == 0
    for size in draw(weighted((5, st.lists(st.one_of(st.integers(0, 4), st.sampled_from(
            DIM_EDGES), st.integers(-(1 << 63), (1 << 63) - 1)), max_size=4)), (1, st.lists(
                st.integers(0, 2), min_size=30, max_size=40)))):
        proto.tensor_shape.dim.add(size=size, name=draw(weighted((9, st.just("")),
                                                                 (1, texts))))
    for field in draw(st.lists(st.sampled_from(sorted(VALUE_FIELDS)), max_size=2, unique=True)):
        getattr(proto, field).extend(draw(st.lists(VALUE_FIELDS[field], max_size=12)))
    if draw(st.booleans()):
        proto.tensor_content = draw(st.one_of(st.binary(max_size=64), st.sampled_from(
            [b"\x01" * 8, b"\x01" * 16, b"\x00" * (1 << 20)])))
    return proto


def _ids(draw, shape, high=NUM_ITEMS):
    """An int64 TensorProto of `shape` holding valid ids (1..`high`: timestamps too), as
    tensor_content or int64_val, in TensorFlow's short form (the last value repeated)
    sometimes."""
    count = int(np.prod(shape))
    values = draw(st.lists(st.integers(1, high), min_size=count, max_size=count))
    proto = tf.make_tensor_proto(np.array(values, np.int64).reshape(shape))
    if draw(st.booleans()):
        proto.ClearField("tensor_content")
        short = draw(st.integers(0, 4)) == 0 and count
        proto.int64_val.extend(values[:draw(st.integers(1, count))] if short else values)
    return proto


@st.composite
def valid_predicts(draw):
    """A PredictRequest the server answers OK: serving_default's rows, or recommend's one
    history and k."""
    request = _apis.PredictRequest()
    request.model_spec.name = "default"
    if draw(st.booleans()):
        request.model_spec.version.value = 1
    if draw(st.integers(0, 3)) == 0:
        request.model_spec.signature_name = "recommend"
        n = draw(st.integers(1, 6))
        request.inputs["items"].CopyFrom(_ids(draw, [n]))
        request.inputs["timestamps"].CopyFrom(_ids(draw, [n], 10 ** 9))
        request.inputs["k"].CopyFrom(tf.make_tensor_proto(np.int32(
            draw(st.integers(1, NUM_ITEMS)))))
    else:
        request.model_spec.signature_name = draw(st.sampled_from(["", "serving_default"]))
        shape = [draw(st.integers(1, 4)), draw(st.integers(1, 6))]
        request.inputs["items"].CopyFrom(_ids(draw, shape))
        request.inputs["timestamps"].CopyFrom(_ids(draw, shape, 10 ** 9))
    if draw(st.integers(0, 3)) == 0:
        request.output_filter.extend(draw(st.lists(st.sampled_from(["items", "scores"]),
                                                   min_size=1, max_size=2, unique=True)))
    return request


input_names = st.sampled_from(["items", "timestamps", "k"]) | texts


@st.composite
def predict_requests(draw):
    """A valid PredictRequest spoiled in 0-3 places, or one of random inputs."""
    request = draw(valid_predicts())
    if draw(st.integers(0, 5)) == 0:
        request.ClearField("inputs")
        for name in draw(st.lists(input_names, max_size=4, unique=True)):
            request.inputs[name].CopyFrom(draw(any_tensors()))
    spec = request.model_spec
    for _ in range(draw(weighted((2, st.just(0)), (5, st.just(1)), (2, st.integers(2, 3))))):
        how = draw(st.sampled_from(["dtype", "dim", "dim", "rank", "values", "values",
                                    "content", "short", "drop", "add", "tensor", "name",
                                    "version", "label", "signature", "filter"]))
        names = sorted(request.inputs)
        proto = request.inputs[draw(st.sampled_from(names))] if names else None
        if how == "dtype" and proto is not None:
            proto.dtype = draw(dtypes)
        elif how == "dim" and proto is not None:
            dims = proto.tensor_shape.dim
            if dims and draw(st.booleans()):
                dims[draw(st.integers(0, len(dims) - 1))].size = draw(st.one_of(
                    st.sampled_from(DIM_EDGES), st.integers(0, 7)))
            elif dims and draw(st.booleans()):
                del dims[-1]
            else:
                dims.add(size=draw(st.one_of(st.sampled_from(DIM_EDGES), st.integers(0, 3))))
        elif how == "rank" and proto is not None:
            proto.tensor_shape.unknown_rank = True
        elif how == "values" and proto is not None:
            field = draw(st.sampled_from(sorted(VALUE_FIELDS)))
            getattr(proto, field).extend(draw(st.lists(VALUE_FIELDS[field], min_size=1,
                                                       max_size=4)))
        elif how == "content" and proto is not None:
            proto.tensor_content = draw(st.binary(max_size=64))
        elif how == "short" and proto is not None:
            proto.ClearField("tensor_content")
            proto.ClearField("int64_val")
            proto.int64_val.extend(draw(st.lists(int64s, max_size=3)))
        elif how == "drop" and names:
            del request.inputs[draw(st.sampled_from(names))]
        elif how == "add":
            request.inputs[draw(input_names)].CopyFrom(draw(any_tensors()))
        elif how == "tensor" and names:
            request.inputs[draw(st.sampled_from(names))].CopyFrom(draw(any_tensors()))
        elif how == "name":
            spec.name = draw(model_names)
        elif how == "version":
            spec.version.value = draw(st.one_of(st.sampled_from([0, -1, 2]), int64s))
        elif how == "label":
            spec.version_label = draw(st.one_of(st.sampled_from(["stable", "1", ""]), texts))
        elif how == "signature":
            spec.signature_name = draw(st.one_of(st.sampled_from(
                ["recommend", "serving_default", "top_k", "nope", " "]), texts))
        elif how == "filter":
            request.output_filter.append(draw(st.one_of(st.sampled_from(["items", "state"]),
                                                        texts)))
    return request


def _code(call):
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def test_grpc_predict_fuzz(server):
    """Hypothesis' PredictRequests: OK or a client error, never UNKNOWN / INTERNAL."""
    @_settings(500)
    @given(predict_requests())
    def each(request):
        code, details = _code(lambda: server.stubs.Predict(request, timeout=30))
        assert code in CLIENT_CODES, (code, details, request)
        server.after_example(code.name)

    server.run(each, "OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED")


@st.composite
def raw_messages(draw):
    """Bytes for a method: random ones, or a good Predict's bytes cut, changed or extended."""
    good = _good_predict().SerializeToString()
    kind = draw(st.sampled_from(["random", "cut", "flip", "append", "good"]))
    if kind == "random":
        return draw(st.binary(max_size=200))
    if kind == "cut":
        return good[:draw(st.integers(0, len(good)))]
    if kind == "flip":
        at = draw(st.integers(0, len(good) - 1))
        return good[:at] + bytes([draw(st.integers(0, 255))]) + good[at + 1:]
    if kind == "append":
        return good + draw(st.binary(min_size=1, max_size=20))
    return good


def test_grpc_raw_bytes_fuzz(server):
    """Hypothesis' bytes to each method: what does not decode is INVALID_ARGUMENT (grpc's own
    decoding would answer UNKNOWN); what does is answered as any request."""
    @_settings(200)
    @given(st.sampled_from(sorted(server.raw)), raw_messages())
    def each(method, data):
        code, details = _code(lambda: server.raw[method](data, timeout=30))
        assert code in CLIENT_CODES, (code, details, method, data)
        server.after_example(code.name)

    server.run(each, "OK", "INVALID_ARGUMENT")


@st.composite
def specs(draw, message):
    """A GetModelStatusRequest or GetModelMetadataRequest, its model_spec and fields odd or
    not."""
    request = message()
    request.model_spec.name = draw(model_names)
    choice = draw(st.sampled_from(["none", "none", "number", "label"]))
    if choice == "number":
        request.model_spec.version.value = draw(st.one_of(st.sampled_from([1, 0, -1, 2]),
                                                          int64s))
    elif choice == "label":
        request.model_spec.version_label = draw(texts)
    request.model_spec.signature_name = draw(weighted((3, st.just("")), (1, texts)))
    if message is _apis.GetModelMetadataRequest:
        request.metadata_field.extend(draw(weighted(
            (3, st.just(["signature_def"])), (1, st.lists(st.one_of(
                st.just("signature_def"), texts), max_size=3)))))
    return request


def test_grpc_status_and_metadata_fuzz(server):
    """GetModelStatus and GetModelMetadata of random names, versions and fields."""
    @_settings(150)
    @given(st.one_of(specs(_apis.GetModelStatusRequest),
                     specs(_apis.GetModelMetadataRequest)))
    def each(request):
        call = (server.stubs.GetModelStatus if isinstance(request, _apis.GetModelStatusRequest)
                else server.stubs.GetModelMetadata)
        code, details = _code(lambda: call(request, timeout=30))
        assert code in CLIENT_CODES, (code, details, request)
        server.after_example(code.name)

    server.run(each, "OK", "NOT_FOUND")
