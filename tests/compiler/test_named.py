"""Named sizes (tilec/compiler/named.py): the value is the int's, the text evaluates to it (Python as reference)."""
import copy
import pickle

import pytest

from tilec.compiler.named import MAX_OPS, Named, evaluate, name, renamed, show, text_of, words

K, TK, M = Named(1024, "SIZE_K"), Named(128, "TILE_K"), Named(512, "SIZE_M")
VALUES = {"SIZE_K": 1024, "TILE_K": 128, "SIZE_M": 512}


@pytest.mark.parametrize("expr, text", [
    (lambda: K // TK, "SIZE_K // TILE_K"),
    (lambda: K // TK * M, "SIZE_K // TILE_K * SIZE_M"),
    (lambda: M * (K // TK), "SIZE_M * (SIZE_K // TILE_K)"),
    (lambda: K - (M - TK), "SIZE_K - (SIZE_M - TILE_K)"),
    (lambda: K // (TK * 2), "SIZE_K // (TILE_K * 2)"),
    (lambda: 2 * TK + 3, "2 * TILE_K + 3"),
    (lambda: (K + M) * TK, "(SIZE_K + SIZE_M) * TILE_K"),
    (lambda: K + K, "2 * SIZE_K"),
    (lambda: (K - -1 - 1) // TK, "SIZE_K // TILE_K"),
    (lambda: K + -3, "SIZE_K - 3"),
    (lambda: TK - 1 + 1, "TILE_K"),
    (lambda: K // TK * TK, "SIZE_K"),
    (lambda: TK * (K // TK), "SIZE_K"),
    (lambda: (K + 3) // TK * TK, "(SIZE_K + 3) // TILE_K * TILE_K"),
])
def test_arithmetic_keeps_a_text_that_evaluates_to_the_value(expr, text):
    x = expr()
    assert text_of(x) == text
    assert evaluate(text, VALUES) == x == eval(text, {}, VALUES)  # Python's own reading of the printed text


def test_other_operations_are_plain_ints():
    for x in (K % TK, -K, -2 * K, K // -2, -1 + K, K - K, TK - M, K * 0, K + M + K + M + K):
        assert not isinstance(x, Named)
    assert isinstance(K / TK, float)
    assert text_of(K + M + K + M).count("+") == MAX_OPS


def test_identities_keep_the_operand():
    assert text_of(K * 1) == text_of(1 * K) == text_of(K + 0) == text_of(0 + K) == text_of(K // 1) == "SIZE_K"
    assert text_of(sum([K])) == "SIZE_K"


def test_value_behaves_as_the_int():
    x = K // TK
    assert x == 8 and hash(x) == hash(8) and str(x) == repr(x) == f"{x}" == "8" and f"{x:>3}" == "  8"
    assert {x: "a"}[8] == "a" and (x, 1) == (8, 1)
    for y in (copy.deepcopy(x), pickle.loads(pickle.dumps(x))):
        assert y == 8 and text_of(y) == "SIZE_K // TILE_K"
    assert show(x) == "SIZE_K // TILE_K" and show(8) == "8"
    assert name(True, "TILE_K") is True and not isinstance(name(4, "not a name"), Named)


def test_evaluate_reports_undeclared_names_and_other_operators():
    with pytest.raises(KeyError):
        evaluate("SIZE_K // TILE_X", VALUES)
    with pytest.raises(ValueError):
        evaluate("SIZE_K % TILE_K", VALUES)
    with pytest.raises(ValueError):
        evaluate("f(SIZE_K)", VALUES)


def test_renamed_rewrites_whole_identifiers_only():
    x = renamed(K // TK, {"TILE_K": "Y_TILE_K", "K": "nope"})
    assert text_of(x) == "SIZE_K // Y_TILE_K" and x == 8
    assert renamed(8, {"TILE_K": "Y_TILE_K"}) == 8
    y = renamed(Named(3, "名前_TILE_C // 2"), {"名前_TILE_C": "X_名前_TILE_C", "_TILE_C": "no"})  # Unicode identifiers
    assert text_of(y) == "X_名前_TILE_C // 2" and words(text_of(y)) == {"X_名前_TILE_C"}
