"""Build of recops_tf: compiles op_defs/*.cc and kernels/**/*.cc into recops_tf/_recops_ops.so.

The .so is a TensorFlow op library, not a Python extension module: it is compiled with
TensorFlow's own flags (tf.sysconfig), linked against libtensorflow_framework.so.2, and loaded
with tf.load_op_library by recops_tf/_loader.py.  Next to it the build writes
recops_tf/_build_info.json recording the TensorFlow version it was built for, which the loader
checks before loading.

Rebuild after editing C++:  python setup.py build_ext --inplace
Parallel compile jobs: RECOPS_BUILD_JOBS (default: the number of CPUs, at most 2). The largest
translation units start first, and each one prints a progress line (pip shows them with -v).
The TensorFlow built against is the one this Python imports or, in pip's isolated build
environment, the one installed for the interpreter running pip (see _build_backend.py).
Sanitizer build: RECOPS_SANITIZE=address,undefined (any -fsanitize= list) compiles with
-fsanitize=<list> -fno-omit-frame-pointer -g -O1 -fno-wrapv instead of -O3 -g0, links with
-fsanitize=<list>, and keeps its objects apart (build/sanitize/<list>) so normal objects are
never reused. Such a .so loads only with the sanitizer runtimes preloaded: see tools/sanitize.sh.
Wheel from an existing build: RECOPS_REUSE_LIBRARY=1 (tools/build_wheel.sh --reuse) puts the
in-place recops_tf/_recops_ops.so into a wheel instead of compiling again, when it is what this
build would make: its _build_info.json names the same TensorFlow, Python, compiler and flags,
and it is newer than every source, header, build_flags.bzl and setup.py. Otherwise it compiles,
and says why.
"""
import ast
import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys
import threading
import time

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB_NAME = "recops_tf._recops_ops"
SANITIZE = os.environ.get("RECOPS_SANITIZE", "").strip()
REUSE_LIBRARY = os.environ.get("RECOPS_REUSE_LIBRARY", "").strip() == "1"
if SANITIZE and not re.fullmatch(r"[a-z0-9=_-]+(,[a-z0-9=_-]+)*", SANITIZE):
    raise SystemExit(f"RECOPS_SANITIZE={SANITIZE!r}: expected a -fsanitize= list, "
                     "e.g. address,undefined")


def _sources():
    srcs = sorted(glob.glob("op_defs/*.cc")) + sorted(glob.glob("kernels/**/*.cc", recursive=True))
    return srcs


def _headers():
    return sorted(glob.glob("op_defs/*.h")) + sorted(glob.glob("kernels/**/*.h", recursive=True))


def _code_size(path, seen=None):
    """Bytes of a source and of the project headers it includes (each once): how a unit's
    compile time is guessed, to start the longest first (the per-ISA work items of
    hstu_dense are small files that include a large header)."""
    seen = set() if seen is None else seen
    if path in seen or not os.path.exists(os.path.join(ROOT, path)):
        return 0
    seen.add(path)
    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    return len(text) + sum(_code_size(h, seen) for h in
                           re.findall(r'^#include "((?:kernels|op_defs)/[^"]+)"', text, re.M))


def _shared_copts():
    """RECOPS_COPTS of build_flags.bzl: the compiler flags both builds use (one list)."""
    with open(os.path.join(ROOT, "build_flags.bzl")) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "RECOPS_COPTS"):
            return list(ast.literal_eval(node.value))
    raise SystemExit("build_flags.bzl: no RECOPS_COPTS list")


# Build-time measures of setup.py's build (Bazel compiles every file as its own unit and
# parses the headers in each; the code is the same). Parsing TensorFlow's framework headers is
# most of the time of a small unit: ~10 s for op.h + shape_inference.h and ~15 s for
# op_kernel.h, per unit, on the 2-core build machine.
# - op_defs/*.cc (op registrations and shape functions: little code, all parsing) compile as
#   one unit that includes them in order (REGISTER_OP names its registrars by __COUNTER__;
#   helpers are in anonymous namespaces with distinct names), instead of 18.
# - The kernels' TensorFlow headers are precompiled once (a .gch) and force-included
#   (-include) first in the units that include one of them themselves. They are those units'
#   own includes (or what those include), so a unit sees the same declarations either way;
#   the Bazel build, which has neither measure, checks that each file includes what it uses.
PCH_GROUPS = {
    "kernels": ("tensorflow/core/framework/op_kernel.h",
                "tensorflow/core/framework/tensor.h",
                "absl/strings/str_cat.h"),
}


