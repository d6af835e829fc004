"""The served model's versions, laid out as TF Serving lays them out, and calls of their
signatures.

``--model DIR`` may be:

* TF Serving's layout: ``DIR/1``, ``DIR/2``, ... each a SavedModel, or each a directory that
  ``recops-tf train --out`` wrote (its SavedModel in ``saved_model/``);
* one SavedModel (``DIR/saved_model.pb``) or one ``recops-tf train --out`` directory: version 1.

A version is a directory named by ASCII digits. The newest version that loads is served (TF
Serving's "latest" policy). ``Versions.poll`` (a thread of the server, every ``poll_seconds``)
loads a new version once its directory has stopped changing, before it replaces the old one, so
no request finds no model; a request holds its ``Version`` to its end, so requests in flight
finish on the version they started on, and the old one is freed after them. A version that
fails to load shows its error in ``Versions.status`` and is tried again when its directory
changes.
"""
import dataclasses
import json
import logging
import os
import re
import threading

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import error_codes_pb2
from tensorflow.python.eager import context

import recops_tf  # noqa: F401  (registers the ops' kernels before a SavedModel loads)

log = logging.getLogger("recops_tf.serving")

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


def version_number(name):
    """The version a directory name stands for, or None: ASCII digits only (``str.isdigit``
    also takes "³" and "٣", which ``int`` refuses or reads as 3), 1..2**63-1 (TF Serving's
    versions are int64)."""
    if not _VERSION_NAME.fullmatch(name):
        return None
    number = int(name)
    return number if 0 < number < 1 << 63 else None


_VERSION_NAME = re.compile(r"[0-9]{1,19}")


def discover(base):
    """``{version: its directory}`` under `base` (see the module docstring): every directory
    named by a version number, complete or not; or ``{1: base}`` when there is none and `base`
    is itself a SavedModel (or a ``train --out`` directory). Raises OSError when `base` cannot
    be listed."""
    found = {}
    with os.scandir(base) as entries:
        for entry in entries:
            number = version_number(entry.name)
            try:
                if number is not None and entry.is_dir():
                    found[number] = entry.path
            except OSError:  # gone meanwhile
                pass
    if not found and _savedmodel_dir(base):
        found[1] = base
    return found


def tree(path):
    """What a copy in progress changes: ``(relative path, size, mtime in ns)`` of every file
    and directory under `path`, sorted (symbolic links followed for their sizes and times,
    not descended into); ``()`` when `path` cannot be read."""
    entries = []
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:  # gone meanwhile: the next look sees a changed tree
                st = None
            entries.append((os.path.relpath(full, path), st.st_size if st else -1,
                            st.st_mtime_ns if st else -1))
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (("", st.st_size, st.st_mtime_ns),) + tuple(sorted(entries))


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

    def warm_up(self):
        """Calls every signature and user-state function once with a tiny valid input (each
        unknown dimension 1, every value 1: an item id, a timestamp, a ``k``; strings empty),
        as requests call them (``Call``), so that TensorFlow's first-call work (the function's
        instantiation and graph optimisation, 1.7-7.8 s on a 2-core Xeon) is done before the
        version is served rather than in its first requests. Returns ``[(name, one line)]`` of
        the calls that failed (a model may refuse such an input: its other calls are still
        made, and the version is served)."""
        failed = []
        calls = [(name, lambda s=sig: s({k: _tiny(d, shape) for k, (d, shape) in
                                         s.inputs.items()}))
                 for name, sig in sorted(self.signatures.items())]
        calls += [(name, lambda c=call: c(*[tf.constant(_tiny(
                      spec.dtype, spec.shape.as_list() if spec.shape.rank is not None else []))
                      for spec in c.fn.structured_input_signature[0]]))
                  for name, call in sorted(self.functions.items())]
        for name, call in calls:
            try:
                call()
            except Exception as e:  # noqa: BLE001  (a warm-up is best effort)
                lines = [line for line in str(getattr(e, "message", e)).splitlines() if line]
                failed.append((name, f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]))
        return failed

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


def _tiny(dtype, shape):
    """A tiny valid-looking value of `dtype` (tf.DType) and `shape` (None: unknown, 1)."""
    shape = [1 if d is None else d for d in shape or []]
    dtype = tf.as_dtype(dtype)
    if dtype == tf.string:
        return np.full(shape, b"", dtype=object)
    return np.ones(shape, dtype.as_numpy_dtype)


def _load_error(error):
    """``(TF Serving's error code name, one line)`` of a failed load."""
    if isinstance(error, tf.errors.OpError):
        code = error_codes_pb2.Code.Name(error.error_code)
        text = error.message
    else:
        code = "NOT_FOUND" if isinstance(error, FileNotFoundError) else "UNKNOWN"
        text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else ""
    line = f"{type(error).__name__}: {line}" if line else type(error).__name__
    return code, line if len(line) <= 500 else line[:497] + "..."


@dataclasses.dataclass
class VersionState:
    """One version's state as TF Serving reports it (``ModelVersionStatus``): ``START`` seen,
    waiting for its directory to stop changing; ``LOADING``; ``AVAILABLE`` served; ``END``
    unloaded (``error_code`` OK) or failed to load (the error). ``tree``: the directory as
    last seen (``models.tree``); ``failed_tree``: as it was when its load failed (a load is
    tried again once it differs)."""
    state: str = "START"
    error_code: str = "OK"
    error_message: str = ""
    tree: tuple = None
    failed_tree: tuple = None


