"""SavedModel export of Keras models with ragged inputs: ``recops_tf.saving.export``.

Keras 3's ``model.export()`` gives a ragged ``keras.Input`` a dense ``TensorSpec`` endpoint
and refuses a ``tf.RaggedTensorSpec`` input signature; the recops_tf sequence layers refuse
the dense input of unknown length such an endpoint feeds them (its padding would be attended).
``export`` writes the model with its ragged inputs ragged, plus a serving signature in plain
tensors for TF Serving.
"""
import re

import keras
import tensorflow as tf

__all__ = ["export"]

SERVE = "serve"
SERVING_DEFAULT = "serving_default"


def export(model, filepath, input_signature=None, *, verbose=False):
    """Writes a SavedModel of ``model``'s inference (``model(x, training=False)``) in which
    ragged inputs stay ragged.

    The SavedModel holds:

    * ``serve``, a ``tf.function`` taking the model's inputs as ``model`` takes them (ragged
      ones as ``tf.RaggedTensor``) and returning its outputs: from Python,
      ``tf.saved_model.load(filepath).serve(x)`` gives what ``model.predict(x)`` gives;
    * the signature ``serving_default`` (TF Serving, ``saved_model_cli``): plain tensors only.
      A ragged input ``name`` becomes ``name_values`` (its flat values, ``[T, ...]``) and
      ``name_row_lengths`` (``[B]``; with ragged_rank r > 1, ``name_row_lengths_1`` ...
      ``name_row_lengths_r``, outermost first); a dense input keeps its name. Outputs
      likewise: ``output_0`` for a dense one (dict outputs keep their keys), ``output_0_values``
      and ``output_0_row_lengths`` for a ragged one. The row lengths are checked against the
      values (``InvalidArgumentError`` when they do not add up).

    Input names: the keys of a dict input, else the ``keras.Input(name=...)`` (or
    ``tf.TensorSpec`` name) when one was given, else ``inputs`` (one input) or ``input_<i>``.

    Args:
      model: a built Keras model (a functional one's inputs give the signature; another must
        have been called, and needs ``input_signature``).
      filepath: the SavedModel directory to write.
      input_signature: as ``model.export``'s: a list with one entry per positional argument of
        ``model(...)`` (usually one: the input, or a list or dict of inputs), but entries may
        be ``tf.RaggedTensorSpec``. A single spec is taken as ``[spec]``. Default (functional
        models): each ``keras.Input``, a ragged one as ``tf.RaggedTensorSpec([None, None,
        ...], ragged_rank=1, row_splits_dtype=tf.int64)``.
      verbose: print the endpoints written.

    Returns:
      ``filepath``.

    Raises:
      TypeError: ``model`` not a ``keras.Model``.
      ValueError: a model that is not built, no ``input_signature`` for a non-functional
        model, sparse inputs, two inputs or outputs with one signature name.

    Loading in a new process needs ``import recops_tf`` before ``tf.saved_model.load`` (it
    registers the ops' kernels). Variables and tables (``DynamicEmbedding``) used by the
    model are saved with it.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"export needs a keras.Model, got {type(model).__name__}")
    if not model.built:
        raise ValueError("export: the model is not built; call it on a batch first")
    names = None
    if input_signature is None:
        inputs = _functional_inputs(model)
        input_signature = [tf.nest.map_structure(_spec_of_keras_tensor, inputs)]
        names = [_keras_name(x) for x in tf.nest.flatten(inputs)]
    elif isinstance(input_signature, (tf.TensorSpec, tf.RaggedTensorSpec, dict)):
        input_signature = [input_signature]
    input_signature = list(input_signature)
    flat_specs = tf.nest.flatten(input_signature)
    if names is None:
        names = [getattr(s, "name", None) for s in flat_specs]
    input_names = _leaf_names(input_signature[0] if len(input_signature) == 1
                              else input_signature, names, "input", single="inputs")

    def call(*args):
        return model(*args, training=False)

    serve = tf.function(call, input_signature=input_signature, autograph=False,
                        jit_compile=False)
    # Per input leaf: (its plain-tensor specs in the signature, the function rebuilding it).
    flat_inputs = [_flat_input(name, spec) for name, spec in zip(input_names, flat_specs)]
    signature = [s for specs, _ in flat_inputs for s in specs]
    _check_unique([s.name for s in signature], "input")

    def serve_flat(*tensors):
        leaves, at = [], 0
        for specs, rebuild in flat_inputs:
            leaves.append(rebuild(tensors[at:at + len(specs)]))
            at += len(specs)
        outputs = serve(*tf.nest.pack_sequence_as(input_signature, leaves))
        return _flat_outputs(outputs)

    serve_flat = tf.function(serve_flat, input_signature=signature, autograph=False,
                             jit_compile=False)
    root = tracked_root(model)
    setattr(root, SERVE, serve)
    setattr(root, SERVING_DEFAULT, serve_flat)
    concrete = serve_flat.get_concrete_function()
    tf.saved_model.save(root, filepath, signatures={SERVING_DEFAULT: concrete})
    if verbose:
        print(f"Saved '{filepath}':\n* function '{SERVE}': {input_signature}\n"
              f"* signature '{SERVING_DEFAULT}': inputs {[s.name for s in signature]}, "
              f"outputs {sorted(concrete.structured_outputs)}")
    return filepath


def tracked_root(model):
    """A ``tf.Module`` to save functions of ``model`` from: what they capture is reachable
    from it, the model's variables (as ``keras.export.ExportArchive`` tracks them) and the TF
    resources its layers own (``DynamicEmbedding`` tables)."""
    root = tf.Module()
    root.model_variables = list(model.variables)
    root.model_resources = [t for t in tf.train.TrackableView(model).descendants()
                            if isinstance(t, tf.saved_model.experimental.TrackableResource)]
    return root


def _functional_inputs(model):
    """The ``keras.Input`` structure of a functional (or Sequential) model."""
    try:
        inputs = model.input
    except (AttributeError, ValueError):
        inputs = None
    if not all(isinstance(x, keras.KerasTensor) for x in tf.nest.flatten(inputs)):
        raise ValueError("export: pass input_signature for a model that is not functional "
                         "(a functional model's keras.Input's give the default)")
    return inputs


def _spec_of_keras_tensor(x):
    shape = (None,) + tuple(x.shape[1:])
    if getattr(x, "sparse", False):
        raise ValueError(f"export: sparse inputs are not supported (input {x.name})")
    if getattr(x, "ragged", False):
        return tf.RaggedTensorSpec((None, None) + shape[2:], tf.as_dtype(x.dtype),
                                   ragged_rank=1, row_splits_dtype=tf.int64)
    return tf.TensorSpec(shape, tf.as_dtype(x.dtype))


def _keras_name(x):
    """A keras.Input's name when the user gave one (Keras' own are ``keras_tensor...``)."""
    name = getattr(x, "name", None)
    return None if not name or name.startswith("keras_tensor") else name


def _sanitize(name):
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)


def _leaf_names(structure, names, prefix, single):
    """Signature names of ``structure``'s leaves (``tf.nest.flatten`` order): the keys of a
    dict (joined by ``_`` when nested), else ``names[i]`` where given, else ``single`` (one
    leaf) or ``<prefix>_<i>``."""
    if isinstance(structure, dict):
        return [_sanitize(path) for path in _paths(structure)]
    return [_sanitize(name) if name else (single if len(names) == 1 else f"{prefix}_{i}")
            for i, name in enumerate(names)]


def _paths(structure, prefix=""):
    """The leaves' paths (keys and indices joined by ``_``), in ``tf.nest.flatten`` order."""
    if isinstance(structure, dict):
        return [p for key in sorted(structure) for p in _paths(structure[key], f"{prefix}{key}_")]
    if isinstance(structure, (list, tuple)):
        return [p for i, item in enumerate(structure) for p in _paths(item, f"{prefix}{i}_")]
    return [prefix[:-1]]


