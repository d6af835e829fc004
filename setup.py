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
"""
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
if SANITIZE and not re.fullmatch(r"[a-z0-9=_-]+(,[a-z0-9=_-]+)*", SANITIZE):
    raise SystemExit(f"RECOPS_SANITIZE={SANITIZE!r}: expected a -fsanitize= list, "
                     "e.g. address,undefined")


def _sources():
    srcs = sorted(glob.glob("op_defs/*.cc")) + sorted(glob.glob("kernels/**/*.cc", recursive=True))
    return srcs


def _headers():
    return sorted(glob.glob("op_defs/*.h")) + sorted(glob.glob("kernels/**/*.h", recursive=True))


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
        # -Wno-psabi: GCC notes that 64-byte vector values change the ABI; in the kernels they
        # only pass between always_inline functions.
        self._compile_flags = compile_flags + [
            "-O3", "-g0", "-fPIC", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-psabi",
            "-fvisibility-inlines-hidden", f"-I{ROOT}",
            # No kernel reads errno: sqrt and friends may vectorise (the fused LazyAdam step
            # is 2-3x faster for it).
            "-fno-math-errno",
        ]
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
        self.compiler.compiler_so = ["g++"] + [
            a for a in self.compiler.compiler_so[1:] if a not in ("-g", "-O2", "-Wstrict-prototypes")
        ]
        self.compiler.linker_so = ["g++", "-shared"]
        super().build_extensions()

    def build_extension(self, ext):
        out_path = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
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

        def fresh(src):
            obj = self.compiler.object_filenames([src], output_dir=build_temp)[0]
            return (fresh_flags and os.path.exists(obj) and
                    os.path.getmtime(obj) > max(os.path.getmtime(src), newest_header))

        # The largest translation units take minutes (kernels/hstu_dense_kernels.cc 9.5 of
        # the 20 a one-job compile took here): they start first, so that the other jobs
        # compile everything else meanwhile. The link keeps the sources' order.
        sources = sorted(ext.sources, key=os.path.getsize, reverse=True)
        stale = [src for src in sources if not fresh(src)]
        start, done, lock = time.monotonic(), [0], threading.Lock()
        if stale:
            self._progress(f"compiling {len(stale)} of {len(sources)} translation units, "
                           f"{jobs} at a time (a clean build is about 20 CPU-minutes)")

        def compile_one(src):
            obj = self.compiler.object_filenames([src], output_dir=build_temp)[0]
            if src not in stale:
                return obj
            began = time.monotonic()
            obj = self.compiler.compile([src], output_dir=build_temp,
                                        extra_postargs=self._compile_flags)[0]
            with lock:
                done[0] += 1
                self._progress(f"[{done[0]}/{len(stale)}] {src} {time.monotonic() - began:.0f} s "
                               f"({time.monotonic() - start:.0f} s so far)")
            return obj

        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            compiled = dict(zip(sources, pool.map(compile_one, sources)))
        objects = [compiled[src] for src in ext.sources]
        with open(stamp_path, "w") as f:
            f.write(stamp)
        self.compiler.link_shared_object(objects, out_path, extra_postargs=self._link_flags)
        flags = [f for f in self._compile_flags
                 if not f.startswith(("/", "-I")) and f != "-isystem"]
        info = {"tf_version": self._tf_version, "python": sys.version.split()[0],
                "compiler": " ".join(self.compiler.compiler_so[:1]),
                "compile_flags": " ".join(flags)}
        info_dirs = {os.path.dirname(out_path)}
        if self.inplace or getattr(self, "editable_mode", False):
            info_dirs.add(os.path.join(ROOT, "recops_tf"))  # the in-place copy of the .so
        for d in info_dirs:
            with open(os.path.join(d, "_build_info.json"), "w") as f:
                json.dump(info, f)

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
        ext_modules=[Extension(LIB_NAME, sources=_sources(), depends=_headers(),
                               language="c++")],
        cmdclass={"build_ext": TFBuildExt},
    )
