"""Repo-level checks: every op is complete (table row, wrapper, reference, test, docs,
benchmark shapes, gradient) and the generated files are fresh."""
import doctest
import importlib
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

import recops_tf
from recops_tf import _loader, _ops_table
from recops_tf.testing import cases, regen, smoke

ROOT = regen.ROOT
OP_NAMES = _loader.op_names()


def test_library_has_ops():
    assert len(OP_NAMES) >= 7
    assert all(name.startswith("Recops>") for name in OP_NAMES)


def test_every_op_has_a_table_row_and_every_row_an_op():
    table_ops = {"Recops>" + t for row in _ops_table.OPS for t in row.tf_ops}
    assert table_ops == set(OP_NAMES)


@pytest.mark.parametrize("row", _ops_table.OPS, ids=lambda r: r.stem)
def test_row_is_complete(row):
    reference = importlib.import_module(f"recops_tf.reference.{row.stem}")
    assert len(row.reference) == len(row.public)
    for public, ref in zip(row.public, row.reference):
        fn = getattr(recops_tf, public)
        doc = fn.__doc__ or ""
        for section in ("Args:", "Returns:", "Raises:", "Gradient", ">>>"):
            assert section in doc, f"recops_tf.{public} docstring lacks {section!r}"
        assert callable(getattr(reference, ref))
    assert os.path.exists(os.path.join(ROOT, "tests", "ops", f"test_{row.stem}.py"))
    assert row.bound in ("memory", "compute")
    assert row.bench["tiny"] and row.bench["full"]
    assert row.stem in cases.BUILDERS
    for shape in row.bench["tiny"]:
        case = cases.build(row.stem, shape)
        assert case.bytes_forward > 0 or case.flops_forward > 0


STATEFUL_OPS = {"Recops>" + t for row in _ops_table.OPS if row.stateful for t in row.tf_ops}


@pytest.mark.parametrize("op_name", OP_NAMES)
def test_every_op_has_a_gradient_decision(op_name):
    # Every op registers its gradient (lookup raises when none is registered). The functional
    # ops are all differentiable (the backward ops too: they are linear); the stateful ones
    # (table ops, optimizer steps) are registered as not differentiable, except the by-address
    # lookup, whose gradient is the IndexedSlices an optimizer applies.
    gradient = tf_ops.gradient_registry.lookup(op_name)
    if op_name not in STATEFUL_OPS or op_name == "Recops>EmbeddingLookupByAddress":
        assert gradient is not None
    else:
        assert gradient is None


def test_smoke_run_exercises_every_op():
    assert smoke.run_all() == OP_NAMES


# Generated files: (regen target, committed path, generator, what a difference means).
GENERATED = [
    ("golden", regen.GOLDEN_PATH, regen.golden_text,
     "The library's OpDefs differ from tests/golden/ops.pbtxt (an interface change)"),
    ("docs", regen.DOCS_PATH, regen.docs_text, "docs/ops.md is stale"),
    ("docs", regen.REFERENCE_PATH, regen.reference_text,
     "docs/api.md (layers, optimizers, tables, distributed) is stale"),
    ("api", regen.API_PATH, regen.api_text,
     "A public function's or class's signature differs from tests/golden/api.txt"),
    ("robustness", regen.ROBUSTNESS_PATH, regen.robustness_text,
     "docs/robustness.md's validation rules are stale"),
]


@pytest.mark.parametrize("target, path, generate, what", GENERATED,
                         ids=[os.path.basename(g[1]) for g in GENERATED])
def test_generated_file_is_fresh(target, path, generate, what):
    with open(path) as f:
        committed = f.read()
    assert committed == generate(), (
        f"{what}. If the change is intended, run `python tools/regen.py {target}` and commit "
        "the diff.")


def test_every_generated_file_has_a_regen_target():
    assert {(target, path) for target, path, _, _ in GENERATED} == {
        (target, path) for target, files in regen.TARGETS.items() for path, _ in files}


def test_api_reference_covers_every_public_class_and_function():
    text = regen.reference_text()
    for _, module_name, names, _ in regen.REFERENCE_SECTIONS:
        module = importlib.import_module(module_name)
        for name in names or module.__all__:
            assert f"### `{module_name}.{name}(" in text, f"{module_name}.{name} undocumented"


def test_robustness_rules_are_sentences():
    rule = regen.Rule("test_error_x_rank", "`recops_tf.gather_for_rank1`",
                      "InvalidArgumentError or ValueError", "rank")
    assert regen.rule_sentence(rule) == ("`recops_tf.gather_for_rank1` raises "
                                         "InvalidArgumentError or ValueError naming “rank” "
                                         "(x rank).")
    rule = regen.Rule("test_error_offsets_start", "`recops_tf.concat_jagged_tensor`",
                      "InvalidArgumentError", r"offsets_a\[0\] must be 0, got 1")
    assert regen.rule_sentence(rule).endswith(": “offsets_a[0] must be 0, got 1” "
                                              "(offsets start).")
    # A short pattern is completed from the library's own message when one matches it.
    raised = {"ops/x.py": [("ValueError", "give both timestamp_bias and position_bias")]}
    rule = regen.Rule("test_error_only_one_bias", "`f`", "ValueError", "both")
    assert "“give both timestamp_bias and position_bias”" in regen.rule_sentence(rule, raised)
    rules = regen.robustness_rules_text().splitlines()
    listed = [line for line in rules if line.startswith("- ")]
    assert listed and all(re.fullmatch(r"- `[^`]+`.* raises \w.*\(.+\)\.", line)
                          for line in listed), [x for x in listed if " raises " not in x][:3]


def test_benchmarks_lead_with_the_results():
    with open(os.path.join(ROOT, "docs", "benchmarks.md")) as f:
        text = f.read()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[:2] == ["Results", "Details and history"]
    results = text.split("## Results", 1)[1].split("## Details and history", 1)[0]
    stems = {line.split("|")[1].strip() for line in results.splitlines()
             if line.startswith("| ") and not line.startswith("| stem")}
    assert stems == {row.stem for row in _ops_table.OPS}


@pytest.mark.parametrize("row", _ops_table.OPS, ids=lambda r: r.stem)
def test_docstring_examples_run(row):
    module = importlib.import_module(f"recops_tf.ops.{row.stem}")
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    examples = 0
    for name in row.public:
        for test in finder.find(getattr(module, name), name,
                                globs={**vars(module), "tf": tf, "np": np}):
            examples += len(test.examples)
            runner.run(test)
    assert examples > 0
    assert runner.failures == 0, f"{runner.failures} docstring example(s) failed"
