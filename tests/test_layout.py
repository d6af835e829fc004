"""Layout policy: every stem's C++ is found by its name, and both builds share one flag list.

The rule, for every row of recops_tf/_ops_table.py with TF ops:

- ``op_defs/<stem>.cc`` registers its ops; ``op_defs/`` holds nothing else but the shared
  shape functions (``shape_fns.{h,cc}``);
- ``kernels/<stem>_kernels.cc`` holds its OpKernels;
- every other file directly in ``kernels/`` is ``<stem><suffix>`` for a row's stem, with a
  suffix of ``KERNEL_SUFFIXES``;
- ``kernels/common/`` holds code shared between stems: each of its headers is included by the
  kernel files of at least two stems (a header only one stem includes is that stem's code under
  a generic name, and goes to ``kernels/<stem>.h``), no file there is named after a stem, and
  none registers a kernel, names an op or defines a resource (a resource is the state of one
  stem's ops: the growing table is embedding_by_address's, in ``kernels/embedding_by_address.h``).

A row without TF ops (a Python-only stem, such as lccl) has no C++ files at all.
"""
import ast
import glob
import json
import os
import re

import pytest

from recops_tf import _ops_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The agreed suffixes of a stem's files in kernels/ (besides <stem>_kernels.cc, required).
KERNEL_SUFFIXES = {
    ".h": "the algorithm: functors templated on dtype, free of OpKernelContext where possible",
    ".cc": "the algorithm's non-template code",
    "_kernels.cc": "the OpKernel classes and their registrations",
    "_kernels.h": "OpKernel code that another stem's _kernels.cc builds on",
    "_avx2.cc": "hot templates instantiated once, compiled for AVX2 + FMA",
    "_avx512.cc": "hot templates instantiated once, compiled for AVX-512",
}
OP_DEFS_SHARED = {"shape_fns.h", "shape_fns.cc"}

CC_STEMS = [row.stem for row in _ops_table.OPS if row.tf_ops]
PY_ONLY_STEMS = [row.stem for row in _ops_table.OPS if not row.tf_ops]
# Longest first: a file of hstu_dense_fuxi also starts with hstu_dense.
ALL_STEMS = sorted((row.stem for row in _ops_table.OPS), key=len, reverse=True)


