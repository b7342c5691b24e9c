"""Data-layout primitives on level A (tilec/compiler/layout.py): reshape, stage_out, broadcast (and stage's
resident and near options); each tested by
meaning (the nest evaluates to the same values before and after), by a before/after golden, and its illegal uses
by error goldens."""
from __future__ import annotations

import numpy as np
import pytest

from compiler_helpers import inputs_for
from test_primitives import _diff, kernel_of
from test_reduce_rule import _nest, program
from tilec.compiler import layout, primitives as pr
from tilec.compiler.lower import lower
from tilec.compiler.lower_tiles import colreduce_nest
from tilec.compiler.nest import print_nest
from tilec.compiler.nest_eval import evaluate_nest
from tilec.compiler.select import select
from tilec.errors import TilecError
from tilec.lang import api as lang

ADD = """kernel add(X: f32[M, N], Z: f32[M, N]) -> Y
  default M = 16, N = 64
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = X[i, j] + Z[i, j]
"""
BCAST = """kernel bc(X: f32[B, M, N], c: f32[M], s: f32[N]) -> Y
  default B = 2, M = 8, N = 12
  Y: f32[B, M, N]
  for b in 0..B, i in 0..M, j in 0..N:
    Y[b, i, j] = X[b, i, j] * s[j] - c[i]
"""
SHIFT = """kernel sh(X: f32[M, N]) -> Y
  default M = 8, N = 9
  Y: f32[M, N]
  for i in 0..M, j in 0..N - 1:
    Y[i, j] = X[i, j + 1]
"""
UNIT = """kernel u(X: f32[B, C, H, W]) -> Y
  default B = 3, C = 1, H = 1, W = 4
  Y: f32[B, H, W, C]
  for b in 0..B, c in 0..C, h in 0..H, w in 0..W:
    Y[b, h, w, c] = X[b, c, h, w]
"""

ONE = """kernel one(A: f32[N, M, P], c: f32[M]) -> Y
  default N = 6, M = 1, P = 4
  Y: f32[N, M, P]
  for n in 0..N, m in 0..M, p in 0..P:
    Y[n, m, p] = 2 * c[m] + 1
"""

MIDUNIT = """kernel mu(X: f32[M, U, N], c: f32[M, N]) -> Y
  default M = 4, U = 1, N = 6
  Y: f32[M, U, N]
  for i in 0..M, u in 0..U, j in 0..N:
    Y[i, u, j] = 2 * X[i, u, j] + c[i, j]
"""


def _constant_read(k):
    """A one-element column laid out away (its unit loop in no group: c_v[0, 0]), then the nest flattened: the
    read of one element is kept as it is (rules._unit_column_alone)."""
    k = layout.reshape(k, "n", (("q", 6), ("g", 4)), groups=(("n",), ("p",)))
    return layout.reshape(k, "q", (("p", 3), ("f", 8)), views=(("Y_v", "Y_flat"),))


def _flat_tiles(k):
    k = layout.reshape(k, "i", (("p", 8), ("f", 128)))
    k = pr.reorder(pr.split(k, "f", 32, outer="t", inner="f_i", name="TILE_F"), "t", "p")
    return layout.stage_out(k, "Y_v", "t", name="Y_tile")


def _row_broadcast(k):
    k = layout.reshape(k, "b", (("o", 2), ("p", 8), ("f", 12)))
    k = pr.stage(k, "s_v", "o", name="s_row")
    return layout.broadcast(k, "s_row", "o", "p", name="s_tile")


TRANS = """kernel tr(X: f32[M, N]) -> Y
  default M = 16, N = 12
  Y: f32[N, M]
  for i in 0..M, j in 0..N:
    Y[j, i] = X[i, j]
"""


def _strips(k):
    k = pr.split(pr.split(k, "i", 4, outer="i_o", inner="i_i"), "i_o", 2, outer="bi", inner="ai")
    k = pr.reorder(k, "bi", "j", "ai", "i_i")
    return layout.stage_grouped(k, "X", "j", (("i_i",), ("ai",)), name="X_strip")


MEAN_F16 = program(term="A[i, j] / N", init="b[i]", m=16, n=12, out="f16", extra=", b: f32[M]")