def _flat_input(name, spec):
    """(signature TensorSpecs, function of those tensors giving the model's input leaf)."""
    if isinstance(spec, tf.RaggedTensorSpec):
        rank = spec.ragged_rank
        values = tf.TensorSpec([None] + spec.shape[rank + 1:].as_list(), spec.dtype,
                               name=f"{name}_values")
        lengths = [tf.TensorSpec([None], spec.row_splits_dtype,
                                 name=f"{name}_row_lengths" + (f"_{i + 1}" if rank > 1 else ""))
                   for i in range(rank)]

        def rebuild(tensors):
            return tf.RaggedTensor.from_nested_row_lengths(tensors[0], list(tensors[1:]),
                                                           validate=True)
        return [values] + lengths, rebuild
    if not isinstance(spec, tf.TensorSpec):
        raise ValueError(f"export: input {name} has an unsupported spec {spec!r} (use "
                         "tf.TensorSpec or tf.RaggedTensorSpec)")
    return [tf.TensorSpec(spec.shape, spec.dtype, name=name)], lambda tensors: tensors[0]


def _flat_outputs(outputs):
    """The model's outputs as a dict of plain tensors (ragged ones as values + row lengths)."""
    leaves = tf.nest.flatten(outputs)
    names = _leaf_names(outputs, [None] * len(leaves), "output", single="output_0")
    flat = {}
    for name, leaf in zip(names, leaves):
        if isinstance(leaf, tf.RaggedTensor):
            flat[f"{name}_values"] = leaf.flat_values
            lengths = leaf.nested_row_lengths()
            for i, length in enumerate(lengths):
                flat[f"{name}_row_lengths" + (f"_{i + 1}" if len(lengths) > 1 else "")] = length
        else:
            flat[name] = leaf
    _check_unique(list(flat), "output")
    return flat


def _check_unique(names, what):
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"export: two {what}s are named {name!r} in the serving "
                             "signature; give the inputs distinct names")
        seen.add(name)
