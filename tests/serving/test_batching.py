"""The batcher's wait (recops_tf/serving/batching.py), with a stand-in signature whose call
takes a fixed time: closed-loop clients come back into full batches."""
import threading
import time
import types

import numpy as np

from recops_tf.serving import batching

# Long enough that a loaded CI machine's thread wake-ups (tens of ms at a load of 8) stay inside
# the batcher's wait for returning clients (a quarter of a call: 50 ms).
CALL_SECONDS = 0.2
CLIENTS, ROUNDS = 8, 6


class _Signature:
    name, batchable = "serving_default", True

    def __init__(self):
        self.batches = []

    def __call__(self, tensors):
        self.batches.append(len(tensors["x"]))
        time.sleep(CALL_SECONDS)
        return {"y": tensors["x"] * 2}


def _closed_loop(clients, turnaround):
    """`clients` threads each sending ROUNDS requests, the next `turnaround` seconds after an
    answer; the batch sizes the signature saw."""
    signature, version = _Signature(), types.SimpleNamespace(pad_value=None)
    in_flight, lock = [0], threading.Lock()
    batcher = batching.Batcher(max_batch_size=clients, batch_timeout_micros=1000,
                               num_batch_threads=1, in_flight=lambda: in_flight[0])

    def client(c):
        for r in range(ROUNDS):
            with lock:
                in_flight[0] += 1
            x = np.array([[c * 100 + r]], np.int64)
            out = batcher.submit(version, signature, {"x": x})
            with lock:
                in_flight[0] -= 1
            assert out["y"].tolist() == [[2 * (c * 100 + r)]]  # its own row back
            time.sleep(turnaround)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    return signature.batches


def test_answered_clients_come_back_into_full_batches():
    # The clients need 3 ms to send again, more than the 1 ms timeout but within a quarter
    # of the 200 ms call: each batch after the first waits for all of them. (Stopping as soon
    # as every request in flight is taken would send the first comer alone and split the
    # clients into alternating batches of 1 and 7.) The first batch takes whoever has
    # started.
    batches = _closed_loop(CLIENTS, 0.003)
    assert sum(batches) == CLIENTS * ROUNDS
    assert np.mean(batches[1:]) >= 0.75 * CLIENTS, batches


def test_a_lone_client_does_not_wait(monkeypatch):
    # A batch as large as the last one (here 1 row) stops as soon as everything in flight is
    # in it: one client's requests run at once, one a call. With the wait for returning
    # clients made 100 calls long, a request that waited would take 4 s.
    monkeypatch.setattr(batching, "RETURN_SHARE", 100.0)
    began = time.monotonic()
    batches = _closed_loop(1, 0.0)
    assert batches == [1] * ROUNDS
    assert time.monotonic() - began < 2.0
