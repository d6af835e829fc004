"""Dynamic batching of concurrent requests into one model call, as TF Serving's batching
(``max_batch_size``, ``batch_timeout_micros``, ``num_batch_threads``, ``max_enqueued_batches``,
``pad_variable_length_inputs``).

A request of a batchable signature (every input and output has an unknown leading dimension)
waits at most ``batch_timeout_micros`` for others of the same version and signature; their
inputs are concatenated along dimension 0 (rows of different lengths padded at the end with the
version's pad value, 0 for an export of ``recops-tf train``, whose histories are 0-padded; other
models batch only requests of equal shapes), the signature runs once, and the outputs are split
back. A request larger than ``max_batch_size`` rows runs alone.

How long a batch waits. It stops waiting early when every request the server is handling is in
it (no one else can come), unless the clients of the batch just answered may still come back:
while the batch holds fewer rows than that last batch and the last answer is recent, it waits
for them. The wait is ``batch_timeout_micros`` or ``RETURN_SHARE`` of the last call's time,
whichever is longer: for a heavy call (a large catalogue), a few milliseconds of waiting
fill a batch that the call serves at about the cost of a small one. Measured on 2 Xeon cores,
16 closed-loop REST clients, one batch thread, 1,000,000 items: a mean batch of 15.4 rows and
3.8x the unbatched throughput, against 8.4 rows and 2.3x without this wait.
"""
import queue
import threading
import time

import numpy as np

from recops_tf.serving.models import RequestError


class _Task:
    __slots__ = ("version", "signature", "tensors", "rows", "done", "result", "error",
                 "on_done")

    def __init__(self, version, signature, tensors, on_done=None):
        self.version, self.signature, self.tensors = version, signature, tensors
        self.rows = len(next(iter(tensors.values()))) if tensors else 0
        self.done = threading.Event()
        self.result = self.error = None
        self.on_done = on_done  # called with the task once answered (from a batch thread)


def batch_rows(signature, tensors):
    """Rows of a request if it can join a batch (all inputs of one leading size), else None."""
    if not signature.batchable or not tensors:
        return None
    sizes = {v.shape[0] if v.ndim else None for v in tensors.values()}
    return sizes.pop() if len(sizes) == 1 and None not in sizes else None


def _merge(tasks, pad):
    """The tasks' inputs stacked along dimension 0, each padded at the end of the other
    dimensions with `pad` to the largest (one allocation per input: np.pad per part cost more
    than the model call saves on small batches)."""
    out = {}
    for key in tasks[0].tensors:
        parts = [t.tensors[key] for t in tasks]
        if pad is None:
            out[key] = np.concatenate(parts)
            continue
        shape = np.max([p.shape for p in parts], axis=0)
        merged = np.full((sum(len(p) for p in parts),) + tuple(
            int(w) for w in shape[1:]), pad, parts[0].dtype)
        row = 0
        for p in parts:
            merged[(slice(row, row + len(p)),) + tuple(slice(0, w) for w in p.shape[1:])] = p
            row += len(p)
        out[key] = merged
    return out


RETURN_SHARE = 0.25  # of the last call's time: the longest wait for a batch to fill