def _pch_group(src):
    """The PCH group of a source: the first group one of whose TensorFlow headers it includes
    itself."""
    with open(os.path.join(ROOT, src)) as f:
        text = f.read()
    for name, headers in PCH_GROUPS.items():
        if any(f'#include "{h}"' in text for h in headers if h.startswith("tensorflow/")):
            return name
    return None


_TF_CODE = ("import json, tensorflow as tf; print(json.dumps([tf.__version__, "
            "tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()]))")


def installed_tensorflow_build_flags(python):
    """(version, compile flags, link flags) of the TensorFlow that `python` imports outside
    pip's isolated build environment (``-I`` leaves out the PYTHONPATH through which pip puts
    that environment in front)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([python, "-I", "-c", _TF_CODE], capture_output=True, text=True,
                         env=env)
    if out.returncode != 0:
        raise SystemExit(
            f"recops_tf: building the op library needs TensorFlow 2.21, and {python} has none: "
            "pip install 'tensorflow-cpu==2.21.*' (or 'tensorflow==2.21.*') first. "
            f"({' '.join(out.stderr.strip().splitlines()[-1:])})")
    version, compile_flags, link_flags = json.loads(out.stdout.strip().splitlines()[-1])
    return version, compile_flags, link_flags


def tensorflow_build_flags():
    """(version, compile flags, link flags) of the TensorFlow to build against: the one this
    Python imports or, in pip's isolated build environment when _build_backend.py found a
    TensorFlow 2.21 installed and asked for none, that installed one."""
    try:
        import tensorflow as tf  # imported here: only needed when building
    except ImportError:
        return installed_tensorflow_build_flags(sys.executable)
    return tf.__version__, tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()


class TFBuildExt(build_ext):
    """Compiles the op library with TensorFlow's flags, two translation units at a time."""

    def build_extensions(self):
        tf_version, tf_compile_flags, tf_link_flags = tensorflow_build_flags()
        compile_flags = []
        for flag in tf_compile_flags:
            if flag.startswith("-I"):
                # TF headers as system headers keep -Wall -Wextra about our own code.
                compile_flags += ["-isystem", flag[2:]]
            else:
                compile_flags.append(flag)
        self._tf_version = tf_version
        # The flags shared with Bazel's BUILD (build_flags.bzl), then what Bazel adds itself.
        self._compile_flags = compile_flags + _shared_copts() + ["-fPIC", f"-I{ROOT}"]
        self._link_flags = list(tf_link_flags)
        if SANITIZE:
            # Debuggable, instrumented code: frame pointers and -g for readable stack traces,
            # -O1 so the instrumented build stays fast enough to run the test suite.
            flags = [f for f in self._compile_flags if f not in ("-O3", "-g0")]
            # -fno-wrapv: Python's CFLAGS bring -fwrapv, which turns UBSan's signed-overflow
            # check off; an overflowing index or size in a kernel is a bug either way.
            self._compile_flags = flags + [
                f"-fsanitize={SANITIZE}", "-fno-omit-frame-pointer", "-g", "-O1", "-fno-wrapv"]
            if "undefined" in SANITIZE.split(","):
                # GCC (PR 100313, abseil #1634): these checks imply -fno-delete-null-pointer-checks,
                # under which absl's constexpr `function pointer == nullptr` (hash_policy_traits.h,
                # included by TF's op.h) stops compiling. ASan still catches null dereferences.
                self._compile_flags.append(
                    "-fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute")
            self._link_flags = [f"-fsanitize={SANITIZE}"] + self._link_flags
        dropped = ("-g", "-O2", "-Wstrict-prototypes")
        self.compiler.compiler_so = ["g++"] + [
            a for a in self.compiler.compiler_so[1:] if a not in dropped]
        self.compiler.linker_so = ["g++", "-shared"]
        super().build_extensions()

    def run(self):
        # setuptools builds an in-place (--inplace) or editable build with inplace off, into
        # build/, and copies the library into the tree afterwards.
        self._inplace_build = bool(self.inplace or getattr(self, "editable_mode", False))
        super().run()

    def build_extension(self, ext):
        out_path = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        flags = [f for f in self._compile_flags
                 if not f.startswith(("/", "-I")) and f != "-isystem"]
        info = {"tf_version": self._tf_version, "python": sys.version.split()[0],
                "compiler": " ".join(self.compiler.compiler_so[:1]),
                "compile_flags": " ".join(flags)}
        if REUSE_LIBRARY and self._reuse_inplace_library(ext, out_path, info):
            return
        jobs = int(os.environ.get("RECOPS_BUILD_JOBS", str(max(1, min(os.cpu_count() or 1, 2)))))
        build_temp = os.path.join(self.build_temp, "recops")
        if SANITIZE:  # never mix instrumented and normal objects
            build_temp = os.path.join(ROOT, "build", "sanitize", SANITIZE.replace(",", "_"))

        # Objects newer than their source, every header and the flags are reused (an
        # incremental rebuild compiles only what changed; a clean checkout compiles all).
        os.makedirs(build_temp, exist_ok=True)
        stamp_path = os.path.join(build_temp, "flags.json")
        stamp = json.dumps(self._compile_flags)
        fresh_flags = os.path.exists(stamp_path) and open(stamp_path).read() == stamp
        newest_header = max([os.path.getmtime(h) for h in _headers()] + [0])

        sources = list(ext.sources)
        members = {src: [src] for src in sources}  # the files a unit compiles
        op_defs = [src for src in sources if src.startswith("op_defs/")]
        if op_defs:
            unity = os.path.join(build_temp, "op_defs_all.cc")
            text = "".join(f'#include "{src}"\n' for src in op_defs)
            if not os.path.exists(unity) or open(unity).read() != text:
                with open(unity, "w") as f:
                    f.write(text)
            sources = [unity] + [src for src in sources if src not in op_defs]
            members[unity] = op_defs
        groups = {src: _pch_group(src) for src in sources}
        pch_stamp = json.dumps([self._tf_version, self._compile_flags])

        def compile_pch(name):
            # build_temp/pch/<group>.h and its .gch beside it (where -include looks first).
            header = os.path.join(os.path.abspath(build_temp), "pch", name + ".h")
            gch, pch_stamp_path = header + ".gch", header + ".stamp"
            if (os.path.exists(gch) and os.path.exists(pch_stamp_path)
                    and open(pch_stamp_path).read() == pch_stamp):
                return header
            os.makedirs(os.path.dirname(header), exist_ok=True)
            with open(header, "w") as f:
                f.write("".join(f'#include "{h}"\n' for h in PCH_GROUPS[name]))
            self.spawn(self.compiler.compiler_so + self._compile_flags + [
                "-x", "c++-header", header, "-o", gch])
            with open(pch_stamp_path, "w") as f:
                f.write(pch_stamp)
            return header

        def fresh(src):
            obj = self.compiler.object_filenames([src], output_dir=build_temp)[0]
            newest = max([os.path.getmtime(m) for m in members[src]] + [newest_header])
            return fresh_flags and os.path.exists(obj) and os.path.getmtime(obj) > newest

        # The largest translation units start first, so that the other job compiles everything
        # else meanwhile. The link keeps the sources' order.
        order = sorted(sources, key=lambda src: sum(map(_code_size, members[src])),
                       reverse=True)
        stale = [src for src in order if not fresh(src)]
        start, done, lock = time.monotonic(), [0], threading.Lock()
        if stale:
            self._progress(f"compiling {len(stale)} of {len(sources)} translation units, "
                           f"{jobs} at a time (a clean build is about 7 CPU-minutes)")

        def compile_one(src):
            obj = self.compiler.object_filenames([src], output_dir=build_temp)[0]
            if src not in stale:
                return obj
            began = time.monotonic()
            pch = []
            if groups[src] is not None:
                pch = ["-Winvalid-pch", "-include", pch_headers[groups[src]]]
            obj = self.compiler.compile([src], output_dir=build_temp,
                                        extra_postargs=self._compile_flags + pch)[0]
            with lock:
                done[0] += 1
                name = "op_defs/*.cc" if src not in ext.sources else src
                self._progress(f"[{done[0]}/{len(stale)}] {name} {time.monotonic() - began:.0f} s "
                               f"({time.monotonic() - start:.0f} s so far)")
            return obj

        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            needed = sorted({groups[src] for src in stale if groups[src] is not None})
            pch_headers = dict(zip(needed, pool.map(compile_pch, needed)))
            compiled = dict(zip(order, pool.map(compile_one, order)))
        objects = [compiled[src] for src in sources]
        with open(stamp_path, "w") as f:
            f.write(stamp)
        self.compiler.link_shared_object(objects, out_path, extra_postargs=self._link_flags)
        self._write_build_info(out_path, info)

    def _write_build_info(self, out_path, info):
        info_dirs = {os.path.dirname(out_path)}
        if self._inplace_build:
            info_dirs.add(os.path.join(ROOT, "recops_tf"))  # the in-place copy of the .so
        for d in info_dirs:
            with open(os.path.join(d, "_build_info.json"), "w") as f:
                json.dump(info, f)

    def _reuse_inplace_library(self, ext, out_path, info):
        """Copies the in-place .so to `out_path` and returns True if it is what this build
        would make (see RECOPS_REUSE_LIBRARY above); else says why and returns False."""
        lib = os.path.join(ROOT, *LIB_NAME.split(".")) + ".so"
        lib_info = os.path.join(os.path.dirname(lib), "_build_info.json")
        inputs = list(ext.sources) + _headers() + [os.path.join(ROOT, "build_flags.bzl"),
                                                   os.path.join(ROOT, "setup.py")]
        built = None
        if os.path.exists(lib) and os.path.exists(lib_info):
            with open(lib_info) as f:
                built = json.load(f)
        if SANITIZE or self._inplace_build or os.path.abspath(out_path) == lib:
            why = "only a wheel (not a sanitizer, in-place or editable build) reuses it"
        elif built is None:
            why = f"no {os.path.relpath(lib, ROOT)} with its _build_info.json"
        elif os.path.getmtime(lib_info) < os.path.getmtime(lib):
            why = "its _build_info.json is older than it (not written by the build that made it)"
        elif built != info:
            why = f"it was built otherwise: {built} (this build: {info})"
        elif os.path.getmtime(lib) <= max(map(os.path.getmtime, inputs)):
            why = "a source, header or build file is newer"
        else:
            self.copy_file(lib, out_path)
            self._write_build_info(out_path, info)
            self._progress(f"reusing {os.path.relpath(lib, ROOT)} (RECOPS_REUSE_LIBRARY=1: "
                           "built for the same TensorFlow with the same flags, newer than "
                           "every source)")
            return True
        self._progress(f"RECOPS_REUSE_LIBRARY=1: compiling, the in-place library does not "
                       f"qualify: {why}")
        return False

    @staticmethod
    def _progress(line):
        print(f"recops_tf build: {line}", flush=True)

    def get_export_symbols(self, ext):
        return []  # not a Python module: no PyInit_ symbol

    def get_ext_filename(self, fullname):
        # Plain "_recops_ops.so", without the interpreter's ABI tag.
        return os.path.join(*fullname.split(".")) + ".so"


if __name__ == "__main__":  # setuptools' build backend runs this file as __main__ too
    setup(
        ext_modules=[Extension(LIB_NAME, sources=_sources(),
                               depends=_headers() + ["build_flags.bzl"], language="c++")],
        cmdclass={"build_ext": TFBuildExt},
    )
