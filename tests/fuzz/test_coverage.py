"""The fuzzer's generator covers the language and the examples: every grammar rule and literal token
(grammar/tilec.lark), every function of tilec/lang/functions.py, every directive the compiler knows, and every
operation kind, epilogue and row chain the compiler selects for examples/*.tl. The lists are derived from those
sources (tilec/testing/coverage.py), so a construct added there and not generated makes this test fail."""
from __future__ import annotations

import pathlib
import random
import warnings

import pytest

from tilec.lang import api as lang
from tilec.testing import coverage
from tilec.testing.gen import generate
from tilec.testing.oracle import raw_schedule, with_schedule

ROOT = pathlib.Path(__file__).parents[2]
SEEDS = 500  # ~15 s: most constructs show up well before
# a function is one of a dozen picks at a rare node, so one can miss 500 seeds by chance (adding a function to
# the table shifts every later pick); the generator goes on, to this many seeds, only until each (and each family
# form) is seen once
MAX_SEEDS = 4000


FORMS = {  # the family forms the compiler is learning (pools, convs, data movement): generated, so each is checked
    # as soon as it compiles (until then a located rejection is a fine verdict), with the syntax that marks it
    ("conv", "padded"): "?? 0)", ("conv", "dilated"): " + 2*", ("conv", "depthwise"): "",
    ("pool", "padded"): "??", ("movement", "shift"): " + ", ("movement", "shift_padded"): "?? 0",
    ("movement", "upsample"): " / ", ("movement", "concat"): "", ("bmm", ""): "",
    ("block", "grouped"): "", ("block", "depthwise"): "", ("block", "residual"): "", ("block", "relu6"): "min(relu(",
    ("block", "dense"): "", ("epilogue", "conv"): "", ("epilogue", "matmul"): "", ("epilogue", "matvec"): "",
    ("nest", "running"): "",  # a read of a running statistic: refused at its line (gen_nests.py)
    ("operands", "softmax/plain"): " + 1)", ("gapped", "max"): "max=",  # (gen_operands.py)
    ("mixed", "softmax"): "exp(", ("mixed", "matmul"): "+=", ("scaled", "columns"): "=",  # (gen_mixed.py)
    ("vecmat", "vecmat/counted"): " + 1)", ("summed", "-"): "] - ",
    ("tconv", "floor"): " % ", ("tconv", "strided"): " + ", ("tconv", "view"): "",  # (gen_layers.py)
    ("axpool", "avgx"): "min(", ("bnorm", "affine"): "rsqrt(", ("gram", "cross"): "",
    ("pairwise", "sqdist"): ") * (", ("pairwise", "cosine"): "rsqrt(", ("decode", "inside"): "] / ",  # (gen_rows.py)
    ("accum", "lora"): "", ("accum", "3terms"): "", ("maskmean", "counted"): "",
}
FAMILY_FORMS: set[tuple[str, str]] = set()


@pytest.fixture(scope="module")
def generated() -> set[str]:
    seen: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = coverage.expected()
        for seed in range(MAX_SEEDS):
            if seed >= SEEDS and want <= seen and set(FORMS) <= FAMILY_FORMS:
                break
            case = generate(seed)
            family = "conv" if case.family == "conv_pool" else case.family
            for form in case.forms or ("",):
                mark = FORMS.get((family, form))
                if mark is not None and mark in case.text:
                    FAMILY_FORMS.add((family, form))
            program = lang.load(case.text)
            schedule = raw_schedule(program, random.Random(seed))
            seen |= coverage.constructs(case.text) | coverage.op_features(program)
            seen |= coverage.schedule_constructs(schedule)
            if seed % 5 == 0:  # as the oracle does for a fifth of the pairs: the schedule inside the program
                seen |= coverage.constructs(with_schedule(case.text, schedule))
    return seen


def test_the_expected_lists_come_from_the_sources():
    want = coverage.expected()
    assert {"rule:add", "rule:key_arg", "rule:schedule", "ASSIGN_OP:max=", "COMPARE_OP:!=", "DTYPE:bf16",
            "call:gelu", "call:bf16", "directive:compute_at"} <= want
    assert "rule:stmt" not in want  # `?stmt` is inlined: never a node of a parse tree


def test_generator_covers_the_grammar_functions_and_directives(generated):
    missing = sorted(coverage.expected() - generated)
    assert not missing, f"constructs the fuzzer never generates: {missing}"


def test_generator_covers_every_construct_of_the_examples(generated):
    examples = sorted((ROOT / "examples").glob("*.tl"))
    assert len(examples) >= 10
    want: set[str] = set()
    for path in examples:
        text = path.read_text()
        want |= coverage.constructs(text) | coverage.op_features(lang.load(text))
    assert {"op:conv+pool.maximum", "op:matmul+bias-x", "op:rowchain", "op:pool.add+scaled"} <= want
    missing = sorted(want - generated)
    assert not missing, f"constructs of examples/ the fuzzer never generates: {missing}"


def test_generator_makes_the_family_forms_the_compiler_is_learning(generated):
    missing = sorted(set(FORMS) - FAMILY_FORMS)
    assert not missing, f"family forms the fuzzer never generates: {missing}"