class Versions:
    """The versions of one model under `base`; the newest that loads serves.

    ``poll`` (the server calls it every ``poll_seconds``) loads a version only once its
    directory has stopped changing: its tree (``models.tree``: every file's path, size and
    modification time) the same at two polls in a row, and again after the load (else the
    load is dropped and waits for the next quiet poll), so a version copied in place file by
    file is not loaded half-written. A version that fails to load keeps its error in its state
    (``status``) and in the log, and is tried again when its directory changes (a version
    replaced or completed is loaded); the one served before stays. At start every version is
    taken as it is, from the newest down to the first that loads."""

    def __init__(self, base, on_load=None):
        if not os.path.isdir(base):
            raise FileNotFoundError(f"--model {base}: no such directory")
        self.base, self.on_load = base, on_load
        self.loaded = {}
        self.lock = threading.Lock()
        self.states = {}  # version -> VersionState, for those the server has looked at
        if not self.poll(settled=True):
            failed = {n: s.error_message for n, s in self.states.items() if s.failed_tree}
            raise FileNotFoundError(
                f"--model {base}: no SavedModel in it nor in numbered version directories "
                "(1, 2, ...)" + "".join(f"; version {n} failed to load: {m}"
                                        for n, m in sorted(failed.items(), reverse=True)))

    def poll(self, settled=False):
        """Loads the newest version newer than the one served whose directory has stopped
        changing (`settled`: take every directory as it is now), trying older ones when it
        fails; returns True when a version is available. Raises OSError when `base` cannot be
        listed (the server logs it and polls again)."""
        found = discover(self.base)
        with self.lock:
            served = max(self.loaded) if self.loaded else None
        for number in list(self.states):  # versions gone from the disk are forgotten
            if number not in found and number != served:
                del self.states[number]
        for number in sorted(found, reverse=True):
            if served is not None and number <= served:
                break
            path = found[number]
            now = tree(path)
            state = self.states.setdefault(number, VersionState())
            if state.failed_tree is not None and now == state.failed_tree:
                continue  # failed as it is: tried again once it changes
            if not settled and now != state.tree:
                if state.failed_tree is not None:
                    log.info("version %d (%s) changed since its failed load: loading it once "
                             "it stops changing", number, path)
                elif state.tree is None:
                    log.info("version %d (%s) found: loading it once it stops changing",
                             number, path)
                self.states[number] = VersionState(tree=now)
                continue
            if self._load(number, path, now):
                break
        with self.lock:
            return bool(self.loaded)

    def _load(self, number, path, before):
        """Loads version `number` from `path` (whose tree was `before`) and serves it; False
        when it failed (its state says why) or its directory changed meanwhile."""
        state = self.states[number]
        state.state, state.tree = "LOADING", before
        log.info("loading version %d (%s)", number, path)
        try:
            saved = _savedmodel_dir(path)
            if saved is None:
                raise FileNotFoundError(f"no saved_model.pb in {path} nor in "
                                        f"{os.path.join(path, 'saved_model')}")
            version = Version(number, saved)
            after = tree(path)
            if after != before:
                log.info("version %d (%s) changed while it loaded: loading it again once it "
                         "stops changing", number, path)
                self.states[number] = VersionState(tree=after)
                return False
            if self.on_load:
                self.on_load(version)
        except Exception as e:  # noqa: BLE001  (a broken version: keep serving the last one)
            code, message = _load_error(e)
            self.states[number] = VersionState("END", code, message, before, before)
            log.error("version %d (%s) failed to load: %s (tried again when its directory "
                      "changes)", number, path, message)
            log.debug("the failed load of version %d", number, exc_info=True)
            return False
        with self.lock:
            old, self.loaded = self.loaded, {number: version}  # the old one lives while
            # requests use it
        self.states[number] = VersionState("AVAILABLE", tree=before)
        for n in old:
            if n in self.states:
                self.states[n] = VersionState("END", tree=self.states[n].tree)
        log.info("serving version %d (%s)%s", number, path,
                 f" in place of version {max(old)}" if old else "")
        return True

    def status(self, number=None):
        """``[(version, VersionState)]``, newest first, of every version the server has looked
        at (or of `number`; RequestError(404) if it has not)."""
        states = dict(self.states)
        if number is not None:
            if number not in states:
                raise RequestError(404, self._unknown(number))
            return [(number, states[number])]
        return sorted(states.items(), reverse=True)

    def _unknown(self, number):
        with self.lock:
            served = sorted(self.loaded)
        state = self.states.get(number)
        if state is None:
            why = "its directory was not found"
        elif state.failed_tree is not None:
            why = f"its load failed: {state.error_message}"
        elif state.state == "END":
            why = "it was replaced by a newer version"
        else:
            why = "it is waiting for its directory to stop changing"
        return f"version {number} of the model is not served ({why}; served: {served})"

    def get(self, number=None):
        with self.lock:
            if not self.loaded:
                raise RequestError(503, "no version of the model is loaded")
            if number is None:
                return self.loaded[max(self.loaded)]
            if number in self.loaded:
                return self.loaded[number]
        raise RequestError(404, self._unknown(number))