def _epilogue_at_rows(k):
    """A mean from b[i] into f16 (reduce_nest: the reduction, then `s = s * 1/12`, then `s = s + b`): the two
    epilogue nests computed at the row loop, b loaded just before its step, the row's value in an fp32 tile cast to
    f16 before the store."""
    k = pr.fold_init(k, "s")
    k = pr.reverse_compute_at(pr.reverse_compute_at(k, "i#1", "i#0"), "i#1", "i#0")
    k = pr.stage(k, "b", "i", name="b_col", near=True)
    return layout.stage_out(k, "s", "i", name="s_acc", dtype="f32", cast="s_tile")


def _ragged_rows(k):
    """Ragged row tiles (rules.reduce): the reduction cut into rows 0..10 and 10..16 (cutting its own loop keeps
    the order), its first epilogue step cut alike and computed at each part's rows (the second part's reduction
    sits between the first part and its epilogue, on other rows); the second step stays after them."""
    k = layout.cut(layout.cut(pr.fold_init(k, "s"), "i#0", 10), "i#0", 10)
    return pr.reverse_compute_at(pr.reverse_compute_at(k, "i@a#1", "i@a#0"), "i@b#1", "i@b#0")


MIDSUM = """kernel midsum(A: f32[B, M, N]) -> s
  default B = 3, M = 8, N = 6
  s: f32[B, N]
  for b in 0..B, n in 0..N:
    s[b, n] = 0
  for b in 0..B, m in 0..M, n in 0..N:
    s[b, n] += A[b, m, n]
"""


def _column_rows(k):
    """A middle sum over (o, r, f): s[b, n] skips the reduced loop, so its view gets a unit dimension there
    (s_v[o, 0, f], a row per o); the row of sums staged in PSUM per o and evicted to SBUF before the store."""
    k = layout.reshape(pr.fold_init(k, "s"), "b", (("o", 3), ("r", 8), ("f", 6)))
    k = pr.partition(pr.reorder(k, "o", "f", "r"), "r", summed=True)
    return layout.stage_out(k, "s_v", "o", memory="psum", name="s_acc", dtype="f32", cast="s_row")


MIDMEAN = """kernel midmean(A: f32[B, M, N]) -> s
  default B = 3, M = 8, N = 6
  s: f32[B, N]
  for b in 0..B, n in 0..N:
    s[b, n] = 0
    for m in 0..M:
      s[b, n] += A[b, m, n] / M
"""
COLMEAN = """kernel colmean(A: f32[M, N]) -> s
  default M = 8, N = 6
  s: f32[N]
  for j in 0..N:
    s[j] = 0
  for i in 0..M, j in 0..N:
    s[j] += A[i, j] / M
"""


def _column_nest(text: str):
    """A column sum's nest as the column rule sees it (lower_tiles.colreduce_nest: the sum, then its epilogue)."""
    prog = lang.load(text)
    nest = colreduce_nest(select(lower(prog.kernel, prog.sizes), prog)[0], prog)
    assert nest is not None
    return prog, nest


def _column_epilogue(k):
    """A middle mean (the sum, then `s = s * 1/8`): the epilogue reshaped onto the rows of sums with e_u naming the
    unit dimension of s_v the sum writes (`units`), computed at o; the row of each o staged in fp32 SBUF, and the
    sum alone (`of=f`) staged in PSUM, copied into that row after it: the epilogue works on the copy."""
    k = layout.reshape(pr.fold_init(k, "s"), "b#0", (("o", 3), ("r", 8), ("f", 6)), groups=(("b",), ("m",), ("n",)))
    k = layout.reshape(k, "b", (("e", 3), ("e_u", 1), ("e_f", 6)), groups=(("b",), (), ("n",)), units=("e_u",),
                       views=(("s", "s_v"),))
    k = pr.partition(pr.reorder(k, "o", "f", "r"), "r", summed=True)
    k = layout.stage_out(pr.reverse_compute_at(k, "e", "o"), "s_v", "o", name="s_row")
    return layout.stage_out(k, "s_row", "o", memory="psum", name="s_acc", of="f")


