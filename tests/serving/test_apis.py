"""TF Serving's messages built by `recops_tf.serving._apis`: round trips, the same wire format
and descriptors as the real `tensorflow-serving-api` (run in subprocesses, so its classes never
share this process's descriptor pool with ours), both import orders, and a live gRPC server."""
import concurrent.futures
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import zipfile

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import any_pb2, text_format, wrappers_pb2

from recops_tf.serving import _apis as api

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ("ModelSpec PredictRequest PredictResponse GetModelStatusRequest GetModelStatusResponse "
         "ModelVersionStatus StatusProto GetModelMetadataRequest GetModelMetadataResponse "
         "SignatureDefMap").split()


def _describe(names):
    """Every field (and enum) of the named messages and of the tensorflow.serving messages they
    reach, from the default descriptor pool. Also run, as source, in the subprocess."""
    from google.protobuf import descriptor_pool

    pool, out = descriptor_pool.Default(), {}

    def walk(d):
        if d.full_name in out or not d.full_name.startswith("tensorflow.serving."):
            return
        out[d.full_name] = {
            "map_entry": d.GetOptions().map_entry,
            "enums": {e.name: [[v.name, v.number] for v in e.values] for e in d.enum_types},
            "fields": [[f.name, f.number, f.type, f.is_repeated, f.has_presence, f.json_name,
                        (f.message_type or f.enum_type).full_name if f.type in (11, 14) else "",
                        f.containing_oneof.name if f.containing_oneof else ""]
                       for f in d.fields]}
        for t in [*d.nested_types, *(f.message_type for f in d.fields if f.message_type)]:
            walk(t)

    for name in names:
        walk(pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))
    return out


def _spec(**kw):
    return api.ModelSpec(name="m", signature_name="serving_default", **kw)


def _samples():
    """(class name, message) with every field of every message set."""
    req = api.PredictRequest(model_spec=_spec(version=wrappers_pb2.Int64Value(value=3)),
                             output_filter=["y", "z"], client_id=b"cid")
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.5, -2.0]], np.float32)))
    req.inputs["ids"].CopyFrom(tf.make_tensor_proto(np.array([7, 8, 9], np.int64)))
    req.inputs["s"].CopyFrom(tf.make_tensor_proto([b"a", b"bc"]))
    streamed = req.predict_streamed_options
    streamed.request_state, streamed.return_single_response = streamed.SPLIT, True
    streamed.split_dimensions["x"] = 1
    opts = req.request_options
    opts.client_id, opts.deterministic_mode = b"o", opts.FIXED_DECODER_SLOT
    opts.return_additional_arrays_from_prefill, opts.return_all_stoptokens = False, True
    opts.return_stoptokens.extend([1, 2])
    opts.max_cache_length, opts.handshake.estimated_payload_bytes = 0, 64  # 0: presence only
    resp = api.PredictResponse(model_spec=_spec(version_label="stable"))
    resp.outputs["y"].CopyFrom(tf.make_tensor_proto(np.arange(6, dtype=np.float64).reshape(2, 3)))
    status = api.StatusProto(error_code=5, error_message="not found")  # tensorflow.error.NOT_FOUND
    versions = [api.ModelVersionStatus(version=2, state=api.ModelVersionStatus.AVAILABLE),
                api.ModelVersionStatus(version=1, state=api.ModelVersionStatus.END, status=status)]
    sigs = api.SignatureDefMap()
    sig = sigs.signature_def["serving_default"]
    sig.method_name = "tensorflow/serving/predict"
    sig.inputs["x"].name, sig.inputs["x"].dtype = "x:0", tf.float32.as_datatype_enum
    sig.outputs["y"].name = "y:0"
    sig.inputs["x"].tensor_shape.dim.add(size=-1)
    meta = api.GetModelMetadataResponse(model_spec=_spec(version=wrappers_pb2.Int64Value(value=1)))
    meta.metadata["signature_def"].Pack(sigs)
    return [("ModelSpec", _spec(version=wrappers_pb2.Int64Value(value=0))),
            ("ModelSpec", _spec(version_label="canary")), ("PredictRequest", req),
            ("PredictResponse", resp), ("GetModelStatusRequest", api.GetModelStatusRequest(
                model_spec=_spec())), ("GetModelStatusResponse", api.GetModelStatusResponse(
                    model_version_status=versions)), ("ModelVersionStatus", versions[1]),
            ("StatusProto", status), ("SignatureDefMap", sigs), ("GetModelMetadataRequest",
             api.GetModelMetadataRequest(model_spec=_spec(), metadata_field=["signature_def"])),
            ("GetModelMetadataResponse", meta)]


