"""``recops-tf serve``: TF Serving's REST and gRPC APIs for SavedModels that use recops_tf ops,
with dynamic batching, versions, Prometheus metrics and users' state kept between requests.

Libraries: aiohttp (the REST server: asyncio, HTTP/1.1 keep-alive, request size limits, graceful
shutdown) on uvloop's event loop where installed (libuv: less Python a request than asyncio's
own loop), orjson (JSON in and out, about 20x faster than the json module on an answer of 100
scores), grpcio (the gRPC server TF Serving's clients talk to), prometheus_client (the metrics
text format). See docs/serving.md.
"""
import asyncio
import concurrent.futures
import dataclasses
import logging
import re
import signal
import sys
import threading
import time

import aiohttp.http_exceptions
import aiohttp.web_protocol
import grpc
import numpy as np
import orjson
import prometheus_client as prom
import tensorflow as tf
from aiohttp import web
from google.protobuf import json_format
from tensorflow.core.protobuf import error_codes_pb2

from recops_tf.layers.hstu_block import EXTEND_IN_PLACE
from recops_tf.serving import _apis
from recops_tf.serving.batching import Batcher, batch_rows
from recops_tf.serving.cache import ALIGN, UserCache
from recops_tf.serving.models import RequestError, Versions, log, op_error
from recops_tf.serving.rest import request_tensors, response_body
from recops_tf.serving import validation
from recops_tf.serving.validation import Budget

_GRPC_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
               413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}
_LATENCY_BUCKETS = (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1, 2, 5)


@dataclasses.dataclass
class Options:
    """``recops-tf serve``'s flags (TF Serving's names where it has them)."""
    model: str
    model_name: str = "default"
    host: str = "127.0.0.1"
    rest_port: int = 8501  # 0: any free port; -1: no REST server
    grpc_port: int = 8500  # 0: any free port; -1: no gRPC server
    enable_batching: bool = True
    max_batch_size: int = 32
    batch_timeout_micros: int = 1000
    num_batch_threads: int = 1
    max_enqueued_batches: int = 100
    cache_bytes: int = 256 << 20  # the users' key/value pages (0: no key/value cache)
    cache_page_rows: int = 64
    max_users: int = 1_000_000
    poll_seconds: float = 1.0  # TF Serving's --file_system_poll_wait_seconds
    max_request_bytes: int = 4 << 20
    # the most values (all inputs, or all of :recommend's lists, together) a request may hold
    # or declare, checked before anything is built for them
    max_request_elements: int = validation.DEFAULT_MAX_ELEMENTS
    drain_seconds: float = 10.0
    # A REST request's headers must arrive within this many seconds of their first byte, and
    # its body within this many seconds of its headers; else 408 and the connection closed.
    read_timeout: float = 30.0
    large_threads: int = 1  # threads of the large requests' lane (see LARGE_ELEMENTS)
    workers: int = 64  # threads running REST requests
    # TF Serving's --tensorflow_intra_op_parallelism / --tensorflow_inter_op_parallelism: threads
    # of one op / of a call's independent ops (0: TensorFlow's choice, a thread a core)
    intra_op_threads: int = 0
    inter_op_threads: int = 0


