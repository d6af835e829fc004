"""TensorFlow Serving's gRPC messages and service paths, without ``tensorflow-serving-api``.

The PyPI package ``tensorflow-serving-api`` holds the ``tensorflow.serving`` message classes,
but it requires the full ``tensorflow`` distribution, which would install a second TensorFlow
beside our ``tensorflow-cpu``. So when that package is not importable, the messages this server
needs are declared here as a ``FileDescriptorProto`` (same full names, field numbers, types,
labels, oneofs and map entries as TF Serving's ``.proto`` files) and built at import time in
the default descriptor pool, next to TensorFlow's own ``TensorProto`` / ``SignatureDef`` /
``tensorflow.error.Code``, so ``tf.make_tensor_proto`` results can be stored in them directly.
The wire format equals TF Serving's: ``tests/serving/test_apis.py`` checks bytes and
descriptors against the real package.

If ``tensorflow_serving.apis`` is importable (or its messages are already in the default pool),
its classes are reused instead (``SOURCE == "tensorflow_serving"``): both cannot live in one
pool. Hence making that package importable only *after* this module was imported (e.g. by
editing ``sys.path``) is unsupported: importing it then fails with "duplicate symbol".
"""

import importlib
import types

import grpc
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, wrappers_pb2
from google.protobuf.message_factory import GetMessageClass
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.protobuf import error_codes_pb2, meta_graph_pb2

PREDICT = "/tensorflow.serving.PredictionService/Predict"
GET_MODEL_METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"
GET_MODEL_STATUS = "/tensorflow.serving.ModelService/GetModelStatus"

_PKG = "tensorflow.serving"
_FILE = "recops_tf/serving/tensorflow_serving_apis.proto"
_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "bool": _F.TYPE_BOOL,
            "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64}
_TENSOR, _SIGDEF = ".tensorflow.TensorProto", ".tensorflow.SignatureDef"
_MODEL_SPEC = f".{_PKG}.ModelSpec"


def _message(full, fields, nested=(), enums=(), json=False):
    """A DescriptorProto. ``fields``: ``(name, number, "[repeated|optional] type" [, oneof])``
    where type is a scalar, ``.full.MessageOrEnum`` or ``map<key,value>``."""
    msg = descriptor_pb2.DescriptorProto(name=full.rsplit(".", 1)[-1])
    msg.nested_type.extend(nested)
    for name, values in enums:
        msg.enum_type.add(name=name).value.extend(
            descriptor_pb2.EnumValueDescriptorProto(name=n, number=i) for n, i in values)
    oneofs = []
    for name, number, spec, *oneof in fields:
        *mods, kind = spec.split()
        field = msg.field.add(name=name, number=number, label=_F.LABEL_OPTIONAL)
        if json:
            field.json_name = name
        if "repeated" in mods:
            field.label = _F.LABEL_REPEATED
        if "optional" in mods:  # proto3 `optional`: a synthetic oneof "_<name>"
            field.proto3_optional, oneof = True, [f"_{name}"]
        if kind.startswith("map<"):
            entry = "".join(w.capitalize() for w in name.split("_")) + "Entry"
            msg.nested_type.append(_message(f"{full}.{entry}", [
                ("key", 1, kind[4:-1].split(",")[0]), ("value", 2, kind[4:-1].split(",")[1])]))
            msg.nested_type[-1].options.map_entry = True
            field.label, kind = _F.LABEL_REPEATED, f".{full}.{entry}"
        if kind in _SCALARS:
            field.type = _SCALARS[kind]
        else:  # the pool resolves whether it names a message or an enum
            field.type_name = kind
        if oneof:
            if oneof[0] not in oneofs:
                oneofs.append(oneof[0])
                msg.oneof_decl.add(name=oneof[0])
            field.oneof_index = oneofs.index(oneof[0])
    return msg


