"""Repository rule exposing the installed TensorFlow wheel to Bazel, offline.

Runs $PYTHON_BIN_PATH (written into .bazelrc by tools/configure_bazel.sh) to
ask tf.sysconfig for TensorFlow's include dir, defines and framework library,
symlinks them into the generated repository and writes its BUILD file with:

  :tf_header_lib            TF headers (as -isystem) and TF's ABI defines
  :libtensorflow_framework  libtensorflow_framework.so.2, linked against but
                            not bundled (the Python process has it loaded)
  :python_toolchain         a Python toolchain whose interpreter is
                            $PYTHON_BIN_PATH, so py_test can import TF
  tf_version.bzl            TF_VERSION, the installed TensorFlow's version
"""

_PYTHON_BIN_PATH = "PYTHON_BIN_PATH"

# Prints one "key<TAB>value" line per fact.
_QUERY = """
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
print("version\\t" + tf.__version__)
for flag in tf.sysconfig.get_compile_flags():
    if flag.startswith("-I"):
        print("include\\t" + flag[2:])
    elif flag.startswith("-D"):
        print("define\\t" + flag[2:])
for flag in tf.sysconfig.get_link_flags():
    if flag.startswith("-L"):
        print("libdir\\t" + flag[2:])
    elif flag.startswith("-l:"):
        print("lib\\t" + flag[3:])
    elif flag.startswith("-l"):
        print("lib\\tlib" + flag[2:] + ".so")
"""

def _fail(msg):
    fail("\n%s\nRun `bash tools/configure_bazel.sh` with PYTHON_BIN_PATH set to a " % msg +
         "Python that has TensorFlow installed.\n")

def _tf_configure_impl(rctx):
    python = rctx.os.environ.get(_PYTHON_BIN_PATH, "")
    if not python:
        _fail("tf_configure: PYTHON_BIN_PATH is not set.")
    if not python.startswith("/"):
        _fail("tf_configure: PYTHON_BIN_PATH must be absolute, got '%s'." % python)

    result = rctx.execute([python, "-c", _QUERY], quiet = True)
    if result.return_code != 0:
        _fail("tf_configure: '%s' cannot import tensorflow:\n%s" % (python, result.stderr))

    facts = {"define": []}
    for line in result.stdout.splitlines():
        if "\t" not in line:
            continue
        key, value = line.split("\t", 1)
        if key == "define":
            facts["define"].append(value)
        else:
            facts[key] = value
    for key in ["version", "include", "libdir", "lib"]:
        if key not in facts:
            _fail("tf_configure: tf.sysconfig gave no '%s':\n%s" % (key, result.stdout))

    lib_path = facts["libdir"] + "/" + facts["lib"]
    if not rctx.path(lib_path).exists:
        _fail("tf_configure: %s does not exist." % lib_path)

    rctx.symlink(facts["include"], "include")

    # Linked through an unversioned name; the DT_NEEDED entry is the library's
    # SONAME (libtensorflow_framework.so.2) all the same.
    rctx.symlink(lib_path, "lib/libtensorflow_framework.so")

    rctx.file("tf_version.bzl", 'TF_VERSION = "%s"\n' % facts["version"])
    rctx.template("BUILD", rctx.attr._build_tpl, {
        "%{TF_VERSION}": facts["version"],
        "%{PYTHON_BIN_PATH}": python,
        "%{TF_DEFINES}": "".join(['\n        "%s",' % d for d in facts["define"]]),
    })

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    environ = [_PYTHON_BIN_PATH],
    # Re-run on every server start: the symlinks point into a Python
    # environment that Bazel does not otherwise watch.
    local = True,
    attrs = {
        "_build_tpl": attr.label(default = Label("//third_party/bazel/tf_configure:BUILD.tpl")),
    },
)