class _Metrics:
    def __init__(self):
        self.registry = prom.CollectorRegistry()
        r = self.registry
        self.requests = prom.Counter("recops_serving_requests", "Requests by API and status",
                                     ["api", "status"], registry=r)
        self.latency = prom.Histogram("recops_serving_request_latency_seconds",
                                      "Request latency by API", ["api"],
                                      buckets=_LATENCY_BUCKETS, registry=r)
        self.batch = prom.Histogram("recops_serving_batch_size", "Rows of a model call",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.cache = prom.Counter("recops_serving_user_cache_events",
                                  "User cache hits, misses and evictions", ["event"], registry=r)
        self.cache_bytes = prom.Gauge("recops_serving_user_cache_bytes",
                                      "Bytes the users' cache keeps: its pages in use, and "
                                      "each user's id, events and state", registry=r)
        self.version = prom.Gauge("recops_serving_model_version", "The version served",
                                  registry=r)


class ModelServer:
    """The model, its versions, the batcher, the user caches and the metrics, behind both
    APIs. ``predict``, ``status``, ``metadata`` and ``recommend`` raise ``RequestError``."""

    def __init__(self, options):
        self.options = options
        self.metrics = _Metrics()
        self.ready = False
        self._in_flight = 0  # :predict requests being handled (parsed, queued or run)
        self._in_flight_lock = threading.Lock()
        self.batcher = (Batcher(options.max_batch_size, options.batch_timeout_micros,
                                options.num_batch_threads, options.max_enqueued_batches,
                                on_batch=self.metrics.batch.observe,
                                in_flight=lambda: self._in_flight)
                        if options.enable_batching else None)
        self.versions = Versions(options.model, on_load=self._prepare)
        self.ready = True
        self._stop = threading.Event()

    def _prepare(self, version):
        """A new version: its user cache (the old version's is dropped with it)."""
        width = version.info.get("cache_width", 0) if version.cacheable else 0
        dtype = tf.as_dtype(version.info.get("compute_dtype", "float32")).as_numpy_dtype
        version.cache = UserCache(self.options.cache_bytes if width else 0, width, dtype,
                                  self.options.cache_page_rows, self.options.max_users,
                                  on_evict=self.metrics.cache.labels("eviction").inc)
        # Warmed before it is served: its status says LOADING (and, at start, /healthz is not
        # ready) until then, and its first requests do not pay TensorFlow's first calls.
        began = time.perf_counter()
        for name, error in version.warm_up():
            log.warning("version %d: the warm-up call of %s with a tiny input failed (%s); "
                        "serving it anyway", version.number, name, error)
        log.info("version %d warmed up in %.2f s", version.number, time.perf_counter() - began)
        self.metrics.version.set(version.number)

    def poll_forever(self):
        """Polls for versions until ``close``. Nothing stops it: a poll that fails (the model
        directory renamed away for a moment, unreadable, ...) is logged, once until it
        succeeds again, and the next poll retries."""
        failing = None
        while not self._stop.wait(self.options.poll_seconds):
            try:
                self.versions.poll()
            except Exception as e:  # noqa: BLE001  (the watcher must not die)
                message = f"{type(e).__name__}: {e}"
                if message != failing:
                    log.error("looking for versions in %s failed: %s (still serving version "
                              "%s; trying again every %g s)", self.options.model, message,
                              self._served(), self.options.poll_seconds,
                              exc_info=log.isEnabledFor(logging.DEBUG))
                failing = message
            else:
                if failing is not None:
                    log.info("looking for versions in %s works again", self.options.model)
                failing = None

    def _served(self):
        try:
            return self.versions.get().number
        except RequestError:
            return None

    def close(self):
        self._stop.set()
        self.ready = False
        if self.batcher:
            self.batcher.close()

    # -- the APIs' work ------------------------------------------------------------------
    def model(self, name, number=None):
        self._named(name)
        return self.versions.get(number)

    def _named(self, name):
        if name != self.options.model_name:
            raise RequestError(404, f"Servable not found for request: model '{name}' (this "
                               f"server serves '{self.options.model_name}')")

    def status(self, name, number=None):
        """``[(version, models.VersionState)]``, newest first: every version the server has
        looked at (served, replaced, failed with its error, waiting to load), as TF Serving's
        GetModelStatus; or version `number` (RequestError(404) if the server never saw it)."""
        self._named(name)
        return self.versions.status(number)

    def metadata(self, name, number=None):
        version = self.model(name, number)
        return version, version.metadata()

    def predicting(self, delta):
        """Counts a :predict request in (+1) and out (-1), for the batcher."""
        with self._in_flight_lock:
            self._in_flight += delta

    def batchable(self, signature, tensors):
        """Whether a request joins a batch: a batchable signature, at most ``max_batch_size``
        rows and at most ``LARGE_ELEMENTS`` values (a large request would make every request
        of its batch wait for its cost: it runs alone, on the large requests' lane)."""
        rows = batch_rows(signature, tensors)
        return (self.batcher is not None and rows is not None
                and rows <= self.options.max_batch_size and not large(tensors))

    def predict(self, version, signature, tensors, batch=True):
        """`signature`'s outputs for `tensors`: from a batch where it can join one (unless
        `batch` is False), else from its own call."""
        if batch and self.batchable(signature, tensors):
            return self.batcher.submit(version, signature, tensors)
        out = signature(tensors)
        self.metrics.batch.observe(batch_rows(signature, tensors) or 1)
        return out

    def predict_batched(self, version, signature, tensors):
        """An asyncio future of a batchable request's outputs (the event loop waits on the
        batcher directly: no worker thread blocked per request)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def done(task):
            loop.call_soon_threadsafe(_settle, future, task)

        self.batcher.enqueue(version, signature, tensors, on_done=done)
        return future

    def recommend(self, version, body):
        """Our endpoint beside TF Serving's: top-k for a user from the user's cached state
        and new events (see docs/serving.md)."""
        if not version.recommender:
            raise RequestError(400, "this model is not an export of recops-tf train: it has no "
                               ":recommend (use :predict)")
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        extra = set(body) - {"user_id", "items", "timestamps", "history", "k", "exclude_seen",
                             "candidates"}
        if extra:
            raise RequestError(400, f"unknown fields in the body: {sorted(extra)}")
        # Everything is checked before the user's cache entry is touched (validation.py).
        user = body.get("user_id")
        key = validation.user_key(user)
        budget = Budget(self.options.max_request_elements)
        items = validation.item_ids(version, body.get("items", []), "items", budget)
        stamps = (None if body.get("timestamps") is None else  # None: given a time below
                  validation.timestamps(body["timestamps"], len(items), "timestamps"))
        history = body.get("history")
        if history is not None:
            if not isinstance(history, dict) or set(history) - {"items", "timestamps"}:
                raise RequestError(400, "'history' must be an object with 'items' and "
                                   "'timestamps'")
            past = validation.item_ids(version, history.get("items", []), "history.items",
                                       budget)
            past_ts = (None if history.get("timestamps") is None else validation.timestamps(
                history["timestamps"], len(past), "history.timestamps"))
            history = past, past_ts
        k = body.get("k", 10)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= version.info[
                "num_items"]:
            raise RequestError(400, f"'k' must be an integer in 1..{version.info['num_items']}")
        exclude = body.get("exclude_seen", False)
        if not isinstance(exclude, bool):
            raise RequestError(400, "'exclude_seen' must be true or false")
        candidates = body.get("candidates")
        if candidates is not None:
            values = candidates
            candidates = validation.item_ids(version, candidates, "candidates", budget)
            if not len(candidates):
                raise RequestError(400, "'candidates' is empty")
            validation.distinct(candidates, values, "candidates")
        try:
            return self._recommend(version, key, user, items, stamps, history, k, exclude,
                                   candidates)
        except tf.errors.InvalidArgumentError as e:
            raise RequestError(400, op_error(e)) from None

    def _recommend(self, version, key, user, items, stamps, history, k, exclude, candidates):
        cache, window = version.cache, version.info["max_seq_len"]
        entry, hit = cache.user(key)
        try:
            return self._answer(version, cache, entry, hit, key, user, items, stamps, history,
                                k, exclude, candidates, window)
        finally:
            cache.release(entry, drop_empty=True)  # a refused new user leaves nothing
            self.metrics.cache_bytes.set(cache.bytes_used)

    def _answer(self, version, cache, entry, hit, key, user, items, stamps, history, k,
                exclude, candidates, window):
        with entry.lock:
            kept = entry.items, entry.timestamps, entry.state
            try:
                hit, top, scores, length = self._rank(version, cache, entry, hit, user, key,
                                                      items, stamps, history, k, exclude,
                                                      candidates, window)
            except BaseException:
                if entry.items is not kept[0]:  # refused once the entry changed: back as it
                    entry.items, entry.timestamps, entry.state = kept  # was, its rows
                    cache.reset(entry)  # encoded again by the next request
                    cache.account(entry)
                raise
        self.metrics.cache.labels("hit" if hit else "miss").inc()
        names = version.names
        return {"items": [names[i - 1] if names else int(i) for i in top],
                "scores": [float(s) for s in scores], "history_length": length,
                "cache": ("hit" if hit else "miss") if cache.num_pages else "off",
                "model_version": str(version.number)}

    def _rank(self, version, cache, entry, hit, user, key, items, stamps, history, k, exclude,
              candidates, window):
        """``(hit, items, scores, history length)`` of a request, `entry`'s lock held."""
        hit = hit and len(entry.items) > 0
        if stamps is None:  # a second apart, ending now, after the user's last event
            end = int(time.time())
            if hit:  # the last event is within +-2**61 (validation.MAX_TIMESTAMP), or implied
                # after such: far from int64's end
                end = max(end, int(entry.timestamps[-1]) + len(items))
            stamps = _implied(len(items), end)
        if not hit and history is not None:
            past, past_ts = history
            if past_ts is None:  # a second apart, ending before the new events
                past_ts = _implied(len(past), int(stamps[0]) - 1 if len(stamps) else
                                   int(time.time()))
            items, stamps = np.concatenate([past, items]), np.concatenate([past_ts, stamps])
        if not len(entry.items) and not len(items):
            raise RequestError(400, f"user {validation.shown(user)} has no history here: give "
                               "'items' (or 'history') for a new or evicted user")
        state = self._encode(version, cache, entry, key, items, stamps, window)
        seen = tf.constant(entry.items, tf.int64)
        if candidates is None:
            out = version.functions["top_k"](tf.constant(state), seen,
                                             tf.constant(k, tf.int32), tf.constant(exclude))
            top, scores = out["items"].numpy(), out["scores"].numpy()
        else:
            scores = version.functions["score_items"](
                tf.constant(state), seen, tf.constant(candidates))["scores"].numpy()
            if exclude:
                scores = np.where(np.isin(candidates, entry.items), -np.inf, scores)
            order = np.argsort(-scores, kind="stable")[:k]
            top, scores = candidates[order], scores[order]
        return hit, top, scores, len(entry.items)

    def _encode(self, version, cache, entry, key, items, stamps, window):
        """The user's state after `items` (new events) appended to the cached ones; updates
        the entry. With a key/value pool: the new events against the cached rows (re-encoding
        the last `window` events when the history outgrows the window or rows were evicted);
        without: the whole history again."""
        all_items = np.concatenate([entry.items, np.asarray(items, np.int64)])
        all_stamps = np.concatenate([entry.timestamps, np.asarray(stamps, np.int64)])
        if len(all_stamps) > 1 and np.any(np.diff(all_stamps[-window:]) < 0):
            raise RequestError(400, "timestamps must not decrease (oldest event first)")
        if not len(items) and entry.state is not None:
            return entry.state
        # Copies of the window (a slice would keep the whole request's arrays alive).
        entry.items, entry.timestamps = all_items[-window:].copy(), all_stamps[-window:].copy()
        if not cache.num_pages:
            entry.state = version.functions["user_state"](
                tf.constant(entry.items, tf.int64),
                tf.constant(entry.timestamps, tf.int64))["state"].numpy()
            cache.account(entry)
            return entry.state
        incremental = entry.length and entry.length + len(items) == len(entry.items) and \
            len(all_items) <= window
        if incremental:
            new_items, new_stamps = entry.items[entry.length:], entry.timestamps[entry.length:]
            past, past_ts = cache.rows(entry), entry.timestamps[:entry.length]
        else:
            cache.reset(entry)
            new_items, new_stamps = entry.items, entry.timestamps
            past, past_ts = cache.rows(entry), entry.timestamps[:0]
        # A few new events of a cached user: the cache read in place, no branch (the
        # single-threaded executor); a history encoded at once: the tiled kernel's way.
        name = "extend_in_place" if incremental and len(new_items) <= EXTEND_IN_PLACE and \
            "extend_in_place" in version.functions else "extend"
        out = version.functions[name](tf.constant(new_items, tf.int64),
                                      tf.constant(new_stamps, tf.int64), _shared(past),
                                      tf.constant(past_ts, tf.int64))
        cache.append(key, entry, out["rows"].numpy())  # evictions counted by the cache
        entry.state = out["state"].numpy()
        cache.account(entry)
        return entry.state


def _shared(array):
    """`array` as a tensor: shared with TF through DLPack (no copy) when it is large,
    C-contiguous and aligned as TF's kernels need (`ALIGN` bytes), as a user's cache rows are
    (``UserCache.rows``, a fresh aligned gather of the pool's pages: 1,000 rows of 200 float32
    cost 0.17 ms to copy into a tensor here, 1 us to share); else copied."""
    if (array.nbytes >= 1 << 16 and array.flags.c_contiguous
            and array.ctypes.data % ALIGN == 0):
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except (AttributeError, BufferError, TypeError, ValueError,
                tf.errors.InvalidArgumentError):
            pass  # a dtype DLPack does not carry (bfloat16 in some versions): copy
    return tf.constant(array)


def _settle(future, task):
    if future.cancelled():
        return
    if task.error is not None:
        future.set_exception(task.error)
    else:
        future.set_result(task.result)


def _implied(n, end):
    """The timestamps of `n` events given none: a second apart, the last at `end`."""
    return np.arange(end - n + 1, end + 1, dtype=np.int64)


# -- REST ----------------------------------------------------------------------------------
def _json(body, status=200):
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(status, message):
    return _json({"error": message}, status)


# The answer to an internal error (REST's 500, gRPC's INTERNAL); what went wrong is logged.
INTERNAL_ERROR = "internal error (the server log has its details)"

# A :predict request (REST body, gRPC message) up to this size is parsed on the event loop when
# batching is on (a few rows: tens of microseconds); a larger one is large (below).
INLINE_BYTES = 16 << 10
# A request is *large* when its body (REST) or message (gRPC) is over INLINE_BYTES, or its
# tensors hold (or a TensorProto declares) over LARGE_ELEMENTS values. A large request never
# joins a batch (its cost would be every request's of its batch: a 3 MB :predict of 300,000
# items costs 60 ms batched with 8 small ones, which alone cost 0.7 ms) and is decoded, parsed
# and run on the large requests' lane, its own threads (``Options.large_threads``, 1): large
# requests wait for each other there, never in front of small ones, and none of their work is
# on the event loop. 8,192 values: what 16 KiB of JSON ("1," a value) can hold.
LARGE_ELEMENTS = 8192


def large(tensors):
    """Whether `tensors` (name -> np.ndarray) hold over LARGE_ELEMENTS values."""
    return sum(v.size for v in tensors.values()) > LARGE_ELEMENTS


def _declared(request):
    """Whether a PredictRequest's TensorProtos declare over LARGE_ELEMENTS values (their
    shapes, before anything is built; validation refuses what is over the request limit)."""
    total = 0
    for proto in request.inputs.values():
        size = 1
        for dim in proto.tensor_shape.dim:
            size *= max(dim.size, 0)
            if size > LARGE_ELEMENTS:
                return True
        total += size
        if total > LARGE_ELEMENTS:
            return True
    return False


def _loads(raw):
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise RequestError(400, f"malformed JSON: {e}") from None


def rest_app(server, executor, connections=None, lane=None):
    """The aiohttp application of TF Serving's REST API, ``:recommend``, metrics and health.
    Large requests (``LARGE_ELEMENTS``) run on `lane` (an executor; default `executor`).

    ``connections()``, if given, counts the REST server's open connections. A small request on
    the only one, with no other request in flight on either API, is answered on the event loop:
    no other request can be waiting for it (HTTP/1.1 asks one at a time on a connection; a new
    connection waits at most this one call), and the two thread hand-offs of a batch or worker
    thread (0.1-0.15 ms) are saved. Under load there are other connections: batches as before.
    """
    opts = server.options
    active = [0]  # REST :predict and :recommend requests being handled

    def lone(predicting):
        """This request (a :predict if `predicting`) alone in the server, on its only REST
        connection."""
        return connections is not None and active[0] == 1 and \
            server._in_flight == int(predicting) and connections() == 1

    lane = lane or executor

    async def run(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    async def on_lane(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(lane, fn, *args)

    def version_of(request):
        v = request.match_info.get("version")
        return validation.version_number(v) if v is not None else None

    async def body_of(request):
        """The request's body, bytes; all of it within ``read_timeout`` seconds of its headers
        (else 408, and the connection is closed)."""
        try:
            async with asyncio.timeout(opts.read_timeout):
                return await request.read()
        except TimeoutError:
            raise RequestError(408, f"the body did not arrive within {opts.read_timeout:g} s "
                               "of the request's headers (--read-timeout)") from None
        except web.HTTPException:  # 413: answered by the error middleware
            raise
        except aiohttp.web_protocol.RequestPayloadError:  # e.g. gzip declared, not sent
            encoding = request.headers.get("Content-Encoding", "")
            raise RequestError(400, f"the body does not decode as its Content-Encoding "
                               f"{validation.shown(encoding)} says") from None

    async def status(request):
        versions = await run(server.status, request.match_info["name"], version_of(request))
        return _json({"model_version_status": [
            {"version": str(v), "state": s.state, "status": {"error_code": s.error_code,
                                                             "error_message": s.error_message}}
            for v, s in versions]})

    async def metadata(request):
        version, defs = await run(server.metadata, request.match_info["name"],
                                  version_of(request))
        return _json({
            "model_spec": {"name": opts.model_name, "signature_name": "",
                           "version": str(version.number)},
            "metadata": {"signature_def": {"signature_def": {
                k: json_format.MessageToDict(v, preserving_proto_field_name=True)
                for k, v in defs.items()}}}})

    async def predict(request):
        raw = await body_of(request)
        body = None

        def parse():
            nonlocal body
            if body is None:
                body = _loads(raw)
            version = server.model(request.match_info["name"], version_of(request))
            name = body.get("signature_name") if isinstance(body, dict) else None
            if name is not None and not isinstance(name, str):
                raise RequestError(400, "'signature_name' must be a string")
            signature = version.signature(name)
            return (version, signature) + request_tensors(body, signature,
                                                          opts.max_request_elements)

        def work():
            version, signature, tensors, rows = parse()
            return response_body(server.predict(version, signature, tensors), rows)

        def alone(version, signature, tensors, rows):
            return response_body(server.predict(version, signature, tensors, batch=False), rows)

        async def inline():
            version, signature, tensors, rows = parse()
            return response_body(server.predict(version, signature, tensors, batch=False), rows)

        async def batched():
            # A small request is parsed on the event loop and waits for its batch there; a
            # large one, or one that cannot join a batch, runs on a worker thread.
            version, signature, tensors, rows = parse()
            if not server.batchable(signature, tensors):
                return await (on_lane if large(tensors) else run)(alone, version, signature,
                                                                  tensors, rows)
            return response_body(await server.predict_batched(version, signature, tensors),
                                 rows)

        server.predicting(+1)
        active[0] += 1
        try:
            small = len(raw) <= INLINE_BYTES
            if not small:
                answer = await on_lane(work)  # never batched: over LARGE_ELEMENTS values, or
                # a batch of few values in many bytes (rare)
            elif lone(True):
                answer = await inline()
            elif small and server.batcher is not None:
                answer = await batched()
            else:  # small, no batching
                answer = await run(work)
            return _json(answer)
        finally:
            active[0] -= 1
            server.predicting(-1)

    async def recommend(request):
        raw = await body_of(request)

        def work():
            body = _loads(raw)
            version = server.model(request.match_info["name"], version_of(request))
            return server.recommend(version, body)

        async def inline():
            return work()

        active[0] += 1
        try:
            if len(raw) > INLINE_BYTES:
                return _json(await on_lane(work))
            if lone(False):
                return _json(await inline())
            return _json(await run(work))
        finally:
            active[0] -= 1

    async def metrics(request):
        return web.Response(body=prom.generate_latest(server.metrics.registry),
                            headers={"Content-Type": prom.CONTENT_TYPE_LATEST})

    async def health(request):
        if server.ready:
            return _json({"status": "ready"})
        return _error(503, "not ready")

    apis = {status: "rest_status", metadata: "rest_metadata", predict: "rest_predict",
            recommend: "rest_recommend", metrics: "rest_metrics", health: "rest_health"}

    @web.middleware
    async def counted(request, handler):
        """The one place a REST request is counted and timed: around every other step (the
        route's match, a 404 or 405 without one, the body's read and size limit, its parse,
        the model), with the status of the answer sent. ``api`` is the route's (rest_other:
        no route for the path or the method); a request whose client went away before its
        answer counts as 499 (nginx's "client closed request")."""
        began = time.perf_counter()
        status = "499"
        try:
            response = await handler(request)
            status = str(response.status)
            return response
        finally:
            api = apis.get(request.match_info.handler, "rest_other")
            server.metrics.requests.labels(api, status).inc()
            server.metrics.latency.labels(api).observe(time.perf_counter() - began)

    @web.middleware
    async def errors(request, handler):
        """Every error as ``{"error": "one line"}`` with its status; an internal error's
        details only in the server log."""
        try:
            return await handler(request)
        except RequestError as e:
            response = _error(e.status, e.message)
            if e.status == 408:  # the rest of a late body is not waited for
                response.force_close()
            return response
        except web.HTTPException as e:  # 404 no route, 405, 413 too large, ...
            return _error(e.status, e.reason if e.status != 413 else
                          f"the request is larger than {opts.max_request_bytes} bytes")
        except Exception:  # noqa: BLE001  (an answer, never a dead server)
            log.exception("internal error answering %s %s", request.method, request.path[:200])
            return _error(500, INTERNAL_ERROR)

    app = web.Application(middlewares=[counted, errors], client_max_size=opts.max_request_bytes)
    # Any version text reaches version_of, which answers 404 for what is not a version (5,000
    # digits, "³", "١": \d matches them all).
    name, ver = r"{name:[^/:]+}", r"/versions/{version:[^/:]+}"
    for prefix in (f"/v1/models/{name}", f"/v1/models/{name}{ver}"):
        app.router.add_get(prefix, status)
        app.router.add_get(prefix + "/metadata", metadata)
        app.router.add_post(prefix + ":predict", predict)
        app.router.add_post(prefix + ":recommend", recommend)
    app.router.add_get("/monitoring/prometheus/metrics", metrics)
    app.router.add_get("/healthz", health)
    return app


class _JsonErrorHandler(aiohttp.web_protocol.RequestHandler):
    """aiohttp's connection handler, whose own answers to what never reaches the application
    (an HTTP request it cannot parse, a Content-Encoding it cannot decode, a header too long)
    are ``{"error": "one line"}`` as every other error, not aiohttp's plain text; with

    * a header read timeout: a request's headers must arrive within ``read_timeout`` seconds
      of their first byte, else 408 ``{"error": ...}`` and the connection is closed (an idle
      keep-alive connection, no byte of a request sent, is aiohttp's keep-alive timeout's);
    * a drain that answers what it began: at shutdown (``_JsonErrors.pre_shutdown``) an idle
      connection is closed at once, while one in the middle of a request (a byte of its
      headers received, its body being read, its handler running) goes on reading it, answers
      it with ``Connection: close`` and closes; it is waited for up to ``read_timeout`` (the
      read's own bound) plus the drain's timeout. aiohttp's own shutdown stops reading such a
      connection at once: an upload in progress would get no answer (issue 54, case 14)."""
    __slots__ = ("_began", "_header_timer", "_draining", "_read_timeout")

    def data_received(self, data):
        count = self._request_count
        super().data_received(data)
        if not data or self._force_close or self._close:
            return
        if self._request_count != count:  # a request's headers are complete
            self._began = False
            self._cancel_header_timer()
        elif not (self._began or self._request_in_progress or self._messages
                  or self._payload_parser is not None):
            self._began = True  # the first bytes of a request's headers
            self._header_timer = self._loop.call_later(self._read_timeout, self._headers_late)

    def _cancel_header_timer(self):
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self):
        self._header_timer = None
        if (not self._began or self._request_in_progress or self._messages
                or self.transport is None or self._force_close):
            return
        body = orjson.dumps({"error": f"the request's headers did not arrive within "
                                      f"{self._read_timeout:g} s of their first byte "
                                      "(--read-timeout)"})
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json"
                             b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                             % len(body) + body)
        on_late = getattr(self._manager, "on_header_timeout", None)
        if on_late is not None:
            on_late()
        self.force_close()  # the transport flushes the answer, then closes

    async def finish_response(self, request, resp, start_time):
        self._began = False  # what came before this answer was this request's
        self._cancel_header_timer()
        if self._draining:
            resp.force_close()  # Connection: close, and the connection ends after it
        return await super().finish_response(request, resp, start_time)

    def drain(self):
        """At shutdown: closes an idle connection; lets one in the middle of a request read
        it to its end and answer it, then close."""
        if self._began or self._request_in_progress or self._messages:
            self._draining = True
        else:
            self.close()

    async def shutdown(self, timeout=15.0):
        task = self._task_handler
        if self._draining and task is not None and not task.done():
            try:
                async with asyncio.timeout(self._read_timeout + (timeout or 0)):
                    await asyncio.shield(task)
            except (TimeoutError, asyncio.CancelledError):
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
        await super().shutdown(timeout)

    def connection_lost(self, exc):
        self._cancel_header_timer()
        super().connection_lost(exc)

    def log_exception(self, *args, **kw):
        """aiohttp's log of an error, but a client's one line at DEBUG: a request its parser
        refused (answered 400 by ``handle_error``), or the unread rest of a body that does not
        decode as its Content-Encoding says (read and dropped after a 404 or 405); aiohttp
        logs each with its traceback at ERROR, a traceback on stderr per bad request."""
        error = kw.get("exc_info")
        if isinstance(error, (aiohttp.http_exceptions.BadHttpMessage,
                              aiohttp.web_protocol.RequestPayloadError)):
            lines = str(error).strip().splitlines()
            self.logger.debug("a client's bad HTTP request: %s",
                              lines[0][:200] if lines else type(error).__name__)
            return
        super().log_exception(*args, **kw)

    def handle_error(self, request, status=500, exc=None, message=None):
        super().handle_error(request, status, exc, message)  # its log; raises once an answer
        if status >= 500:  # began
            text = INTERNAL_ERROR
        else:
            lines = [line.strip() for line in str(message or getattr(exc, "message", "")
                                                  or "").splitlines() if line.strip()]
            line = re.sub(r"[:.]?\s*b['\"].*$", "", lines[0]).rstrip(":. ") if lines else ""
            text = "bad HTTP request" + (f": {line}"[:300] if line else "")  # not its bytes
        response = _error(status, text)
        response.force_close()
        return response


class _JsonErrors(web.Server):
    """aiohttp's server with ``_JsonErrorHandler``s (``read_timeout`` and
    ``on_header_timeout`` set by ``Running``)."""
    read_timeout = 30.0
    on_header_timeout = None

    def __call__(self):
        handler = _JsonErrorHandler(self, loop=self._loop, **self._kwargs)
        handler._began, handler._header_timer, handler._draining = False, None, False
        handler._read_timeout = self.read_timeout
        return handler

    def pre_shutdown(self):
        for conn in list(self._connections):
            conn.drain()


# -- gRPC ----------------------------------------------------------------------------------
def grpc_server(server, address, executor, lane=None):
    """A ``grpc.aio`` server with TF Serving's PredictionService and ModelService, to start on
    the REST server's event loop; ``(server, port)``. A batchable Predict waits for its batch
    on the loop; a large one (``LARGE_ELEMENTS``) is decoded, parsed and run on `lane` (an
    executor; default `executor`); every other request runs on `executor`."""
    opts = server.options
    lane = lane or executor

    def served(api, message, behaviour):
        """The one place a gRPC request is decoded, answered and counted: `behaviour`
        (``async (request) -> response``, raising RequestError for a bad request) on the
        request decoded here from its bytes (undecodable bytes: INVALID_ARGUMENT); counted
        with the status code sent (``OK``, ``INVALID_ARGUMENT``, ..., ``CANCELLED`` when the
        client went away)."""
        async def handle(raw, context):
            began = time.perf_counter()
            code, details = grpc.StatusCode.CANCELLED, ""
            try:
                request = (decode(message, raw) if len(raw) <= INLINE_BYTES else  # large: off
                           await on_lane(lambda: decode(message, raw)))  # the event loop
                response = await behaviour(request)
                code = grpc.StatusCode.OK
                return response
            except RequestError as e:
                code, details = _GRPC_CODES.get(e.status, grpc.StatusCode.INTERNAL), e.message
            except Exception:  # noqa: BLE001  (an answer, never a dead server)
                log.exception("internal error answering gRPC %s", api)
                code, details = grpc.StatusCode.INTERNAL, INTERNAL_ERROR
            finally:
                server.metrics.requests.labels(api, code.name).inc()
                server.metrics.latency.labels(api).observe(time.perf_counter() - began)
            await context.abort(code, details)
        return handle

    def decode(message, raw):
        try:
            return message.FromString(raw)
        except Exception:  # noqa: BLE001  (protobuf's DecodeError, and kin)
            raise RequestError(400, f"the request is not a {message.DESCRIPTOR.full_name} "
                               "(its bytes do not decode)") from None

    def in_executor(fn):
        return asyncio.get_running_loop().run_in_executor(executor, fn)

    def on_lane(fn):
        return asyncio.get_running_loop().run_in_executor(lane, fn)

    def spec_version(spec):
        return spec.version.value if spec.HasField("version") else None

    async def predict(request):
        server.predicting(+1)
        try:
            return await predict_work(request)
        finally:
            server.predicting(-1)

    def parse(request):
        version = server.model(request.model_spec.name, spec_version(request.model_spec))
        signature = version.signature(request.model_spec.signature_name)
        given = set(request.inputs)
        if given != set(signature.inputs):
            signature.check(dict.fromkeys(given))  # names what is missing or unexpected
        budget = Budget(opts.max_request_elements)  # every input's declared size, counted
        tensors = {k: validation.proto_tensor(v, signature.inputs[k][0], k, budget)  # first
                   for k, v in request.inputs.items()}
        signature.check(tensors)
        return version, signature, tensors

    async def predict_work(request):
        # As REST's: a small batchable request is parsed on the event loop and waits for its
        # batch there; a large one (in bytes or in the values its shapes declare) is parsed
        # and run alone on the large requests' lane; any other on a worker thread.
        def work():
            version, signature, tensors = parse(request)
            return version, signature, server.predict(version, signature, tensors)

        if request.ByteSize() > INLINE_BYTES or _declared(request):
            version, signature, outputs = await on_lane(work)
        elif server.batcher is not None:
            version, signature, tensors = parse(request)
            if server.batchable(signature, tensors):
                outputs = await server.predict_batched(version, signature, tensors)
            else:
                outputs = await in_executor(lambda: server.predict(version, signature, tensors))
        else:
            version, signature, outputs = await in_executor(work)
        wanted = set(request.output_filter) or set(outputs)
        unknown = wanted - set(outputs)
        if unknown:
            raise RequestError(400, f"output_filter names unknown outputs {sorted(unknown)}")
        response = _apis.PredictResponse()
        response.model_spec.name = opts.model_name
        response.model_spec.version.value = version.number
        response.model_spec.signature_name = signature.name
        for key in wanted:
            response.outputs[key].CopyFrom(tf.make_tensor_proto(outputs[key]))
        return response

    async def get_model_metadata(request):
        def work():
            version, defs = server.metadata(request.model_spec.name,
                                            spec_version(request.model_spec))
            if list(request.metadata_field) != ["signature_def"]:
                raise RequestError(400, "metadata_field must be ['signature_def']")
            response = _apis.GetModelMetadataResponse()
            response.model_spec.name = opts.model_name
            response.model_spec.version.value = version.number
            sigs = _apis.SignatureDefMap()
            for k, v in defs.items():
                sigs.signature_def[k].CopyFrom(v)
            response.metadata["signature_def"].Pack(sigs)
            return response
        return await in_executor(work)

    async def get_model_status(request):
        def work():
            response = _apis.GetModelStatusResponse()
            for number, state in server.status(request.model_spec.name,
                                               spec_version(request.model_spec)):
                status = response.model_version_status.add()
                status.version = number
                status.state = _apis.ModelVersionStatus.State.Value(state.state)
                status.status.error_code = error_codes_pb2.Code.Value(state.error_code)
                status.status.error_message = state.error_message
            return response
        return await in_executor(work)

    g = grpc.aio.server(options=[("grpc.max_receive_message_length", opts.max_request_bytes)])
    _apis.add_services(g, served("grpc_predict", _apis.PredictRequest, predict),
                       served("grpc_metadata", _apis.GetModelMetadataRequest,
                              get_model_metadata),
                       served("grpc_status", _apis.GetModelStatusRequest, get_model_status),
                       raw=True)
    port = g.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return g, port


def _set_threads(intra, inter):
    """TensorFlow's thread pools, before the first model is loaded (RuntimeError once TF's
    context is initialized with other values: the flags of a second server in one process)."""
    for value, get, put in ((intra, tf.config.threading.get_intra_op_parallelism_threads,
                             tf.config.threading.set_intra_op_parallelism_threads),
                            (inter, tf.config.threading.get_inter_op_parallelism_threads,
                             tf.config.threading.set_inter_op_parallelism_threads)):
        if value and get() != value:
            put(value)


def _log_to_stderr():
    """The server's log (logger ``recops_tf.serving``: versions found, loaded, failed with
    their errors; a failed look at the model directory; internal errors with their
    tracebacks) on stderr, from INFO up, unless the process has set up logging itself."""
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)