def _file():
    deps = (wrappers_pb2.Int64Value, any_pb2.Any, tensor_pb2.TensorProto,
            meta_graph_pb2.SignatureDef, error_codes_pb2.Code)
    proto = descriptor_pb2.FileDescriptorProto(
        name=_FILE, package=_PKG, syntax="proto3",
        dependency=sorted({d.DESCRIPTOR.file.name for d in deps}))
    req, opts = f"{_PKG}.PredictRequest", f"{_PKG}.PredictRequest.RequestOptions"
    options = _message(opts, [
        ("client_id", 1, "optional bytes"),
        ("deterministic_mode", 2, f"optional .{opts}.DeterministicMode"),
        ("return_additional_arrays_from_prefill", 3, "optional bool"),
        ("return_stoptokens", 4, "repeated int64"),
        ("return_all_stoptokens", 9, "optional bool"),
        ("max_cache_length", 6, "optional int64"),
        ("handshake", 13, f"optional .{opts}.Handshake"),
    ], nested=[_message(f"{opts}.Handshake", [("estimated_payload_bytes", 1, "int64")])],
        enums=[("DeterministicMode", [("DETERMINISTIC_MODE_UNSPECIFIED", 0),
                                      ("FIXED_DECODER_SLOT", 1)])])
    request = _message(req, [
        ("model_spec", 1, _MODEL_SPEC),
        ("inputs", 2, f"map<string,{_TENSOR}>"),
        ("output_filter", 3, "repeated string"),
        ("predict_streamed_options", 5, f".{_PKG}.PredictStreamedOptions"),
        ("client_id", 6, "optional bytes"),
        ("request_options", 7, f"optional .{opts}"),
    ], nested=[options])
    request.reserved_range.add(start=4, end=5)
    proto.message_type.extend([
        _message(f"{_PKG}.ModelSpec", [
            ("name", 1, "string"),
            ("version", 2, ".google.protobuf.Int64Value", "version_choice"),
            ("version_label", 4, "string", "version_choice"),
            ("signature_name", 3, "string")]),
        request,
        _message(f"{_PKG}.PredictStreamedOptions", [
            ("request_state", 1, f".{_PKG}.PredictStreamedOptions.RequestState"),
            ("split_dimensions", 2, "map<string,int32>"),
            ("return_single_response", 3, "bool"),
        ], enums=[("RequestState", [("NONE", 0), ("SPLIT", 1), ("END_SPLIT", 2), ("CANCEL", 3)])]),
        _message(f"{_PKG}.PredictResponse", [
            ("model_spec", 2, _MODEL_SPEC), ("outputs", 1, f"map<string,{_TENSOR}>")]),
        _message(f"{_PKG}.StatusProto", [
            ("error_code", 1, ".tensorflow.error.Code"), ("error_message", 2, "string")],
            json=True),
        _message(f"{_PKG}.GetModelStatusRequest", [("model_spec", 1, _MODEL_SPEC)]),
        _message(f"{_PKG}.ModelVersionStatus", [
            ("version", 1, "int64"), ("state", 2, f".{_PKG}.ModelVersionStatus.State"),
            ("status", 3, f".{_PKG}.StatusProto")],
            enums=[("State", [("UNKNOWN", 0), ("START", 10), ("LOADING", 20),
                              ("AVAILABLE", 30), ("UNLOADING", 40), ("END", 50)])]),
        _message(f"{_PKG}.GetModelStatusResponse", [
            ("model_version_status", 1, f"repeated .{_PKG}.ModelVersionStatus")], json=True),
        _message(f"{_PKG}.SignatureDefMap", [("signature_def", 1, f"map<string,{_SIGDEF}>")]),
        _message(f"{_PKG}.GetModelMetadataRequest", [
            ("model_spec", 1, _MODEL_SPEC), ("metadata_field", 2, "repeated string")]),
        _message(f"{_PKG}.GetModelMetadataResponse", [
            ("model_spec", 1, _MODEL_SPEC),
            ("metadata", 2, "map<string,.google.protobuf.Any>")]),
    ])
    return proto


def _classes():
    try:  # registers the real descriptors in the default pool
        for name in ("model", "predict", "get_model_status", "get_model_metadata"):
            importlib.import_module(f"tensorflow_serving.apis.{name}_pb2")
    except Exception:  # absent (or unusable, e.g. built for another protobuf runtime)
        pass
    pool = descriptor_pool.Default()
    try:
        source = pool.FindMessageTypeByName(f"{_PKG}.PredictRequest").file.name
    except KeyError:
        pool.AddSerializedFile(_file().SerializeToString())  # what generated `_pb2` code does
        source = _FILE
    return "recops_tf" if source == _FILE else "tensorflow_serving", pool


SOURCE, _pool = _classes()
(ModelSpec, PredictRequest, PredictResponse, GetModelStatusRequest, GetModelStatusResponse,
 ModelVersionStatus, StatusProto, GetModelMetadataRequest, GetModelMetadataResponse,
 SignatureDefMap) = (GetMessageClass(_pool.FindMessageTypeByName(f"{_PKG}.{n}")) for n in (
     "ModelSpec PredictRequest PredictResponse GetModelStatusRequest GetModelStatusResponse "
     "ModelVersionStatus StatusProto GetModelMetadataRequest GetModelMetadataResponse "
     "SignatureDefMap").split())

_METHODS = {  # path: (request class, response class)
    PREDICT: (PredictRequest, PredictResponse),
    GET_MODEL_METADATA: (GetModelMetadataRequest, GetModelMetadataResponse),
    GET_MODEL_STATUS: (GetModelStatusRequest, GetModelStatusResponse),
}


def add_services(server, predict, get_model_metadata, get_model_status, raw=False):
    """Serve the three methods on ``server`` (a ``grpc.Server`` or ``grpc.aio.Server``); each
    behaviour is a callable ``(request, context) -> response`` (a coroutine function for the
    asyncio server) on the message classes of this module, or, with `raw`, on the request's
    bytes (the behaviour decodes them: grpc answers a request its deserializer cannot decode
    with UNKNOWN, before any behaviour sees it)."""
    services = {}
    for path, behaviour in zip(_METHODS, (predict, get_model_metadata, get_model_status)):
        service, method = path[1:].split("/")
        request, response = _METHODS[path]
        services.setdefault(service, {})[method] = grpc.unary_unary_rpc_method_handler(
            behaviour, request_deserializer=None if raw else request.FromString,
            response_serializer=response.SerializeToString)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(s, m) for s, m in services.items()])


def stubs(channel):
    """Client callables ``.Predict``, ``.GetModelMetadata``, ``.GetModelStatus`` on a
    ``grpc.Channel``."""
    return types.SimpleNamespace(**{
        path.rsplit("/", 1)[1]: channel.unary_unary(
            path, request_serializer=request.SerializeToString,
            response_deserializer=response.FromString)
        for path, (request, response) in _METHODS.items()})
