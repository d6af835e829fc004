"""The served model's versions, laid out as TF Serving lays them out, and calls of their
signatures.

``--model DIR`` may be:

* TF Serving's layout: ``DIR/1``, ``DIR/2``, ... each a SavedModel, or each a directory that
  ``recops-tf train --out`` wrote (its SavedModel in ``saved_model/``);
* one SavedModel (``DIR/saved_model.pb``) or one ``recops-tf train --out`` directory: version 1.

The newest version is served (TF Serving's "latest" policy). ``Versions.poll`` (a thread of the
server, every ``poll_seconds``) loads a new version before it replaces the old one, so no
request finds no model; a request holds its ``Version`` to its end, so requests in flight finish
on the version they started on, and the old one is freed after them.
"""
import json
import os
import re
import threading

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

import recops_tf  # noqa: F401  (registers the ops' kernels before a SavedModel loads)

SINGLE_THREADED = "SINGLE_THREADED_EXECUTOR"
# Ops that TF lowers to Switch / Merge inside a function, which its single-threaded executor
# refuses.
_BRANCHES = frozenset({"If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase",
                       "Switch", "Merge", "Enter", "Exit", "NextIteration"})


class RequestError(Exception):
    """A bad request: ``status`` (400, 404, 413, ...) and a one-line message."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


def op_error(error):
    """The one-line reason of a model's InvalidArgumentError (its assertion's message)."""
    text = error.message
    found = re.search(r"assertion failed: \[([^\]]*)\]", text)
    if found:
        return found.group(1)
    lines = [line.strip() for line in text.splitlines()
             if line.strip() and not line.startswith(("Graph execution error", "Detected at"))]
    return re.sub(r"\s*\[\[\{\{node.*", "", lines[-1] if lines else text)


def _savedmodel_dir(path):
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return path
    inner = os.path.join(path, "saved_model")
    if os.path.isfile(os.path.join(inner, "saved_model.pb")):
        return inner
    return None


def discover(base):
    """``{version: SavedModel dir}`` under `base` (see the module docstring)."""
    found = {}
    for name in os.listdir(base):
        if name.isdigit() and int(name) > 0:
            d = _savedmodel_dir(os.path.join(base, name))
            if d:
                found[int(name)] = d
    if not found and _savedmodel_dir(base):
        found[1] = _savedmodel_dir(base)
    return found


def _has_branches(fn):
    graph = fn.graph.as_graph_def()
    ops = {n.op for n in graph.node}
    for f in graph.library.function:
        ops.update(n.op for n in f.node_def)
    return bool(ops & _BRANCHES)


class Call:
    """A loaded concrete function, called as cheaply as TF allows: its inputs passed flat in
    the function's order (``fn(**inputs)`` binds them to its signature first, about 0.1-0.15
    ms a call on the 2-core Xeon, as much as a small model's ops), and, when the function has
    no branch (``tf.cond`` / ``while``), on TF's single-threaded executor: its ops run inline
    in the calling thread instead of being handed to the inter-op pool one by one (kernels
    that split their work, the matmuls and recops_tf's, still use the intra-op pool). Inputs
    must be tensors of the function's dtypes and shapes (the server checks requests first).
    Falls back to the plain call where this TensorFlow lacks the flat path."""

    def __init__(self, fn):
        self.fn = fn
        self.keywords = getattr(fn, "_arg_keywords", None)
        self.flat = self.keywords is not None and hasattr(fn, "_call_flat")
        self.executor = SINGLE_THREADED if self.flat and not _has_branches(fn) else ""

    def __call__(self, *args, **kwargs):
        if not self.flat:
            return self.fn(*args, **kwargs)
        inputs = list(args) + [kwargs[k] for k in self.keywords[len(args):]]
        options = context.context().function_call_options
        before, options.executor_type = options.executor_type, self.executor
        try:
            return self.fn._call_flat(inputs, self.fn.captured_inputs)
        except (tf.errors.FailedPreconditionError, tf.errors.UnimplementedError) as e:
            if not self.executor or "executor" not in e.message.lower():
                raise
            self.executor = ""  # an op the single-threaded executor does not take: the default
            options.executor_type = ""
            return self.fn._call_flat(inputs, self.fn.captured_inputs)
        finally:
            options.executor_type = before


class Signature:
    """A signature's inputs and outputs (name -> (tf.DType, shape list, None unknown)) and
    whether TF Serving-style batching (along dimension 0) applies to it."""

    def __init__(self, name, fn):
        self.name, self.fn = name, Call(fn)
        args = fn.structured_input_signature[1]
        self.inputs = {k: (s.dtype, s.shape.as_list() if s.shape.rank is not None else None)
                       for k, s in args.items()}
        self.outputs = {k: (s.dtype, s.shape.as_list() if s.shape.rank is not None else None)
                        for k, s in fn.structured_outputs.items()}
        specs = list(self.inputs.values()) + list(self.outputs.values())
        self.batchable = all(shape and shape[0] is None for _, shape in specs)

    def check(self, tensors):
        """Raises RequestError(400) unless `tensors` (name -> np.ndarray) match the inputs."""
        missing = sorted(set(self.inputs) - set(tensors))
        extra = sorted(set(tensors) - set(self.inputs))
        if missing or extra:
            raise RequestError(400, f"signature '{self.name}' takes inputs {sorted(self.inputs)}"
                               f"; missing {missing}, unexpected {extra}")
        for key, (dtype, shape) in self.inputs.items():
            value = tensors[key]
            if shape is not None and (value.ndim != len(shape) or any(
                    want is not None and want != got for want, got in zip(shape, value.shape))):
                raise RequestError(400, f"input '{key}' has shape {list(value.shape)}; the "
                                   f"signature wants {['?' if d is None else d for d in shape]}")
            if value.dtype != dtype.as_numpy_dtype:
                raise RequestError(400, f"input '{key}' is {value.dtype}; the signature wants "
                                   f"{dtype.name}")

    def __call__(self, tensors):
        try:
            out = self.fn(**{k: tf.constant(v) for k, v in tensors.items()})
        except tf.errors.InvalidArgumentError as e:
            raise RequestError(400, op_error(e)) from None
        return {k: v.numpy() for k, v in out.items()}


class Version:
    """One loaded version: its signatures and, for an export of ``recops-tf train``, its
    catalogue (``items.txt``), ``info.json`` and the user-state functions."""

    def __init__(self, number, path):
        self.number, self.path = number, path
        self.module = tf.saved_model.load(path)
        self.signatures = {name: Signature(name, fn)
                           for name, fn in self.module.signatures.items()}
        home = os.path.dirname(os.path.abspath(path)) if os.path.basename(
            os.path.abspath(path)) == "saved_model" else None
        self.info, self.names, self.index = {}, None, None
        if home and os.path.isfile(os.path.join(home, "info.json")):
            with open(os.path.join(home, "info.json")) as f:
                self.info = json.load(f)
            names_file = os.path.join(home, "items.txt")
            if os.path.isfile(names_file):
                with open(names_file) as f:
                    self.names = [line.rstrip("\n") for line in f]
                self.index = {n: i + 1 for i, n in enumerate(self.names)}
        self.recommender = bool(self.info) and hasattr(self.module, "top_k")
        self.cacheable = self.recommender and hasattr(self.module, "extend")
        # The user-state functions as concrete functions (a call skips the restored function's
        # argument matching, about 0.1-0.2 ms a call here), called as `Call` calls them.
        # ``extend_in_place``, where the export has it, is ``extend`` without its branch.
        self.functions = {name: Call(getattr(self.module, name).get_concrete_function())
                          for name in ("top_k", "score_items", "user_state", "extend",
                                       "extend_in_place")
                          if self.recommender and hasattr(self.module, name)}
        self.pad_value = 0 if self.recommender else None  # 0: padding of an export's histories
        self.cache = None  # the user-state cache of this version (the server sets it)

    def signature(self, name):
        name = name or "serving_default"
        if name not in self.signatures:
            raise RequestError(400, f"signature '{name}' not found; the model has "
                               f"{sorted(self.signatures)}")
        return self.signatures[name]

    def metadata(self):
        """The SignatureDefMap of this version (a proto, as TF Serving's metadata answer)."""
        from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
        sm = saved_model_pb2.SavedModel()
        with open(os.path.join(self.path, "saved_model.pb"), "rb") as f:
            sm.ParseFromString(f.read())
        defs = meta_graph_pb2.MetaGraphDef().signature_def
        defs.MergeFrom(sm.meta_graphs[0].signature_def)
        return {k: defs[k] for k in sorted(defs) if not k.startswith("__")}

    def item_ids(self, values, what):
        """Item names (or ids, without a catalogue) -> ids in 1..num_items; RequestError(400)."""
        if not isinstance(values, list):
            raise RequestError(400, f"'{what}' must be a list of items")
        if self.index is not None:
            ids = [self.index.get(str(v)) for v in values]
            bad = [v for v, i in zip(values, ids) if i is None]
        else:
            ids = [v if isinstance(v, int) and 1 <= v <= self.info.get("num_items", 0) else None
                   for v in values]
            bad = [v for v, i in zip(values, ids) if i is None]
        if bad:
            raise RequestError(400, f"'{what}': items not in the model's catalogue: {bad[:5]}")
        return np.asarray(ids, np.int64)


class Versions:
    """The versions of one model under `base`; the newest serves."""

    def __init__(self, base, on_load=None):
        if not os.path.isdir(base):
            raise FileNotFoundError(f"--model {base}: no such directory")
        self.base, self.on_load = base, on_load
        self.loaded = {}
        self.lock = threading.Lock()
        self.errors = {}
        if not self.poll():
            raise FileNotFoundError(f"--model {base}: no SavedModel in it nor in numbered "
                                    "version directories (1, 2, ...)")

    def poll(self):
        """Loads a newer version if one appeared (and unloads those that vanished); returns
        True when a version is available."""
        found = discover(self.base)
        newest = max(found) if found else None
        if newest is not None and newest not in self.loaded and newest not in self.errors:
            try:
                version = Version(newest, found[newest])
            except Exception as e:  # a broken version: keep serving the previous one
                self.errors[newest] = f"{type(e).__name__}: {e}"
            else:
                if self.on_load:
                    self.on_load(version)
                with self.lock:
                    self.loaded = {newest: version}  # the old one lives while requests use it
        with self.lock:
            return bool(self.loaded)

    def get(self, number=None):
        with self.lock:
            if not self.loaded:
                raise RequestError(503, "no version of the model is loaded")
            if number is None:
                return self.loaded[max(self.loaded)]
            if number not in self.loaded:
                raise RequestError(404, f"version {number} of the model is not served "
                                   f"(served: {sorted(self.loaded)})")
            return self.loaded[number]
