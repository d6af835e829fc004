"""A seeded random driver that feeds the library's raw ops (the generated wrappers of the
.so, not the public functions, so no Python check hides a kernel hole) malformed and
boundary inputs, built from each op's OpDef:

- tensors of wrong and right ranks and dtypes, empty and odd-sized dimensions;
- integers at -1, 0, small, at int32's bounds and far beyond (offsets that decrease, overflow
  or do not end at the row count; indices below, at and past their bound);
- floats with NaN and Inf;
- attributes inside and outside their ranges;
- resource inputs that are the right resource, the wrong kind of resource, or a variable of
  the wrong dtype or shape.

Each case must end in a TensorFlow error or a result: a crash kills the process and a hang
trips the caller's timeout. Run as ``python -m recops_tf.testing.drivers.fuzz STEM CASES
SEED``: it writes each case's description to ``RECOPS_FUZZ_LOG`` (when set) before running it,
so a crash names its case, and prints a JSON summary (cases, outcomes by error type).
"""
import collections
import json
import math
import os
import sys
import time

import numpy as np

INTS = (-(2 ** 62), -(2 ** 31), -2, -1, 0, 1, 2, 3, 4, 5, 7, 8, 16, 2 ** 31 - 1, 2 ** 31,
        2 ** 40)
FLOATS = (-1.0, 0.0, 0.5, 1.0, 2.0, 1e30, -1e30, math.nan, math.inf, -math.inf)
DIMS = (0, 1, 2, 3, 4, 5, 8)


class Fuzzer:
    def __init__(self, seed):
        import tensorflow as tf

        from recops_tf import _loader

        self.tf = tf
        self.rng = np.random.default_rng(seed)
        self.lib = _loader.load()
        self.ops = {op.name: op for op in self.lib.OP_LIST.op}
        self.functions = {}
        for name in dir(self.lib):
            if name.startswith("recops_") and not name.endswith("_eager_fallback"):
                self.functions[name.replace("_", "")] = getattr(self.lib, name)
        self._resources = None

    def function_of(self, op_name):
        key = op_name.replace(">", "").replace("_", "").lower()
        return self.functions[key]

    # --- values ------------------------------------------------------------------------------

    def shape(self):
        rank = int(self.rng.choice([0, 1, 1, 2, 2, 2, 3, 3, 4]))
        dims = [int(self.rng.choice(DIMS)) for _ in range(rank)]
        if self.rng.random() < 0.03 and dims:  # one big dimension (kept small in total)
            dims[int(self.rng.integers(len(dims)))] = int(self.rng.choice([64, 300, 1025]))
        while dims and np.prod(dims) > 4096:
            dims[int(np.argmax(dims))] //= 2
        return dims

    def tensor(self, dtype):
        tf, rng = self.tf, self.rng
        shape = self.shape()
        size = int(np.prod(shape)) if shape else 1
        if dtype.is_integer:
            style = rng.random()
            if style < 0.35:  # increasing: sometimes valid offsets
                values = np.cumsum(rng.integers(0, 4, size=size)) - (rng.random() < 0.2)
            elif style < 0.8:
                values = rng.integers(-2, 10, size=size)
            else:
                values = rng.choice(INTS, size=size)
            info = np.iinfo(dtype.as_numpy_dtype)
            values = np.clip(values, info.min, info.max)
            return tf.constant(values.astype(dtype.as_numpy_dtype).reshape(shape))
        if dtype == tf.bool:
            return tf.constant(rng.random(size=shape) < 0.5)
        if dtype == tf.string:
            return tf.constant(np.array(["x"] * size, dtype=object).reshape(shape))
        if dtype.is_floating:
            values = rng.standard_normal(size)
            if rng.random() < 0.2:
                values[rng.random(size) < 0.2] = rng.choice(FLOATS)
            return tf.cast(tf.constant(values.reshape(shape)), dtype)
        return tf.zeros(shape, dtype)

    def resources(self):
        """Live resources of every kind the ops take (made once per fuzzer)."""
        if self._resources is None:
            tf = self.tf
            table = self.function_of("Recops>DynamicEmbeddingTable")(dim=3, num_slots=2)
            addresses = self.function_of("Recops>DynamicEmbeddingLookupAddresses")(
                table, tf.constant([1, 2, 3], tf.int64), True)
            self._addresses = addresses
            self._resources = {
                "var": tf.Variable(np.zeros((6, 3), np.float32)),
                "var_other": tf.Variable(np.zeros((5, 2), np.float32)),
                "var_f64": tf.Variable(np.zeros((6, 3))),
                "table": table,
                "table_noslots": self.function_of("Recops>DynamicEmbeddingTable")(dim=3),
                "channel": self.function_of("Recops>HostChannel")(capacity=2),
            }
        return self._resources

    def resource(self):
        res = self.resources()
        key = self.rng.choice(sorted(res))
        value = res[key]
        handle = value.handle if hasattr(value, "handle") else value
        return key, handle

    def attr(self, attr):
        rng = self.rng
        tf = self.tf
        allowed = list(attr.allowed_values.list.type) or list(attr.allowed_values.list.s)
        if attr.type == "type":
            choices = [tf.as_dtype(t) for t in attr.allowed_values.list.type] or [tf.float32]
            if rng.random() < 0.1:
                choices = [tf.int8, tf.complex64, tf.string]
            return choices[int(rng.integers(len(choices)))]
        if attr.type == "int":
            if attr.name in ("N",):
                return int(rng.choice([0, 1, 2, 3, 6, 7]))
            return int(rng.choice(INTS[2:14] if rng.random() < 0.8 else INTS))
        if attr.type == "float":
            if attr.name == "timeout_seconds":
                return float(rng.choice([0.0, 0.001, -1.0, math.nan, math.inf]))
            return float(rng.choice(FLOATS if rng.random() < 0.4 else (0.0, 0.1, 0.5, 0.9)))
        if attr.type == "bool":
            return bool(rng.random() < 0.5)
        if attr.type == "string":
            if allowed:
                options = [a.decode() for a in allowed] + ["bogus"]
            else:
                options = {"initializer": ["uniform", "normal", "zeros", "constant",
                                           "truncated_normal", "bogus"],
                           "mask_type": ["causal", "none", "custom", "window", "bogus", ""],
                           "pos_att_type": ["c2p", "p2c", "c2p|p2c", "bogus", ""],
                           "shared_name": ["", "fuzz_channel"]}.get(attr.name, ["", "x"])
            return str(rng.choice(options))
        if attr.type == "list(int)":
            return [int(v) for v in rng.choice(INTS[2:12], size=int(rng.integers(0, 4)))]
        raise NotImplementedError(attr.type)

    # --- one case ------------------------------------------------------------------------------

    def case(self, op_name):
        """(description, thunk) of one random call of the raw op."""
        op = self.ops[op_name]
        tf = self.tf
        attrs, described = {}, {}
        inferred = {a.name for arg in op.input_arg for a in op.attr
                    if a.name in (arg.type_attr, arg.number_attr, arg.type_list_attr)}
        type_choice = {}
        for attr in op.attr:
            if attr.type == "type":
                type_choice[attr.name] = self.attr(attr)
            elif attr.name == "N":
                type_choice["N"] = self.attr(attr)
        for attr in op.attr:
            if attr.name in inferred:
                continue
            if attr.type == "type":
                attrs[attr.name] = type_choice[attr.name]
            else:
                attrs[attr.name] = self.attr(attr)
            described[attr.name] = repr(attrs[attr.name])
        inputs = {}
        for arg in op.input_arg:
            if arg.type == tf.resource.as_datatype_enum:
                count = type_choice.get(arg.number_attr, 1) if arg.number_attr else 1
                picks = [self.resource() for _ in range(count)]
                described[arg.name] = [p[0] for p in picks]
                value = [p[1] for p in picks] if arg.number_attr else picks[0][1]
            else:
                dtype = (tf.as_dtype(arg.type) if arg.type else
                         type_choice.get(arg.type_attr, tf.float32))
                if arg.name in ("address", "addresses") and self.rng.random() < 0.5:
                    self.resources()
                    base = self._addresses.numpy()
                    value = tf.constant(self.rng.choice(
                        np.concatenate([base, base + 1, base * 3, [0, -1, 2 ** 62]]),
                        size=int(self.rng.integers(0, 6))), tf.int64)
                else:
                    value = self.tensor(dtype)
                described[arg.name] = f"{value.dtype.name}{list(value.shape)}"
            inputs[arg.name] = value
        function = self.function_of(op_name)
        return f"{op_name} {json.dumps(described)}", lambda: function(**inputs, **attrs)