def _column_banks(k):
    """The middle mean with its free loop split into banks (w, rules.colreduce's wide loads): the factor computed
    at each bank, inside the statement that writes the row (a read after the write, in order: not early), the row
    staged at o, each bank's sum alone in PSUM, copied into the row before the factor reads it."""
    k = layout.reshape(pr.fold_init(k, "s"), "b#0", (("o", 3), ("r", 8), ("f", 6)), groups=(("b",), ("m",), ("n",)))
    k = layout.reshape(k, "b", (("e", 3), ("e_u", 1), ("e_f", 6)), groups=(("b",), (), ("n",)), units=("e_u",),
                       views=(("s", "s_v"),))
    k = pr.partition(pr.reorder(pr.split(k, "f", 3, outer="w", inner="f_i"), "o", "w", "r", "f_i"), "r", summed=True)
    k = layout.stage_out(pr.reverse_compute_at(k, "e", "w"), "s_v", "o", name="s_row")
    return layout.stage_out(k, "s_row", "w", memory="psum", name="s_acc", of="r")


def _stacked_rows(k):
    """Three o's of 8 rows stacked (rules.colreduce): the view's (k, r) dimensions merged, A_v[o, 8*k + r, f]."""
    k = layout.reshape(pr.fold_init(k, "s"), "b#0", (("o", 1), ("k", 3), ("r", 8), ("f", 6)), unit=False)
    return layout.merge_dims(k, "A_v", 1)


def _whole_kernel(k):
    """The same epilogue once over all rows after the reduction: the result staged for the whole kernel."""
    return layout.stage_out(pr.fold_init(k, "s"), "s", "", name="s_col", dtype="f32")


def _resident(k):
    """X loaded whole into one tile, each tile of 4 rows copied into its own part."""
    return pr.stage(pr.split(k, "i", 4, outer="i_o", inner="i_i"), "X", "i_o", name="X_all", resident=True)


def _rows_as_columns(k):
    """Rows grouped 4 per partition: s[i] over (p, g, f) viewed as s_v[p, g] (unit=False), and the epilogues'
    reshape onto (e, e_u) with a new unit loop iterating no old loop (an empty group)."""
    k = layout.reshape(pr.fold_init(k, "s"), "i#0", (("p", 4), ("g", 4), ("f", 12)), unit=False)
    return layout.reshape(k, "i#0", (("e", 16), ("e_u", 1)), groups=(("i",), ()))


CASES = {  # name -> (program, primitives applied to the level-A kernel)
    "stage_out_epilogue": (MEAN_F16, _epilogue_at_rows),
    "stage_out_whole_kernel": (MEAN_F16, _whole_kernel),
    "reshape_stage_out_psum_column_rows": (MIDSUM, _column_rows),
    "cut_reduction_rows": (MEAN_F16, _ragged_rows),
    "stage_resident": (ADD, _resident),
    "reshape_rows_as_columns": (MEAN_F16, _rows_as_columns),
    "reshape": (ADD, lambda k: layout.reshape(k, "i", (("p", 8), ("f", 128)))),
    "reshape_broadcast": (BCAST, lambda k: layout.reshape(k, "b", (("o", 2), ("p", 8), ("f", 12)))),
    "reshape_unit_loops": (UNIT, lambda k: layout.reshape(k, "b", (("bt", 3), ("i", 1), ("j", 4)),
                                                           groups=(("b",), ("c",), ("h", "w")))),
    "stage_out": (ADD, _flat_tiles),
    "stage_out_of_nest": (MIDMEAN, _column_epilogue),
    "stage_out_read_after_write": (MIDMEAN, _column_banks),
    "merge_dims": (MIDMEAN, _stacked_rows),
    "reshape_units": (COLMEAN, lambda k: layout.reshape(k, "j#2", (("e_u", 1), ("e_f", 6)), groups=((), ("j",)),
                                                        units=("e_u",))),
    "broadcast": (BCAST, _row_broadcast),
    "reshape_constant_read": (ONE, _constant_read),
    # c[i, j] skips the loop of one iteration: the same elements as c[i, 0, j], one run (fuzz l44/l45)
    "reshape_skips_unit_loop": (MIDUNIT, lambda k: layout.reshape(k, "i", (("p", 8), ("f", 3)))),
    "stage_grouped": (TRANS, _strips),
    "cut": (TRANS, lambda k: layout.cut(layout.cut(k, "i", 12), "j@a", 8, root="i@a")),
    "broadcast_whole": (BCAST, lambda k: layout.broadcast(
        pr.stage(layout.reshape(k, "b", (("o", 2), ("p", 8), ("f", 12))), "s_v", "", name="s_row"),
        "s_row", "", "p", name="s_tile")),
}