def _files(pattern):
    return sorted(os.path.relpath(p, ROOT)
                  for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def _stem_and_suffix(name):
    """(stem, suffix) of a kernels/ file name, or (None, None) when it fits no rule."""
    for stem in ALL_STEMS:
        if name.startswith(stem) and name[len(stem):] in KERNEL_SUFFIXES:
            return stem, name[len(stem):]
    return None, None


def test_the_rule_sees_the_files():
    assert len(CC_STEMS) >= 16
    assert _files("op_defs/*.cc") and _files("kernels/*_kernels.cc")


@pytest.mark.parametrize("stem", CC_STEMS)
def test_stem_has_op_defs_and_kernels(stem):
    for path in (f"op_defs/{stem}.cc", f"kernels/{stem}_kernels.cc"):
        assert os.path.isfile(os.path.join(ROOT, path)), f"stem {stem} has no {path}"


def test_python_only_stems_have_no_cc():
    # Rows without TF ops (none today: lccl is not a row, its Python is recops_tf/distributed/).
    for stem in PY_ONLY_STEMS:
        assert not [p for p in _files("op_defs/*") + _files("kernels/*")
                    if os.path.basename(p).startswith(stem)], stem


def test_op_defs_holds_only_stems():
    stray = [p for p in _files("op_defs/*")
             if os.path.basename(p) not in OP_DEFS_SHARED
             and os.path.basename(p)[:-3] not in CC_STEMS]
    assert not stray, f"files of op_defs/ that are no stem's op definitions: {stray}"


def test_kernels_files_have_a_stem_and_an_agreed_suffix():
    stray = [p for p in _files("kernels/*") if os.path.isfile(os.path.join(ROOT, p))
             and _stem_and_suffix(os.path.basename(p))[0] not in CC_STEMS]
    assert not stray, (f"files of kernels/ not named <stem><suffix> for a stem of the ops table "
                       f"and a suffix of {sorted(KERNEL_SUFFIXES)}: {stray}")


def test_op_registrations_live_in_their_stem():
    # Each Recops> op is registered (REGISTER_OP) in its row's op_defs/<stem>.cc and its kernels
    # (Name("Recops>...")) in files of that stem.
    owner = {op: row.stem for row in _ops_table.OPS for op in row.tf_ops}
    for path in _files("op_defs/*.cc"):
        text = open(os.path.join(ROOT, path)).read()
        for op in re.findall(r'REGISTER_OP\("Recops>(\w+)"\)', text):
            assert path == f"op_defs/{owner[op]}.cc", f"{op} registered in {path}"
    for path in _files("kernels/**/*.cc"):
        text = open(os.path.join(ROOT, path)).read()
        for op in re.findall(r'Name\("Recops>(\w+)"\)', text):
            stem, _ = _stem_and_suffix(os.path.basename(path))
            assert stem == owner[op], f"kernel of {op} (stem {owner[op]}) registered in {path}"


def test_common_holds_only_shared_code():
    includes = {}  # common header -> stems whose kernel files include it
    for path in _files("kernels/*.*"):
        stem, _ = _stem_and_suffix(os.path.basename(path))
        for header in re.findall(r'#include "kernels/common/([\w.]+)"',
                                 open(os.path.join(ROOT, path)).read()):
            includes.setdefault(header, set()).add(stem)
    for path in _files("kernels/common/*"):
        name = os.path.basename(path)
        assert not any(name.startswith(stem) for stem in ALL_STEMS), (
            f"{path} is named after a stem: it belongs in kernels/")
        text = open(os.path.join(ROOT, path)).read()
        for mark in ("REGISTER_KERNEL_BUILDER", '"Recops>', "public tensorflow::ResourceBase"):
            # Kernels, op names and resources (the state of a stem's ops) belong to a stem.
            assert mark not in text, f"{path} has {mark}: that is a stem's code"
        if name.endswith(".h"):
            users = includes.get(name, set())
            assert len(users) >= 2, (
                f"{path} is included by the kernels of {sorted(users) or 'no stem'} only: "
                "one stem's code goes under that stem's name in kernels/")


# -- one list of compiler flags --------------------------------------------------------------

def _shared_copts():
    tree = ast.parse(open(os.path.join(ROOT, "build_flags.bzl")).read())
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and [t.id for t in node.targets] == ["RECOPS_COPTS"]]
    return ast.literal_eval(value)


def test_build_flags_list():
    flags = _shared_copts()
    assert flags and all(isinstance(f, str) and f.startswith("-") for f in flags)
    assert "-O3" in flags and "-march=native" not in flags


def test_bazel_uses_the_flags_list():
    build = open(os.path.join(ROOT, "BUILD")).read()
    assert 'load("//:build_flags.bzl", "RECOPS_COPTS")' in build
    copts = re.findall(r"copts\s*=\s*([^,\n]+)", build)
    # The list, and only CI's quick build (-O1, a check of the build) adds to it.
    assert copts == ["RECOPS_COPTS + select({"], copts
    assert re.search(r'":quick_build": \["-O1"\],\s*"//conditions:default": \[\]', build)


def test_setup_py_uses_the_flags_list():
    setup = open(os.path.join(ROOT, "setup.py")).read()
    assert "build_flags.bzl" in setup
    # No flag of the list is spelled out in setup.py (the sanitizer build removes two).
    for flag in _shared_copts():
        if flag not in ("-O3", "-g0"):
            assert f'"{flag}"' not in setup, f"setup.py spells out {flag}"


def test_library_was_built_with_the_flags_list():
    info_path = os.path.join(ROOT, "recops_tf", "_build_info.json")
    if not os.path.exists(info_path):
        pytest.skip("no in-place build")
    info = json.load(open(info_path))
    if info.get("build") == "bazel" or "-fsanitize" in info.get("compile_flags", ""):
        pytest.skip("not setup.py's optimised build")
    built = info["compile_flags"].split()
    assert [f for f in built if f in _shared_copts()] == _shared_copts()