def run(op_names, cases, seed, log_path=None):
    """Runs `cases` random calls spread over `op_names`; returns the summary dict."""
    import tensorflow as tf

    fuzzer = Fuzzer(seed)
    outcomes = collections.Counter()
    log = open(log_path, "w") if log_path else None
    start = time.perf_counter()
    for i in range(cases):
        op_name = op_names[i % len(op_names)]
        try:
            description, thunk = fuzzer.case(op_name)
        except (TypeError, ValueError) as e:  # an input the wrapper cannot even build
            outcomes[f"build:{type(e).__name__}"] += 1
            continue
        if log:
            log.write(f"{i} {description}\n")
            log.flush()
        try:
            thunk()
            outcomes["ok"] += 1
        except tf.errors.OpError as e:
            outcomes[type(e).__name__] += 1
        except (TypeError, ValueError) as e:  # rejected by TF while building the op
            outcomes[f"python:{type(e).__name__}"] += 1
    if log:
        log.close()
    return {"cases": cases, "ops": list(op_names), "seed": seed,
            "seconds": time.perf_counter() - start, "outcomes": dict(outcomes)}


def stem_ops(stem):
    from recops_tf import _ops_table

    return [f"Recops>{name}" for name in _ops_table.BY_STEM[stem].tf_ops]


def main(argv):
    stem, cases, seed = argv[0], int(argv[1]), int(argv[2])
    summary = run(stem_ops(stem), cases, seed, os.environ.get("RECOPS_FUZZ_LOG"))
    summary["stem"] = stem
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