# Subprocesses skip TensorFlow's package __init__ (3 s; its .proto modules do not need it) and
# load _apis.py by path (so not recops_tf/__init__.py, which needs TensorFlow's).
PRELUDE = f"""
import importlib.util, json, sys, types
tf = types.ModuleType("tensorflow")
tf.__path__ = list(importlib.util.find_spec("tensorflow").submodule_search_locations)
sys.modules["tensorflow"] = tf
REAL = sys.argv[1]

def load_ours():
    spec = importlib.util.spec_from_file_location("_apis", {os.path.abspath(api.__file__)!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
"""
CHECK_SAME = """
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, model_pb2
from tensorflow_serving.apis import predict_pb2, status_pb2
ours = load_ours()
assert ours.SOURCE == "tensorflow_serving", ours.SOURCE
for mod in (model_pb2, predict_pb2, status_pb2, get_model_status_pb2, get_model_metadata_pb2):
    for name in mod.DESCRIPTOR.message_types_by_name:
        assert getattr(ours, name, getattr(mod, name)) is getattr(mod, name), name
"""
REAL_FIRST = PRELUDE + inspect.getsource(_describe) + """
sys.path.insert(0, REAL)
from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2, predict_pb2
from google.protobuf import descriptor_pool, text_format
from google.protobuf.message_factory import GetMessageClass
data, out = json.load(sys.stdin), {"samples": []}
out["describe"] = _describe(data["names"])
for name, wire, text in data["samples"]:
    pool = descriptor_pool.Default()
    cls = GetMessageClass(pool.FindMessageTypeByName("tensorflow.serving." + name))
    msg, back = cls.FromString(bytes.fromhex(wire)), text_format.Parse(text, cls())
    out["samples"].append([msg.SerializeToString(deterministic=True).hex(),
                           text_format.MessageToString(msg),
                           back.SerializeToString(deterministic=True).hex()])
""" + CHECK_SAME + "print(json.dumps(out))"
OURS_FIRST = PRELUDE + """
sys.path.insert(0, REAL)
""" + CHECK_SAME
OURS_FIRST_REAL_LATER = PRELUDE + """
assert load_ours().SOURCE == "recops_tf"
sys.path.insert(0, REAL)
try:
    from tensorflow_serving.apis import model_pb2
except TypeError as e:
    assert "duplicate symbol" in str(e), e
else:
    raise AssertionError("the real package could be imported after ours")
"""


def _run(code, where, stdin=""):
    done = subprocess.run([sys.executable, "-c", code, where], input=stdin, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """Where the real package is: installed, else downloaded and unzipped."""
    spec = importlib.util.find_spec("tensorflow_serving")
    if spec is not None:
        return os.path.dirname(list(spec.submodule_search_locations)[0])
    tmp = tmp_path_factory.mktemp("tfsa")
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                        "tensorflow-serving-api==2.21.0", "-d", str(tmp)],
                       check=True, capture_output=True, text=True, timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        reason = (getattr(e, "stderr", None) or str(e)).strip().splitlines()[-1]
        pytest.skip(f"cannot download tensorflow-serving-api: {reason}")
    zipfile.ZipFile(next(tmp.glob("*.whl"))).extractall(tmp / "pkg")
    return str(tmp / "pkg")


def test_predict_request_round_trip():
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    req = api.PredictRequest(model_spec=api.ModelSpec(name="m", signature_name="serving_default"))
    req.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    back = api.PredictRequest.FromString(req.SerializeToString())
    assert back == req and back.model_spec.name == "m"
    np.testing.assert_array_equal(tf.make_ndarray(back.inputs["x"]), x)
    spec = api.ModelSpec(version=wrappers_pb2.Int64Value(value=4))
    spec.version_label = "stable"  # a oneof, as in TF Serving
    assert spec.WhichOneof("version_choice") == "version_label" and not spec.HasField("version")


def test_wire_format_and_descriptors_equal_tf_serving(real):
    samples = [(n, m.SerializeToString(deterministic=True).hex(), text_format.MessageToString(m))
               for n, m in _samples()]
    out = json.loads(_run(REAL_FIRST, real, json.dumps({"names": NAMES, "samples": samples})))
    assert out["describe"] == json.loads(json.dumps(_describe(NAMES)))
    for (name, msg), (wire, text, from_text) in zip(_samples(), out["samples"]):
        ours = msg.SerializeToString(deterministic=True)
        assert bytes.fromhex(wire) == ours, name
        assert text == text_format.MessageToString(msg), name  # no field unknown to the real one
        assert type(msg).FromString(bytes.fromhex(from_text)) == msg, name


def test_import_orders(real):
    """Real package first: REAL_FIRST above. Ours first: the real classes if importable then;
    if it becomes importable only later, importing it fails (as the module docstring says)."""
    _run(OURS_FIRST, real)
    if api.SOURCE == "recops_tf":  # else it is installed: importable from the start
        _run(OURS_FIRST_REAL_LATER, real)


def test_grpc_round_trip():
    def predict(request, context):
        if request.model_spec.name == "bad":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "msg")
        response = api.PredictResponse(model_spec=request.model_spec)
        response.outputs["y"].CopyFrom(request.inputs["x"])
        return response

    def metadata(request, context):
        response = api.GetModelMetadataResponse(model_spec=request.model_spec)
        response.metadata["signature_def"].Pack(api.SignatureDefMap())
        return response

    def status(request, context):
        return api.GetModelStatusResponse(model_version_status=[api.ModelVersionStatus(
            version=1, state=api.ModelVersionStatus.AVAILABLE)])

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
    api.add_services(server, predict, metadata, status)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = api.stubs(channel)
            req = api.PredictRequest(model_spec=api.ModelSpec(name="m"))
            req.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([1, 2, 3], np.int64)))
            answer = stub.Predict(req, timeout=10)
            assert answer.model_spec.name == "m" and answer.outputs["y"] == req.inputs["x"]
            meta = stub.GetModelMetadata(api.GetModelMetadataRequest(model_spec=req.model_spec),
                                         timeout=10)
            assert meta.metadata["signature_def"].Is(api.SignatureDefMap.DESCRIPTOR)
            versions = stub.GetModelStatus(api.GetModelStatusRequest(), timeout=10)
            assert [(v.version, v.state) for v in versions.model_version_status] == [
                (1, api.ModelVersionStatus.AVAILABLE)]
            req.model_spec.name = "bad"
            with pytest.raises(grpc.RpcError) as err:
                stub.Predict(req, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details() == "msg"
    finally:
        server.stop(None)
    assert isinstance(meta.metadata["signature_def"], any_pb2.Any)