class Batcher:
    """``submit(version, signature, tensors)`` answers like ``signature(tensors)``, from a
    batch. ``on_batch(size)`` is told each batch's rows (metrics)."""

    def __init__(self, max_batch_size=32, batch_timeout_micros=1000, num_batch_threads=1,
                 max_enqueued_batches=100, on_batch=None, in_flight=None):
        self.max_batch_size = int(max_batch_size)
        self.timeout = batch_timeout_micros / 1e6
        self.queue = queue.Queue(maxsize=max(1, int(max_enqueued_batches) * self.max_batch_size))
        self.on_batch = on_batch
        # Requests the server is handling now (parsing, queued or running): a batch stops
        # waiting when every one of them is taken (no one else can come before the timeout),
        # so a lone request is not delayed.
        self.in_flight = in_flight
        self.taken = 0  # tasks taken by the batch threads, not answered yet
        # The last batch: when it was answered, its call's seconds and its rows (see the
        # module's docstring: a batch smaller than it waits for its clients to come back).
        self.answered_at, self.call_seconds, self.answered_rows = float("-inf"), 0.0, 0
        self.count_lock = threading.Lock()
        self.threads = [threading.Thread(target=self._work, daemon=True, name=f"batch-{i}")
                        for i in range(int(num_batch_threads))]
        for t in self.threads:
            t.start()

    def submit(self, version, signature, tensors):
        task = self.enqueue(version, signature, tensors)
        task.done.wait()
        if task.error is not None:
            raise task.error
        return task.result

    def enqueue(self, version, signature, tensors, on_done=None):
        """Queues a request without waiting: ``on_done(task)`` is called from a batch thread
        once ``task.result`` (or ``task.error``) is set (``task.done`` is set too)."""
        task = _Task(version, signature, tensors, on_done)
        try:
            self.queue.put_nowait(task)
        except queue.Full:
            raise RequestError(503, "the batching queue is full; retry later") from None
        return task

    def close(self):
        for _ in self.threads:
            self.queue.put(None)
        for t in self.threads:
            t.join()

    def _work(self):
        while True:
            first = self.queue.get()
            if first is None:
                return
            tasks, rows = [first], first.rows
            with self.count_lock:
                self.taken += 1
            wait = max(self.timeout, RETURN_SHARE * self.call_seconds)
            deadline = time.monotonic() + wait
            while rows < self.max_batch_size:
                now = time.monotonic()
                left = deadline - now
                if left <= 0 or (self.in_flight is not None and self.in_flight() <= self.taken
                                 and (rows >= self.answered_rows
                                      or now - self.answered_at > wait)):
                    break
                try:
                    task = self.queue.get(timeout=left)
                except queue.Empty:
                    break
                if task is None:
                    self.queue.put(None)
                    break
                with self.count_lock:
                    self.taken += 1
                if rows + task.rows > self.max_batch_size:
                    self._run([task])  # would overflow the batch: its own call
                    with self.count_lock:
                        self.taken -= 1
                    continue
                tasks.append(task)
                rows += task.rows
            groups = {}
            for task in tasks:
                pad = task.version.pad_value
                shapes = None if pad is not None else tuple(
                    (k, v.shape[1:], v.dtype.str) for k, v in sorted(task.tensors.items()))
                groups.setdefault((id(task.version), task.signature.name, shapes),
                                  []).append(task)
            for group in groups.values():
                self._run(group)
            with self.count_lock:
                self.taken -= len(tasks)

    def _run(self, tasks):
        began = time.monotonic()
        try:
            if len(tasks) == 1:
                outputs = [tasks[0].signature(tasks[0].tensors)]
            else:
                merged = tasks[0].signature(_merge(tasks, tasks[0].version.pad_value))
                total = sum(t.rows for t in tasks)
                if any(v.ndim == 0 or v.shape[0] != total for v in merged.values()):
                    outputs = [t.signature(t.tensors) for t in tasks]  # not row-wise
                else:
                    cuts = np.cumsum([t.rows for t in tasks])[:-1]
                    split = {k: np.split(v, cuts) for k, v in merged.items()}
                    outputs = [{k: split[k][i] for k in split} for i in range(len(tasks))]
            if self.on_batch:
                self.on_batch(sum(t.rows for t in tasks))
            for task, out in zip(tasks, outputs):
                task.result = out
        except RequestError as e:
            if len(tasks) > 1:  # one bad request must not fail the others: answer each alone
                for task in tasks:
                    self._run([task])
                return
            tasks[0].error = e
        except Exception as e:  # noqa: BLE001  (reported to the request, never a dead thread)
            for task in tasks:
                task.error = RequestError(500, f"{type(e).__name__}: {e}")
        self.answered_at = time.monotonic()
        self.call_seconds = self.answered_at - began
        self.answered_rows = sum(t.rows for t in tasks)
        for task in tasks:
            task.done.set()
            if task.on_done is not None:
                try:
                    task.on_done(task)
                except Exception:  # noqa: BLE001  (its waiter is gone, e.g. a closed loop)
                    pass