def _new_loop():
    """uvloop's event loop where it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


# -- the process ---------------------------------------------------------------------------
class Running:
    """A started server (``start``): its ports, and ``stop()``."""

    def __init__(self, options, announce=print):
        self.options = options
        _log_to_stderr()
        _set_threads(options.intra_op_threads, options.inter_op_threads)
        self.server = ModelServer(options)
        self.executor = concurrent.futures.ThreadPoolExecutor(options.workers)
        self.lane = concurrent.futures.ThreadPoolExecutor(  # the large requests' (LARGE_ELEMENTS)
            options.large_threads, thread_name_prefix="recops-large")
        self.loop = _new_loop()
        self.rest_port = self.grpc_port = None
        self.grpc = None
        if options.grpc_port >= 0:
            async def make():  # grpc.aio binds the server to the running loop
                return grpc_server(self.server, f"{options.host}:{options.grpc_port}",
                                   self.executor, self.lane)
            self.grpc, self.grpc_port = self.loop.run_until_complete(make())
            self.loop.run_until_complete(self.grpc.start())
        self.runner = None
        if options.rest_port >= 0:
            app = rest_app(self.server, self.executor,
                           connections=lambda: len(self.runner.server.connections),
                           lane=self.lane)
            self.runner = web.AppRunner(app,
                                        shutdown_timeout=options.drain_seconds,
                                        access_log=None, handle_signals=False)
            self.loop.run_until_complete(self.runner.setup())
            self.runner.server.__class__ = _JsonErrors  # aiohttp's own errors in JSON too
            self.runner.server.read_timeout = options.read_timeout
            self.runner.server.on_header_timeout = self.server.metrics.requests.labels(
                "rest_other", "408").inc
            site = web.TCPSite(self.runner, options.host, options.rest_port)
            self.loop.run_until_complete(site.start())
            self.rest_port = site._server.sockets[0].getsockname()[1]
        self.poller = threading.Thread(target=self.server.poll_forever, daemon=True)
        self.poller.start()
        version = self.server.versions.get()
        announce(f"serving model '{options.model_name}' version {version.number} "
                 f"({version.path}); REST on {options.host}:{self.rest_port}, gRPC on "
                 f"{options.host}:{self.grpc_port}", flush=True)

    def serve_forever(self):
        """Runs until SIGTERM or SIGINT, then drains: no new connections, idle ones closed,
        requests begun (REST: a byte of them received, a body still being read; gRPC: calls
        started) read to their end and answered (at most ``read_timeout`` +
        ``drain_seconds``)."""
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, stop.set)
        self.loop.run_until_complete(stop.wait())
        self.stop()

    def stop(self):
        self.server.ready = False
        async def drain():  # both at once: requests in flight answered, new ones refused
            drains = []
            if self.grpc is not None:
                drains.append(self.grpc.stop(self.options.drain_seconds))
            if self.runner is not None:
                drains.append(self.runner.cleanup())
            await asyncio.gather(*drains)

        self.loop.run_until_complete(drain())
        self.server.close()
        self.executor.shutdown(wait=True)
        self.lane.shutdown(wait=True)
        self.loop.close()