def _before(text: str):
    """(program, the level-A nest a case starts from): the reduction's own nest for reductions."""
    if text is MEAN_F16:
        return _nest(text)[::2]
    return _column_nest(text) if text in (MIDMEAN, COLMEAN) else kernel_of(text)


@pytest.mark.parametrize("name", sorted(CASES))
def test_layout_primitive_keeps_the_meaning(name: str, golden) -> None:
    text, apply = CASES[name]
    prog, before = _before(text)
    after = apply(before)
    inputs = inputs_for(prog)
    want, got = evaluate_nest(before, inputs), evaluate_nest(after, inputs)
    for out in want:  # the f16 mean rounds once, after its fp32 epilogue (before: after each epilogue step)
        np.testing.assert_allclose(got[out], want[out], rtol=1e-3 if text is MEAN_F16 else 1e-6)
    golden.check(f"compiler/layout/{name}.txt", _diff(print_nest(before), print_nest(after)))


def test_reshape_names_views_apart_from_user_tensors() -> None:
    prog, k = kernel_of(ADD.replace("Z", "X_v"))
    after = layout.reshape(k, "i", (("p", 8), ("f", 128)))
    assert "view X_v2: hbm f32[8, 128] = X" in print_nest(after)
    assert "view X_v_v: hbm f32[8, 128] = X_v" in print_nest(after)
    inputs = inputs_for(prog)
    np.testing.assert_allclose(evaluate_nest(after, inputs)["Y"], evaluate_nest(k, inputs)["Y"])


ERRORS = {
    "reshape_wrong_size": (ADD, lambda k: layout.reshape(k, "i", (("p", 8), ("f", 100)))),
    "reshape_shifted_read": (SHIFT, lambda k: layout.reshape(k, "i", (("p", 64),))),
    "reshape_broadcast_split": (BCAST, lambda k: layout.reshape(k, "b", (("p", 4), ("f", 48)))),
    "reshape_groups_out_of_order": (UNIT, lambda k: layout.reshape(k, "b", (("j", 4), ("bt", 3)),
                                                                   groups=(("w",), ("b",)))),
    "reshape_one_element_column_split": (ONE, lambda k: layout.reshape(k, "n", (("p", 3), ("f", 8)))),
    "stage_out_not_written": (ADD, lambda k: layout.stage_out(k, "X", "i")),
    "stage_out_read_first": (MEAN_F16, lambda k: layout.stage_out(k, "s", "i#2")),  # s = s * c reads the old s
    "broadcast_not_a_row": (ADD, lambda k: layout.broadcast(k, "X", "i", "j")),
    "cut_outside": (TRANS, lambda k: layout.cut(k, "i", 16)),
    "cut_distributes_a_reduction": (MEAN_F16, lambda k: layout.cut(k, "j", 6, root="i#1")),
    "reverse_compute_at_past_its_rows": (MEAN_F16, lambda k: pr.reverse_compute_at(
        layout.cut(pr.fold_init(k, "s"), "i#0", 10), "i#0", "i@a")),
    "stage_out_of_not_a_nest": (MIDMEAN, lambda k: layout.stage_out(k, "s", "b#1", of="n")),
    "merge_dims_not_a_view": (MIDMEAN, lambda k: layout.merge_dims(k, "A", 1)),
    "merge_dims_last_dimension": (MIDMEAN, lambda k: layout.merge_dims(
        layout.reshape(pr.fold_init(k, "s"), "b#0", (("o", 3), ("r", 8), ("f", 6))), "A_v", 2)),
    "stage_out_of_reads": (MIDMEAN, lambda k: layout.stage_out(k, "s", "b#2", of="n")),  # s = s * c reads s
    "reshape_units_not_unit": (COLMEAN, lambda k: layout.reshape(k, "j#2", (("e_u", 1), ("e_f", 6)),
                                                                 groups=((), ("j",)), units=("e_f",))),
    "stage_grouped_not_contiguous": (TRANS, lambda k: layout.stage_grouped(
        pr.split(k, "i", 4, outer="i_o", inner="i_i"), "X", "i_o", (("j", "i_i"),))),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_illegal_layout_primitives_are_user_errors(name: str, golden) -> None:
    text, apply = ERRORS[name]
    with pytest.raises(TilecError) as info:
        apply(_before(text)[1] if text is not MEAN_F16 else _nest(text)[2])
    golden.check(f"compiler/layout/errors/{name}.txt", info.value.render() + "\n")
