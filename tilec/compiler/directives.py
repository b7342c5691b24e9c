"""Applying schedule directives: one function per directive (the table APPLY), each checking legality against
the hardware limits and returning the updated plan. A directive that cannot be honoured is a TilecError pointing
at it and saying why. The directive set is documented in schedule.py; each function's docstring shows the IR
before/after as lines copied from its golden file (tests/golden/compiler/directives/*.txt, the full diffs);
tests/compiler/test_ir_golden.py checks that every such line is still in the golden.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, fields, replace

from tilec.compiler import build_mlp, directives_reduce
from tilec.compiler.primitives import UNROLL_MAX
from tilec.compiler.schedule import (MOVING_FMAX, PMAX, PSUM_BANK, REDUCE_FREE, ConvPlan, EltwisePlan,
                                     Plan, PoolPlan, ReducePlan, TransposePlan, best_divisor, default_plan, divisors,
                                     eltwise_free, eltwise_loop, eltwise_trips, fmt_arg, fmt_directive, row_free,
                                     rows_per_outer, sbuf_budget, var_of)
from tilec.compiler.ops import ColumnReduceOp, ConvOp, EltwiseOp, Op, PoolOp, ReduceOp, TransposeOp
from tilec.compiler.placement import chain_consumer, chain_reason, hbm_reason, kind, reads
from tilec.errors import TilecError
from tilec.lang import syntax as sx
from tilec.target import Target, target as get_target


def bad(d: sx.Directive | sx.Ref | sx.KeyArg | int, message: str, hint: str = "") -> TilecError:
    return TilecError(message, getattr(d, "span", None), hint)


def _roles(op: Op) -> dict[str, str]:
    """.tl loop variable -> role; a conv's own loops win over the fused pool's loops of the same name."""
    ordered = sorted(op.vars, key=lambda rv: not rv[0].startswith("pool_"))
    return {var: role for role, var in ordered}


def ref_role(op: Op, ref, d: sx.Directive) -> str:
    """`conv.y` -> the role "y" of loop variable y in op conv."""
    if not isinstance(ref, sx.Ref) or len(ref.parts) != 2:
        raise bad(ref if isinstance(ref, sx.Ref) else d, "expected a loop reference like conv.y")
    roles = _roles(op)
    if ref.parts[1] not in roles:
        consumer = ref.parts[0] != op.name  # `compute_at conv, Y.i` names a loop of the fused consumer Y
        known = ", ".join(sorted(var for role, var in op.vars if role.startswith("pool_") == consumer))
        into = None if consumer else _merged_into(op, ref.parts[1], roles)
        if into is not None:
            raise bad(ref, f"{op.name}'s loop `{ref.parts[1]}` is merged with `{into}` into one axis (the "
                           f"{type(op).__name__.removesuffix('Op').lower()} moves consecutive loops together): a "
                           f"directive names the axis by its first loop", f"write {op.name}.{into}; its loops are: "
                                                                          f"{known}")
        raise bad(ref, f"{ref.parts[0]} has no loop `{ref.parts[1]}`", f"its loops are: {known}")
    return roles[ref.parts[1]]


def _merged_into(op: Op, var: str, roles: dict[str, str]) -> str | None:
    """The loop that names the axis `var` was merged into (a permute's consecutive loops `a, b` -> one axis `a`):
    the nearest of the op's loops before it in the source's index order; None when `var` is not a source loop."""
    order = list(getattr(op, "src_vars", ()))
    if var not in order:
        return None
    before = [v for v in order[:order.index(var)] if v in roles]
    return before[-1] if before else None


KEYWORDS = {"tile": "factor", "split": "factor"}  # `tile conv.k, factor=128`: the size by name (the grammar's form)


def _int(d: sx.Directive, i: int) -> int:
    arg = d.args[i] if len(d.args) > i else None
    if isinstance(arg, sx.KeyArg):
        if arg.key != KEYWORDS.get(d.name):
            hint = f"write `{KEYWORDS[d.name]}=N` or just N" if d.name in KEYWORDS else "write the number alone"
            raise bad(arg, f"`{d.name}` has no argument named `{arg.key}`", hint)
        arg = arg.value
    if not isinstance(arg, int) or arg <= 0:
        raise bad(d, f"`{d.name}` needs a positive integer as argument {i + 1}")
    return arg


def _loop(d: sx.Directive, i: int = 0) -> str:
    """The loop variable of argument i, a reference `op.loop` that ref_role has already checked."""
    ref = d.args[i]
    assert isinstance(ref, sx.Ref)
    return ref.parts[1]


def _div(d: sx.Directive, value: int, extent: int, what: str, layout: str = "") -> None:
    if extent % value:
        raise bad(d, f"{what} of {value} does not divide the extent {extent}{layout}",
                  f"use a divisor of {extent}: {', '.join(map(str, divisors(extent)[:12]))}")


def _whole_rows(op: EltwiseOp, plan: EltwisePlan, n: int) -> bool:
    """Whether tiles n wide keep broadcast rows copied whole (schedule.row_free): then they need not fit the one
    PSUM bank a row tile goes through (the default plan's 1024-wide tiles of `X + b[j]`)."""
    P = op.dim("P")
    return row_free(op.dim("F"), n, len(op.rows), rows_per_outer(op), P % min(plan.parts, P) != 0) == n


def apply_tile(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`tile conv.k, 64`: the tile size of one loop. Before/after, verbatim from its golden
    (golden excerpt: tests/golden/compiler/directives/tile.txt):

        -  const TILE_K = 128
        +  const TILE_K = 64
        -    for k_t in affine(2):  # tl:14
        +    for k_t in affine(4):  # tl:14
        -          alloc Wt_tp: psum f32[128, 3, 128]  # tl:14
        +          alloc Wt_tp: psum f32[128, 3, 64]  # tl:14
    """
    role, n = ref_role(op, d.args[0], d), _int(d, 1)
    if isinstance(plan, ConvPlan):
        assert isinstance(op, ConvOp)  # default_plan gives each op kind its own plan kind
        return _tile_conv(op, plan, d, role, n)
    if isinstance(plan, EltwisePlan):
        assert isinstance(op, EltwiseOp)
        if eltwise_loop(op, _loop(d)) != "t":
            return _tile_partitions(op, plan, d, n)
        free = eltwise_free(op, plan.parts)  # the tile counts elements per partition, not along the user's loop
        if n > free:  # (a tile that does not divide them is ragged: whole tiles and a smaller last one)
            raise bad(d, f"a tile of {n} elements is wider than the {free} each partition holds (the data is laid "
                         f"out as {plan.parts} partitions x {free} elements each)", f"use at most {free}")
        if op.rows and n > MOVING_FMAX and not _whole_rows(op, plan, n):
            raise bad(d, f"a tile of {n} elements is wider than the {MOVING_FMAX} columns one matmul broadcasts "
                         f"{', '.join(op.rows)} across the partitions", f"use at most {MOVING_FMAX}")
        return replace(plan, free=n)
    if isinstance(plan, ReducePlan):
        return _tile_reduce(op, plan, d, role, n)
    if isinstance(plan, TransposePlan):
        if n > PMAX:
            raise bad(d, f"tile of {n} on the partition dimension exceeds {PMAX}",
                      "a PE transpose moves at most 128x128 elements")
        if plan.ragged:  # a tile chooses whole blocks: start from square blocks of the largest common divisor
            # (one block per strip: the ragged plan's strips counted its 128-blocks and need not divide these)
            plan = replace(plan, ragged=False, tile=best_divisor(math.gcd(op.dim("M"), op.dim("N")), PMAX),
                           tile_j=0, bi=1, bj=1)
        if role == "j":  # the block's columns (rows of the output blocks)
            _div(d, n, op.dim("N"), "tile")
            return replace(plan, tile_j=0 if n == plan.tile else n, bj=1)
        _div(d, n, op.dim("M"), "tile")
        tj = plan.tj if op.dim("N") % plan.tj == 0 and plan.tile_j else n if op.dim("N") % n == 0 else plan.tj
        return replace(plan, tile=n, tile_j=0 if tj == n else tj, bi=1, bj=1)
    if role != "b":
        raise bad(d, f"pool loop `{_loop(d)}` cannot be tiled; tile the channel loop or split rows")
    if n > PMAX:
        raise bad(d, f"tile of {n} on the partition dimension exceeds {PMAX}")
    _div(d, n, op.dim("B"), "tile")
    return replace(plan, tile_b=n)


def _tile_partitions(op: EltwiseOp, plan: EltwisePlan, d: sx.Directive, n: int) -> EltwisePlan:
    """`tile Y.i, 64` with i in the partition run of a broadcast layout (`Y[i, j] = X[i, j] - c[i]`): 64 partitions
    per tile (a tile that does not divide the rows leaves a smaller last one); a loop of the outer run has no tile."""
    a, b = op.run
    names = [var for _, var in op.vars]
    if eltwise_loop(op, _loop(d)) == "o":
        raise bad(d, f"`{_loop(d)}` is an outer loop of {op.name}'s layout (outer {', '.join(names[:a])} x partitions "
                     f"{', '.join(names[a:b])} x free {', '.join(names[b:]) or '-'}): the kernel takes its indices one "
                     f"at a time, it has no tile", f"tile {op.name}.{names[a]} (partitions) or a free loop")
    if n > PMAX:
        raise bad(d, f"a tile of {n} on the partition dimension exceeds {PMAX}", f"use at most {PMAX}")
    if n > op.dim("P"):
        raise bad(d, f"a tile of {n} partitions is more than the {op.dim('P')} rows of {', '.join(names[a:b])}",
                  f"use at most {op.dim('P')}")
    return replace(plan, parts=n)


def _tile_reduce(op: Op, plan: ReducePlan, d: sx.Directive, role: str, n: int) -> ReducePlan:
    """A kept loop: rows per partition tile; a reduced loop: elements per partition of one tensor_reduce. Both
    count the flattened dims (`s[b, i] += A[b, i, j]`: rows of b*i). A column sum puts the reduced rows on the
    partitions and the kept columns after them on the free dimension."""
    if isinstance(op, ColumnReduceOp):
        return _tile_column_reduce(op, plan, d, role, n)
    # (a tile that does not divide the rows or the reduced elements is ragged: whole tiles, then a smaller last one)
    if role.startswith("k"):
        if n > PMAX:
            raise bad(d, f"tile of {n} rows on the partition dimension exceeds {PMAX}", f"use at most {PMAX}")
        if n > op.dim("R"):
            raise bad(d, f"a tile of {n} rows is more than the {op.dim('R')} rows the kept indices make",
                      f"use at most {op.dim('R')}")
        return replace(plan, parts=n)
    if n > REDUCE_FREE:
        raise bad(d, f"a tile of {n} elements per partition exceeds the {REDUCE_FREE} one reduced tile may hold "
                     f"in SBUF", f"use at most {REDUCE_FREE}")
    if n > op.dim("F"):
        raise bad(d, f"a tile of {n} elements is more than the {op.dim('F')} each row reduces",
                  f"use at most {op.dim('F')}")
    return replace(plan, free=n)


def _tile_column_reduce(op: ColumnReduceOp, plan: ReducePlan, d: sx.Directive, role: str, n: int) -> ReducePlan:
    if role.startswith("r"):
        if n > PMAX:
            raise bad(d, f"tile of {n} reduced rows on the partition dimension exceeds {PMAX}",
                      f"use at most {PMAX}")
        if n > op.dim("R"):
            raise bad(d, f"a tile of {n} rows is more than the {op.dim('R')} rows the reduced indices make",
                      f"use at most {op.dim('R')}")
        return replace(plan, parts=n)  # (not dividing the rows: whole tiles and one of the rest, rules_colragged)
    if not role.startswith("k"):
        raise bad(d, "only the reduced loops and the kept loops after them are tiled in a column sum",
                  directives_reduce.tile_hint(op) + "; the loops before the reduced ones are taken one at a time")
    if n > MOVING_FMAX:
        raise bad(d, f"a tile of {n} columns exceeds the {MOVING_FMAX} one matmul sums into a PSUM bank",
                  f"use a divisor of {op.dim('F')} up to {MOVING_FMAX}")
    if n > op.dim("F"):
        raise bad(d, f"a tile of {n} columns is more than the {op.dim('F')} the kept indices after the reduced ones "
                     "make", f"use at most {op.dim('F')}")
    return replace(plan, free=n)  # (not dividing the columns: whole tiles and one of the rest, rules_colragged)


def _tile_conv(op: ConvOp, plan: ConvPlan, d, role: str, n: int) -> ConvPlan:
    if role in ("k", "c"):
        if n > PMAX:
            side = "output channels (stationary free size)" if role == "k" else "contraction (partitions)"
            raise bad(d, f"tile of {n} on the partition dimension exceeds {PMAX}",
                      f"{side} of one matmul hold at most 128")
        _div(d, n, op.dim("K" if role == "k" else "C"), "tile")
        return replace(plan, tile_k=n) if role == "k" else replace(plan, tile_c=n)
    if role == "x":
        _div(d, n, plan.band_x or op.dim("Wo"), "tile")
        if n > MOVING_FMAX:
            raise bad(d, f"tile of {n} columns exceeds the matmul moving size of {MOVING_FMAX}")
        if op.pool and n * op.pool.wy > MOVING_FMAX:  # a matmul group holds at least one pooling window of rows
            raise bad(d, f"{op.pool.wy} rows (one pooling window) of {n} columns is {n * op.pool.wy} elements per "
                         f"matmul; the moving operand and one PSUM bank hold {MOVING_FMAX}",
                      f"use at most {MOVING_FMAX // op.pool.wy} columns")
        if op.pool and n % op.pool.wx:
            raise bad(d, f"a tile of {n} columns splits pooling windows of {op.pool.wx} columns",
                      f"use a multiple of {op.pool.wx}")
        rows = plan.rows if plan.rows * n <= MOVING_FMAX else (op.pool.wy if op.pool else 1)
        return replace(plan, tile_x=n, rows=rows, band=plan.band if plan.band % rows == 0 else rows)
    if role == "y":
        if n * plan.tile_x > MOVING_FMAX:
            raise bad(d, f"{n} rows of {plan.tile_x} columns is {n * plan.tile_x} elements per matmul; "
                         f"the moving operand and one PSUM bank hold {MOVING_FMAX}",
                      f"use at most {MOVING_FMAX // plan.tile_x} rows")
        if op.pool and n % op.pool.wy:
            raise bad(d, f"rows per matmul must be a multiple of the pool window {op.pool.wy}")
        _div(d, n, op.dim("Ho"), "tile")
        band = plan.band if plan.band % n == 0 else n
        return replace(plan, rows=n, band=band)
    raise bad(d, f"loop `{_loop(d)}` of {op.name} cannot be tiled",
              "conv tiles: out channels, in channels, rows (y), columns (x)")


def apply_split(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`split conv.y, 2`: rows per band, the unit of input loads and output stores (rows per
    matmul shrink to fit) (golden excerpt: tests/golden/compiler/directives/split.txt):

        +  const BAND = 2
        -        alloc X_band: sbuf f32[128, 2, 10, 8]  # tl:14
        +      for y_b in affine(4):  # tl:11
        +          alloc X_band: sbuf f32[128, 2, 4, 8]  # tl:14
        +            dma X_band[:128, c_t, :4, :8] <- X[n, c_t*TILE_C:+128, y_b*BAND:+4, :8]  # tl:14

    `split Wt, conv.c`: the out-channel-major weights are loaded with one DMA per (out-channel tile, in-channel
    tile) block instead of one per out-channel tile, so the first PE transposes wait for a smaller load (`split Wt,
    conv.k` is the default) (golden excerpt: tests/golden/compiler/directives/split_weights.txt):

        -      dma Wt_rows[:128, :256, :3, :3] <- Wt[k_t*TILE_K:+128, :256, :3, :3]  # tl:14
        +        dma Wt_rows[:128, :128, :3, :3] <- Wt[k_t*TILE_K:+128, c_t*TILE_C:+128, :3, :3]  # tl:14
        -        copy.gpsimd Wt_taps[:128, 0, 0, :128] <- Wt_rows[:128, c_t*TILE_C:+128, 0, 0]  # tl:14
        +        copy.gpsimd Wt_taps[:128, 0, 0, :128] <- Wt_rows[:128, :128, 0, 0]  # tl:14

    `split z.i, 2` of an element-wise statement on flattened data: each DMA moves two free tiles, the engines
    compute them one at a time (_split_eltwise) (golden excerpt: tests/golden/compiler/directives/split_eltwise.txt):

        -    for t in affine(4):  # tl:6
        +    for t in affine(2):  # tl:6
        +      dma x_tile[:128, :2048] <- x_v[:128, t*DMA_F:+2048] [sync]  # tl:7
        +      for tc in affine(2):  # tl:6
    """
    if d.args and isinstance(d.args[0], sx.Ref) and len(d.args[0].parts) == 1:
        return _split_weights(op, plan, d)
    role, n = ref_role(op, d.args[0], d), _int(d, 1)
    if isinstance(plan, EltwisePlan) and isinstance(op, EltwiseOp):
        return _split_eltwise(op, plan, d, n)
    if isinstance(plan, ConvPlan) and role == "y":
        assert isinstance(op, ConvOp)
        _div(d, n, op.dim("Ho"), "split")
        wy = op.pool.wy if op.pool else 1
        if n % wy:
            raise bad(d, f"a band of {n} rows splits pooling windows of {wy} rows", f"use a multiple of {wy}")
        # rows per matmul shrink to the largest divisor of the band that still covers whole pooling windows
        return replace(plan, band=n, rows=best_divisor(n, plan.rows, wy))
    if isinstance(plan, ConvPlan) and role == "x":
        assert isinstance(op, ConvOp)
        _div(d, n, op.dim("Wo"), "split")
        wx = op.pool.wx if op.pool else 1
        if n % wx:
            raise bad(d, f"a band of {n} columns splits pooling windows of {wx} columns", f"use a multiple of {wx}")
        tile_x = best_divisor(n, plan.tile_x, wx)  # columns per matmul shrink to a divisor of the band
        rows = best_divisor(plan.band, MOVING_FMAX // tile_x, op.pool.wy if op.pool else 1)
        return replace(plan, band_x=0 if n == op.dim("Wo") else n, tile_x=tile_x, rows=min(plan.rows, rows))
    if isinstance(plan, TransposePlan) and role in ("i", "j"):
        _div(d, n, op.dim("M") // plan.tile if role == "i" else op.dim("N") // plan.tj, "split")
        return replace(plan, bi=n) if role == "i" else replace(plan, bj=n)
    if isinstance(plan, PoolPlan) and role == "i":
        assert isinstance(op, PoolOp)
        if not 0 < n <= op.out_rows:  # the last band may be shorter (rules_pool.py peels it)
            raise bad(d, f"a band of {n} rows: {op.name} has {op.out_rows} output rows", f"use 1..{op.out_rows}")
        return replace(plan, band=n)
    if isinstance(plan, ReducePlan) and isinstance(op, ReduceOp):
        directives_reduce.refuse_split(op, d, _loop(d))
    raise bad(d, f"loop `{_loop(d)}` of {op.name} cannot be split here", _other_loops(op, "split", ", N"))


def _other_loops(op: Op, name: str, arg: str) -> str:
    """What a refused `split` / `unroll` of a loop can be written as instead: a transpose's blocks are cut along
    its rows i and columns j only (a batch loop is taken one at a time), a conv unrolls its accumulation loops."""
    roles = {TransposeOp: ("i", "j") if name == "split" else (), ConvOp: ("c", "r", "s") if name == "unroll" else ()}
    have = dict(op.vars)
    loops = [f"`{name} {op.name}.{have[r]}{arg}`" for r in roles.get(type(op), ()) if r in have]
    if loops:
        return " or ".join(loops) + f" ({'blocks per strip' if name == 'split' else 'an accumulation loop'})"
    if isinstance(op, TransposeOp):
        return f"remove the directive: a transpose's loops are its rule's; `tile {op.name}.{have.get('i', 'i')}, N` " \
               "sets its blocks"
    return "remove the directive"


def _split_eltwise(op: EltwiseOp, plan: EltwisePlan, d: sx.Directive, n: int) -> EltwisePlan:
    """`split Y.v, N` of flattened data: each DMA (the loads and the store) moves N free tiles, computed one tile at
    a time (a loop `tc` inside the tile loop `t`): bigger DMAs with the engines' instructions still one tile wide
    (see apply_split). A broadcast layout's DMAs are its tiles: refused."""
    if op.layout:
        raise bad(d, f"{op.name} reads a broadcast operand: its tiles (partitions x free) are its DMAs, a split "
                     "of them is not compiled", f"`tile {op.name}.{_loop(d)}, N` sets the tile (and the DMA) size")
    if plan.dma_tiles != 1:  # (flattened data: every loop of the op runs through the one tile loop)
        raise bad(d, f"another `split` of {op.name} already set how many tiles one DMA moves: its loops are flattened "
                     "into one tile loop", "keep one of the two directives")
    trips = eltwise_trips(op, plan).get("t", 0)
    if not trips:
        raise bad(d, f"{op.name}'s {plan.parts} x {plan.free} tiles do not divide its {op.size} elements: the tiles "
                     "are cut where the data allows", f"tile {op.name}.{_loop(d)} with a divisor of "
                                                      f"{op.size // plan.parts} first")
    if n < 2 or trips % n:
        raise bad(d, f"{op.name} has {trips} free tiles of {plan.free} elements: a DMA of {n} of them "
                     f"{'moves one tile, the default' if n < 2 else 'does not divide them'}",
                  f"use a divisor of {trips} from 2: {', '.join(map(str, divisors(trips)[1:12]))}" if trips > 1 else
                  f"`tile {op.name}.{_loop(d)}, N` with smaller tiles first")
    return replace(plan, dma_tiles=n)


def _split_weights(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`split Wt, conv.c` / `split Wt, conv.k` (the default): weight DMA granularity (see apply_split)."""
    assert isinstance(d.args[0], sx.Ref)  # apply_split checked it: a one-part reference, the weights' name
    name = d.args[0].parts[0]
    if not isinstance(op, ConvOp) or not isinstance(plan, ConvPlan) or name != op.w:
        raise bad(d, f"`split {name}, ...` splits the weight loads of a convolution or matmul; {name} is not "
                     f"the weights of one", f"split a loop instead: split {op.name}.LOOP, N")
    at = d.args[1] if len(d.args) == 2 else None
    role = ref_role(op, at, d) if isinstance(at, sx.Ref) and len(at.parts) == 2 else None
    if role not in ("k", "c"):
        raise bad(d, f"the weight loads of {op.name} are split per out-channel tile or per in-channel tile",
                  f"split {name}, {op.name}.{var_of(op, 'k')} (default) or split {name}, "
                  f"{op.name}.{var_of(op, 'c')}")
    if role == "c" and op.w_layout == "ck":
        raise bad(d, f"{name} is stored contraction-major: it is already loaded one in-channel tile at a time")
    return replace(plan, w_split=role)


def apply_reorder(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`reorder conv, k, n, y` (outer loops: the input band is now reloaded for every
    out-channel tile) (golden excerpt: tests/golden/compiler/directives/reorder_outer.txt):

        -    for n in affine(2):  # tl:11
        -      for k_t in affine(2):  # tl:11
        +    for k_t in affine(2):  # tl:11
        +      for n in affine(2):  # tl:11

    `reorder conv, r, s, c` (accumulation order) (golden excerpt: tests/golden/compiler/directives/reorder_taps.txt):

        -        for c_t in affine(2):  # tl:13
        +        for r in affine(3):  # tl:13
        +          for s in affine(3):  # tl:13
        +            for c_t in affine(2):  # tl:13

    `reorder Y, j, i` of an element-wise statement with a broadcast (`Y[i, j] = X[i, j] - c[i]`, i on the
    partitions): its free tiles outside its partition tiles, c's column loaded per tile (golden excerpt:
    tests/golden/compiler/directives/reorder_eltwise.txt):

        -    for pt in affine(2):  # tl:4
        -      for t in affine(2):  # tl:4
        +  for t in affine(2):  # tl:4
        +      for pt in affine(2):  # tl:4
    """
    if isinstance(plan, EltwisePlan) and isinstance(op, EltwiseOp) and op.layout:
        return _reorder_broadcast(op, plan, d)
    if isinstance(plan, ReducePlan) and isinstance(op, ReduceOp):
        directives_reduce.refuse_reorder(op, d)
    if not isinstance(plan, ConvPlan):
        why = {EltwisePlan: "its loops are flattened in memory order onto partitions x free tiles (any order gives "
                            "the same result; the tiles stream through contiguous HBM)",
               ReducePlan: "the kept loops go on the partitions and the reduced ones along the free axis, in the "
                           "tensor's order"}.get(type(plan), "its rule fixes the order of its tiles")
        raise bad(d, f"{op.name} has a fixed loop order: {why}; `reorder` is compiled for a conv's loops",
                  f"`tile {op.name}.{op.vars[0][1]}, N` sets its tile sizes" if op.vars else "remove the directive")
    roles = _roles(op)
    names = [a.parts[0] if isinstance(a, sx.Ref) and len(a.parts) == 1 else None for a in d.args[1:]]
    if None in names or any(n not in roles for n in names):
        raise bad(d, f"reorder lists loop variables of {op.name}: {', '.join(v for _, v in op.vars)}")
    order = tuple(roles[n] for n in names if n is not None)  # (there is no None left: checked above)
    for group, field_ in ((("n", "y", "k"), "order"), (("c", "r", "s"), "taps")):
        present = tuple(r for r in group if r in dict(op.vars))
        if sorted(order) == sorted(present):
            full = _full_order(order, group)
            return replace(plan, order=full) if field_ == "order" else replace(plan, taps=full)
    raise bad(d, "reorder names either the outer loops (batch, row bands, out-channel tiles) or the "
                 "accumulation loops (in channels, filter taps), all of one group")


def _reorder_broadcast(op: EltwiseOp, plan: EltwisePlan, d: sx.Directive) -> EltwisePlan:
    """`reorder Y, j, i` of a broadcast layout (outer x partitions x free, `Y[i, j] = X[i, j] - c[i]`): the free
    tiles (j) outside the partition tiles (i), so a broadcast row is copied to the partitions once per free tile,
    not once per (partition tile, free tile), and a column is loaded once per tile; `reorder Y, i, j` the other way
    round. The outer loops stay between the two (see apply_reorder)."""
    names = [v for _, v in op.vars]
    a, b = op.run
    listed = [x.parts[0] if isinstance(x, sx.Ref) and len(x.parts) == 1 else None for x in d.args[1:]]
    if None in listed or any(v not in names for v in listed) or len(set(listed)) != len(listed):
        raise bad(d, f"reorder lists loop variables of {op.name}, each once: {', '.join(names)}")
    kinds = [eltwise_loop(op, str(v)) for v in listed]
    layout = f"outer {', '.join(names[:a]) or '-'} x partitions {', '.join(names[a:b])} x free {', '.join(names[b:])}"
    hint = f"reorder {op.name}, {', '.join(names[b:] + names[a:b])} (free tiles outside the partition tiles)"
    if "pt" not in kinds or "t" not in kinds:
        raise bad(d, f"{op.name}'s layout is {layout}: `reorder` orders its partition tiles and its free tiles, so it "
                     "names a loop of each", hint)
    if "o" in kinds:
        raise bad(d, f"{op.name}'s layout is {layout}: the outer loops are taken one at a time between the partition "
                     "tiles and the free tiles, in either order", f"leave them out: {hint}")
    for kind_ in ("pt", "t"):
        group = [v for v, k in zip(listed, kinds) if k == kind_]
        run = [v for v in names if v in group]
        if kinds.index(kind_) + len(group) != len(kinds) - kinds[::-1].index(kind_) or group != run:
            raise bad(d, f"{', '.join(run)} go through one tile loop of {op.name}'s layout ({layout}), in their own "
                         "order: listed apart or swapped, they cannot be ordered", hint)
    trips = eltwise_trips(op, plan)
    if trips["t"] == 1 or trips["pt"] * trips["o"] == 1:
        one = "free tile" if trips["t"] == 1 else "partition tile"
        raise bad(d, f"{op.name}'s {plan.parts} x {plan.free} tiles give one {one}: the order of its loops does not "
                     "change the kernel", "remove the directive")
    return replace(plan, free_outer=kinds[0] == "t")


def _full_order(order: tuple[str, ...], group: tuple[str, ...]) -> tuple[str, ...]:
    """The group's roles with the ones `order` names in its order, the others where they were (a depthwise conv has
    no `c` loop: `reorder Y, r, s` keeps c first, as the default plan has it, so the default is pasted back)."""
    named = iter(order)
    return tuple(next(named) if r in order else r for r in group)


def apply_partition(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`partition conv.k`: states which loop lives on the 128 partitions; only the engine-legal binding is
    accepted (the IR does not change), anything else is an error that names the legal loop."""
    role = ref_role(op, d.args[0], d)
    allowed = {ConvPlan: "k", PoolPlan: "b", EltwisePlan: "d0", TransposePlan: "i", ReducePlan: "k0"}[type(plan)]
    if role != allowed:
        why = {ConvPlan: "a matmul puts its output channels on PSUM partitions",
               PoolPlan: "pooling windows run along the free dimension",
               EltwisePlan: "element-wise tensors are flattened onto partitions",
               TransposePlan: "the source rows go on partitions",
               ReducePlan: "the kept indices go on partitions, the reduced ones along the free dimension"
               }[type(plan)]
        raise bad(d, f"{op.name}.{_loop(d)} cannot be bound to partitions: {why}",
                  f"bind {op.name}.{var_of(op, allowed)}")
    return plan


def apply_fusion(op: Op, plan: Plan, d: sx.Directive, sbuf: int, ops: tuple = (),
                 dtypes: dict[str, str] | None = None) -> Plan:
    """`compute_at conv, Y.i | Y.j | Y.n | root` and `place conv, sbuf | hbm`. Fused (the
    default), the conv output only lives in PSUM/SBUF tiles; at `root` or in `hbm` it is stored and a separate pool
    reads it back (golden excerpt: tests/golden/compiler/directives/place_hbm.txt):

        -  block main: conv by row bands, fused into Y:  # tl:12
        +  block main: conv by row bands:  # tl:12
        +  alloc conv: hbm f32[2, 256, 8, 6]  # tl:9
        +        dma conv[n, k_t*CONV_TILE_K:+128, :8, :6] <- conv_band[:128, :8, :6]  # tl:12

    `compute_at conv, root` is the same (golden excerpt: tests/golden/compiler/directives/compute_at_root.txt):

        +  alloc conv: hbm f32[2, 256, 8, 6]  # tl:9
        +  view conv_v2: hbm f32[128, 32, 6] = conv  # tl:12
    sbuf is the compiler's SBUF budget per partition on the target (schedule.sbuf_budget).
    A conv without a pool whose output another op reads (a pool with overlapping windows) stores it in HBM: `place
    T, hbm` (or `compute_at T, root`) says so and is accepted, `place T, sbuf` is a located error saying why
    (placement.py). Read by a conv that directly follows (conv -> relu -> conv), `place T, sbuf|hbm` is accepted
    here and chooses where T goes (placement.chain_choices; the pipeline raises when sbuf cannot be honoured).
    """
    if isinstance(op, ConvOp) and not op.pool and isinstance(plan, ConvPlan):
        _check_chain_fusion(op, d, sbuf, ops, dtypes or {})
        if any(op.out in reads(o) for o in ops if o is not op):
            return plan  # already where it goes: in HBM, read back by the consumer
    if to_hbm(d) and type(op) in (EltwiseOp, ReduceOp, ColumnReduceOp) and _readers(op, ops):
        return plan  # stored, read back by its readers: the pipeline builds an op a directive names alone
    if not isinstance(plan, ConvPlan) or not isinstance(op, ConvOp) or not op.pool:  # a ConvPlan is a ConvOp's
        raise _not_fusable(op, d, ops)
    target = d.args[1] if len(d.args) > 1 else None
    parts = target.parts if isinstance(target, sx.Ref) else ()
    if parts in (("hbm",), ("root",)):
        return replace(plan, fused=False)
    if parts == ("sbuf",):
        return replace(plan, fused=True)
    if d.name == "compute_at" and len(parts) == 2:
        role = ref_role(op, target, d)
        wy, wx = op.pool.wy, op.pool.wx
        if role == "pool_i":  # one pooled row per matmul group: wy conv rows, whole width
            return replace(plan, fused=True, rows=wy)
        if role == "pool_j":  # one pooled element per matmul group: a wy x wx window of conv
            return replace(plan, fused=True, rows=wy, tile_x=wx)
        if role in ("pool_b", "n"):
            return _fuse_whole_image(op, plan, d, sbuf)
    raise bad(d, f"`{d.name}` takes sbuf|hbm, root, or a loop of the consumer (e.g. {op.out}.i)")


def to_hbm(d: sx.Directive) -> bool:
    """`place T, hbm` or `compute_at T, root`."""
    where = d.args[1].parts if len(d.args) > 1 and isinstance(d.args[1], sx.Ref) else ()
    return (d.name, where) in (("place", ("hbm",)), ("compute_at", ("root",)))


def _readers(op: Op, ops: tuple) -> list[str]:
    return [o.name for o in ops if o is not op and op.out in reads(o)]


class ChainChoice(TilecError):
    """`place T, sbuf` / `compute_at T, Y.i` of an element-wise or reduction T several statements read: where T
    goes is the fusers' choice. The pipeline compiles without the directive to say whether T stays on chip already
    (the directive would then change nothing) or goes through HBM (this error's reason stands)."""

    def __init__(self, message: str, span, hint: str, op: Op, d: sx.Directive) -> None:
        super().__init__(message, span, hint)
        self.op = op
        self.directive = d


@dataclass(frozen=True)
class ReaderBuffers(sx.Directive):
    """`buffers X, n` of X several statements built apart read, applied to one reader's tiles of X (each reader
    gets a copy: pipeline._shared_tiles); printed and located as the user wrote it."""
    reader: str = ""


class SharedTiles(TilecError):
    """`buffers X, n` of X several statements read: which statement's tiles is not said. The pipeline compiles
    without the directive to say whether a fused part loads X once for all of them (pipeline._shared_tiles)."""

    def __init__(self, message: str, span, hint: str, readers: tuple[Op, ...], d: sx.Directive) -> None:
        super().__init__(message, span, hint)
        self.readers = readers
        self.directive = d


def _not_fusable(op: Op, d: sx.Directive, ops: tuple) -> TilecError:
    """Why `compute_at`/`place` of this op is refused: nothing reads it, or it has several readers (the element-wise
    producer of ONE reader is inlined into it before selection: compute_at.py)."""
    readers = _readers(op, ops)
    if not readers:
        return bad(d, f"no other statement reads {op.out}: there is no consumer to compute it in",
                   f"`{d.name}` names a producer and a loop of a statement that reads it")
    if type(op) not in (EltwiseOp, ReduceOp, ColumnReduceOp):
        return bad(d, f"`{d.name}` of {op.out} is compiled for a conv into its pool and for an element-wise "
                      f"producer with one reader; {op.out} ({kind(op)}) is read by {' and '.join(readers)}, and where "
                      "it goes is the compiler's choice (`tilec explain` shows it under tensor placement)",
                   "remove the directive")
    what = "stays in SBUF" if d.name == "place" else "is computed inside a loop of one reader"
    return ChainChoice(f"{op.out} ({kind(op)}) is read by {' and '.join(readers)}: whether it {what} is the "
                       "compiler's choice (a row or column chain keeps such a tensor on chip, computed per tile of its "
                       "readers, when one fits; `tilec explain` shows it under tensor placement); `compute_at` into a "
                       "reader's loop is compiled for a conv into its pool and for an element-wise producer with one "
                       "reader", d.span, f"remove the directive, or write `place {op.out}, hbm` to build {op.name} "
                                         f"alone and store {op.out}", op, d)


def _check_chain_fusion(op: ConvOp, d: sx.Directive, sbuf: int, ops: tuple, dtypes: dict[str, str]) -> None:
    """`place`/`compute_at` of a conv without a pool: only the HBM placement of a conv -> conv intermediate."""
    target = d.args[1] if len(d.args) > 1 else None
    parts = target.parts if isinstance(target, sx.Ref) else ()
    if op.name != op.out:  # an element-wise consumer (residual add, relu) folded into the eviction
        raise bad(d, f"{op.name} is computed into {op.out} on the PSUM eviction (an element-wise consumer fused into "
                     f"the {kind(op)}): it never goes to HBM, and a directive cannot separate them yet",
                  "remove the directive")
    if not any(op.out in reads(o) for o in ops if o is not op):
        return  # no consumer to fuse into: the caller's error
    if (d.name, parts) in (("place", ("hbm",)), ("compute_at", ("root",))):
        return
    consumer = chain_consumer(ops, op.out)
    if parts == ("sbuf",) and (consumer is not None or _window_pool_reads(ops, op)):
        return  # the pipeline keeps the chain on chip or raises why it cannot (placement.chain_choices)
    why = chain_reason(op, consumer, op.out, dtypes.get(op.out, "f32"), sbuf) if consumer else \
        hbm_reason(ops, op.out, dtypes.get(op.out, "f32"), sbuf)
    if parts == ("sbuf",) and build_mlp.first_of_two(op, ops):
        raise bad(d, f"{op.out} stays in SBUF by default when the two matmuls form an MLP the compiler keeps on chip "
                     "(build_mlp.py; `tilec explain` shows whether they do, or why not)",
                  f"remove the directive, or write `place {op.out}, hbm` to build the two matmuls op by op")
    if parts == ("sbuf",):
        raise bad(d, f"{op.out} cannot stay in SBUF yet: {why}",
                  f"remove the directive, or write `place {op.out}, hbm` (where {op.out} goes today)")
    raise bad(d, f"`{d.name} {op.out}, ...` of a conv read back by a separate op takes only "
                 f"{'hbm' if d.name == 'place' else 'root'}: {why}",
              f"write `place {op.out}, hbm`" + (f" or `place {op.out}, sbuf` (kept on chip image by image when the "
                                                 f"second conv directly follows)" if consumer else "") +
              " or remove the directive")


def _window_pool_reads(ops: tuple, op: ConvOp) -> bool:
    """Whether the op after the conv pools its output through overlapping / padded windows (pool_chain.py)."""
    at = next((i for i, o in enumerate(ops) if o is op), len(ops))
    nxt = ops[at + 1] if at + 1 < len(ops) else None
    return isinstance(nxt, PoolOp) and nxt.window is not None and nxt.src == op.out


def _fuse_whole_image(op: ConvOp, plan: ConvPlan, d: sx.Directive, sbuf: int) -> ConvPlan:
    ho, wo = op.dim("Ho"), op.dim("Wo")
    live = ho * wo * 4  # the fp32 conv rows of one image and out-channel tile, before pooling
    if live > PSUM_BANK * 8 and live > sbuf // 2:
        raise bad(d, f"fusing {op.name} into {op.out} at {_loop(d, 1)} needs {ho} rows of {op.name} live, "
                     f"{live // 1024} KiB per partition; at most {sbuf // 2048} KiB of the "
                     f"{sbuf // 1024} KiB SBUF partition can hold it (the rest holds inputs and weights)",
                  f"fuse at {op.out}.{var_of(op, 'pool_i')} to keep only a band of rows live")
    return replace(plan, fused=True, band=ho)


def apply_hoist(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`hoist Wt, conv.k`: weights prepared per out-channel tile instead of once (golden
    excerpt: tests/golden/compiler/directives/hoist_weights.txt):

        -  block weights Wt: contraction-major, resident in SBUF:  # tl:12
        +        block weights Wt for this out-channel tile [hoistable]:  # tl:12
        +          alloc Wt_T: sbuf f32[128, 2, 3, 3, 128]  # tl:14

    `hoist X, conv.k`: the input band stays inside the out-channel loop (golden excerpt:
    tests/golden/compiler/directives/hoist_input.txt):

        -      block input band X: all contraction tiles, shared by every output tile [hoistable]:  # tl:12
        +        block input band X: all contraction tiles, shared by every output tile [hoistable, inside k_t]:  # tl:12
    """
    at = d.args[1] if len(d.args) > 1 else None
    if not isinstance(plan, ConvPlan) or not isinstance(op, ConvOp):  # a ConvPlan is a ConvOp's
        raise bad(d, "only conv inputs (weights, input bands) can be hoisted")
    if isinstance(d.args[0], sx.Ref) and d.args[0].parts == (op.x,):
        if isinstance(at, sx.Ref) and len(at.parts) == 2 and ref_role(op, at, d) in ("n", "y", "k"):
            return replace(plan, x_pin=ref_role(op, at, d))
        raise bad(d, f"the input band of {op.x} is loaded inside one of the loops "
                     f"{', '.join(var_of(op, r) for r in ('n', 'y', 'k'))} of {op.name}")
    if not isinstance(d.args[0], sx.Ref) or d.args[0].parts != (op.w,):
        raise bad(d, "only conv inputs (weights, input bands) can be hoisted")
    if isinstance(at, sx.Ref) and at.parts == ("root",):
        return replace(plan, hoist_w="root")
    if isinstance(at, sx.Ref) and len(at.parts) == 2 and ref_role(op, at, d) == "k":
        return replace(plan, hoist_w="k")
    raise bad(d, f"hoist {op.w} to `root` (once) or to {op.name}.{var_of(op, 'k')} (per out-channel tile)")


def apply_buffers(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`buffers X, 1`: one input-band buffer for the whole kernel; the `legalise` pass then
    makes the loops sharing it sequential. 2 or more: a buffer per iteration (golden excerpt:
    tests/golden/compiler/directives/buffers.txt):

        +  alloc X_band: sbuf f32[128, 2, 10, 8]  # tl:12
        -    for n in affine(2):  # tl:11
        +    for n in sequential(2):  # tl:11

    On an element-wise statement, `buffers X, 1` (X an operand read like the output, or the output) allocates X's
    tile once, before the tile loops, which become sequential: each load waits for the previous tile's work (golden
    excerpt: tests/golden/compiler/directives/buffers_eltwise.txt):

        +  alloc x_tile: sbuf f32[128, 1024]  # tl:7
        -    for t in affine(4):  # tl:6
        +    for t in sequential(4):  # tl:6
    """
    n = _int(d, 1)
    if isinstance(plan, EltwisePlan):
        assert isinstance(op, EltwiseOp)
        return _buffers_eltwise(op, plan, d, n)
    if isinstance(plan, ReducePlan) and isinstance(op, ReduceOp):  # row and column reductions
        return _buffers_reduce(op, plan, d, n)
    if not isinstance(plan, ConvPlan):  # the only plans with buffer settings (x_bufs, single)
        raise bad(d, f"{op.name} has no multi-buffered input",
                  "remove the directive: its tiles are allocated inside its loops, where the NKI compiler rotates them")
    return replace(plan, x_bufs=_band_buffers(op, d, n))


def _band_buffers(op: Op, d: sx.Directive, n: int) -> int:
    """`buffers X, n` of a conv or matmul: X must be its input band (the moving operand), n 1 or 2: the bands are
    allocated inside the loops, so the NKI compiler rotates them itself and 3 or 4 built the kernel of 2."""
    assert isinstance(op, ConvOp) and isinstance(d.args[0], sx.Ref)  # ConvPlan; op_for found the op by the ref
    name = d.args[0].parts[0]
    if name != op.x:
        raise bad(d, f"{name} is not {op.name}'s input band: only the bands of {op.x} have a buffer setting",
                  f"`buffers {op.x}, 1`, or remove the directive")
    if n > 2:
        raise bad(d, f"the bands of {op.x} are allocated inside {op.name}'s loops, so the NKI compiler already keeps "
                     f"several in flight (its own rotation): {n} buffers would build the kernel of 2, the default",
                  f"`buffers {op.x}, 1` (one band buffer: each band's load waits for the previous band's matmuls) "
                  "is the setting that changes it; or remove the directive")
    return n


def _one_buffer_only(d: sx.Directive, name: str, op: Op, n: int) -> None:
    """`buffers A, n` of an element-wise statement's or a row reduction's tiles: only n = 1 changes the kernel."""
    if n != 1:
        raise bad(d, f"the tiles of {name} are allocated inside {op.name}'s tile loop, so the NKI compiler already "
                     f"keeps several in flight (its own rotation): {n} buffers would leave the kernel as it is",
                  f"`buffers {name}, 1` (one buffer: each tile's load waits for the previous tile's work) is the "
                  "setting that changes it; or remove the directive")


def _buffers_eltwise(op: EltwiseOp, plan: EltwisePlan, d: sx.Directive, n: int) -> EltwisePlan:
    assert isinstance(d.args[0], sx.Ref)  # op_for found the op by it
    name = d.args[0].parts[0]
    if name in op.rows + op.columns:
        how = "a row copied to every partition" if name in op.rows else "a column of one value per partition"
        raise bad(d, f"{name} is broadcast in {op.name} ({how}): it is staged once per partition tile or once for "
                     f"the nest, not per tile, and has no buffer setting", "remove the directive")
    if name != op.out and name not in op.inputs:
        raise bad(d, f"{name} is computed into {op.name} (an element-wise statement fused into it): it has no tiles "
                     f"of its own", "remove the directive")
    _one_buffer_only(d, name, op, n)
    return replace(plan, single=tuple(sorted({*plan.single, name})))


def _row_reduction(op: Op) -> bool:
    return isinstance(op, ReduceOp) and not isinstance(op, ColumnReduceOp)


def _buffers_reduce(op: Op, plan: ReducePlan, d: sx.Directive, n: int) -> ReducePlan:
    """`buffers A, 1` of a reduction's operand: its row tiles in one buffer (rules_reduce stages them per free
    tile, rules_colreduce per row tile); the initial value and the result are columns (rows) of the accumulator, not
    tiles."""
    assert isinstance(d.args[0], sx.Ref) and isinstance(op, ReduceOp)
    name = d.args[0].parts[0]
    if name == op.out or name == op.init:
        raise bad(d, f"{name} is {'the result' if name == op.out else 'the initial value'} of the reduction "
                     f"{op.name}: a column of the accumulator, not a tile the loop loads", "remove the directive")
    _one_buffer_only(d, name, op, n)
    return replace(plan, single=tuple(sorted({*plan.single, name})))


def _unroll_reduce(op: Op, plan: ReducePlan, d: sx.Directive, role: str) -> ReducePlan:
    """`unroll s.i` (a kept loop): the loop over row tiles; `unroll s.j` (reduced): the loop over free tiles."""
    R, F = op.dim("R"), op.dim("F")
    kind_, what = ("pt", "row tiles") if role.startswith("k") else ("ft", "free tiles")
    if kind_ == "ft" and F % plan.free:
        raise bad(d, f"{op.name}'s free tiles of {plan.free} do not divide the {F} elements of a row: the last "
                     "tile is cut off, and the cut loops are not unrolled", f"tile {op.name}.{_loop(d)} with a "
                                                                             f"divisor of {F} first")
    trips = -(-R // plan.parts) if kind_ == "pt" else F // plan.free
    return replace(plan, unroll=tuple(sorted({*plan.unroll, _checked_trips(op, d, kind_, what, trips)})))


def _unroll_column_reduce(op: ColumnReduceOp, plan: ReducePlan, d: sx.Directive, role: str) -> ReducePlan:
    """`unroll s.i` (a reduced loop): the loop over row tiles summed into one PSUM row; `unroll s.j` (kept, after
    the reduced ones): the loop over free tiles. How many tiles each runs through the rule decides (row tiles in
    groups, wide free tiles): one, or too many to unroll, is refused at this line by the pipeline."""
    if not role.startswith(("r", "k")):
        raise bad(d, f"`{_loop(d)}` is an outer loop of {op.name}: the column sum takes its indices one at a time",
                  f"unroll a reduced loop (row tiles) or a kept loop after them (free tiles) of {op.name}")
    return replace(plan, unroll=tuple(sorted({*plan.unroll, "rt" if role.startswith("r") else "ft"})))


def _checked_trips(op: Op, d: sx.Directive, kind_: str, what: str, trips: int) -> str:
    if trips <= 1:
        raise bad(d, f"{op.name}'s loop over {what} (where `{_loop(d)}` goes) has one iteration: nothing to unroll",
                  "remove the directive")
    if trips > UNROLL_MAX:
        raise bad(d, f"{op.name}'s loop over {what} (where `{_loop(d)}` goes) has {trips} iterations, more than "
                     f"the {UNROLL_MAX} one unrolled loop may have", f"use larger tiles (tile {op.name}.{_loop(d)}, N)")
    return kind_


def apply_unroll(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`unroll conv.s` (golden excerpt: tests/golden/compiler/directives/unroll.txt):

        -          for s in affine(3):  # tl:14
        +          for s in static(3):  # tl:14

    `unroll Y.v` of an element-wise statement: the tile loop v runs through (free tiles, partition tiles, or the
    outer loops of a broadcast layout; schedule.eltwise_loop) becomes a static range, and its tiles are not
    software-pipelined (golden excerpt: tests/golden/compiler/directives/unroll_eltwise.txt):

        -    for t in affine(4):  # tl:6
        +    for t in static(4):  # tl:6
    """
    role = ref_role(op, d.args[0], d)
    if isinstance(plan, EltwisePlan):
        assert isinstance(op, EltwiseOp)
        return _unroll_eltwise(op, plan, d)
    if isinstance(plan, ReducePlan) and _row_reduction(op):
        return _unroll_reduce(op, plan, d, role)
    if isinstance(plan, ReducePlan) and isinstance(op, ColumnReduceOp):
        return _unroll_column_reduce(op, plan, d, role)
    if not isinstance(plan, ConvPlan) or role not in ("c", "r", "s"):
        raise bad(d, "only the accumulation loops of a conv (in channels, filter taps) and the tile loops of an "
                     "element-wise statement, a row reduction or a column sum can be unrolled",
                  _other_loops(op, "unroll", ""))
    return replace(plan, unroll=tuple(sorted(set(plan.unroll) | {role})))


def _unroll_eltwise(op: EltwiseOp, plan: EltwisePlan, d: sx.Directive) -> EltwisePlan:
    var = _loop(d)
    kind_ = eltwise_loop(op, var)
    what = {"t": "free tiles", "pt": "partition tiles", "o": "outer indices"}[kind_]
    trips = eltwise_trips(op, plan)
    if not trips:
        raise bad(d, f"{op.name}'s {plan.parts} x {plan.free} tiles do not divide its {op.size} elements: the tiles "
                     "are cut where the data allows, and their loops are not known before scheduling",
                  f"tile {op.name}.{var} with a divisor of {op.size // plan.parts} first")
    return replace(plan, unroll=tuple(sorted({*plan.unroll, _checked_trips(op, d, kind_, what, trips[kind_])})))


def apply_method(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`method Y, dma`: DMA transposes instead of PE transposes through PSUM (golden excerpt:
    tests/golden/compiler/directives/method_dma.txt):

        -        transpose.pe Y_tp[:128, :128] <- X_strip[:128, ai, bj2*TILE:+128]  # tl:7
        -        copy Y_strip[:128, bj2, ai*TILE:+128] <- Y_tp[:128, :128]  # tl:7
        +        transpose.dma Y_strip[:128, bj2, ai*TILE:+128] <- X[ai*TILE:+128, bj2*TILE:+128]  # tl:7
    """
    m = d.args[1].parts[0] if len(d.args) > 1 and isinstance(d.args[1], sx.Ref) else None
    if not isinstance(plan, TransposePlan) or m not in ("pe", "dma"):
        raise bad(d, "`method` applies to a transpose: pe (nc_transpose) or dma (dma_transpose)")
    return replace(plan, method=m)


APPLY = {"tile": apply_tile, "split": apply_split, "reorder": apply_reorder, "partition": apply_partition,
         "hoist": apply_hoist, "buffers": apply_buffers, "unroll": apply_unroll, "method": apply_method}


def op_for(d: sx.Directive, ops: tuple[Op, ...]) -> Op:
    """The op a directive talks about: the first argument names it (or one of its tensors)."""
    first = d.args[0] if d.args else None
    if not isinstance(first, sx.Ref):
        raise bad(d, f"`{d.name}` needs a computation or tensor name first")
    name = first.parts[0]
    conv = operand_of(d, ops, name)
    if conv is not None:
        return conv
    for op in ops:
        owned = {op.name, op.out} | set(getattr(op, "fused", ())) | {getattr(op, "w", None), getattr(op, "x", None)}
        if name in owned:
            return op
    readers = [op for op in ops if name in reads(op)]
    if isinstance(d, ReaderBuffers):
        return next(op for op in readers if op.name == d.reader)
    if d.name == "buffers" and len(readers) == 1:
        return readers[0]  # the tiles of an operand of one statement (apply_buffers)
    if d.name == "buffers" and readers:
        raise SharedTiles(f"{name} is read by {' and '.join(op.name for op in readers)}: `buffers` sets the tiles of "
                          "one statement's operand", first.span, "remove the directive", tuple(readers), d)

    def names(op: Op) -> str:  # the names a directive may start with, for the hint
        tensors = [t for t in (getattr(op, "x", None), getattr(op, "w", None), op.out) if t and t != op.name]
        return f"{op.name} (tensors {', '.join(tensors)})" if tensors else op.name

    raise bad(first, f"no computation or schedulable tensor named `{name}`",
              f"computations: {'; '.join(names(op) for op in ops)}")


def operand_of(d: sx.Directive, ops: tuple[Op, ...], name: str) -> Op | None:
    """The conv of `hoist X, conv.k` / `split Wt, conv.c` when X is its operand: the second argument names the
    conv, and X may also be the output of an earlier op (a copy or a temporary a rewrite made, `Q_h`, `z_terms`),
    which the directive is not about."""
    at = d.args[1] if len(d.args) > 1 else None
    if d.name not in ("hoist", "split") or not isinstance(at, sx.Ref) or len(at.parts) != 2:
        return None  # (`compute_at T, Y.y` names T's consumer second: T is the op it is about)
    return next((op for op in ops if isinstance(op, ConvOp) and op.name == at.parts[0] and name in (op.x, op.w)),
                None)


def setting(d: sx.Directive) -> tuple:
    """What a directive sets. Two directives with the same setting would make the later one silently win."""
    first = fmt_arg(d.args[0]) if d.args else ""
    if d.name in ("compute_at", "place"):  # both decide where the op's output lives
        return ("fusion", first)
    if d.name == "reorder":  # the outer loops and the accumulation loops are ordered separately
        return ("reorder", first, frozenset(fmt_arg(a) for a in d.args[1:]))
    return (d.name, first, d.reader) if isinstance(d, ReaderBuffers) else (d.name, first)


# Directives apply in one canonical order, so a schedule means the same whatever order its lines are in: sizes first
# (tile, then split: a split counts tiles), then the loop structure, placement, and the per-buffer settings. Within a
# kind, loops in ROLE_ORDER (a conv's columns before its rows: rows per matmul are checked against the columns).
PHASES = ("tile", "split", "partition", "reorder", "compute_at", "place", "hoist", "buffers", "unroll", "method")
ROLE_ORDER = ("k", "c", "x", "y", "i", "j", "b")


def canonical_order(ops: tuple[Op, ...], directives: tuple[sx.Directive, ...]) -> list[sx.Directive]:
    def key(d: sx.Directive) -> tuple:
        first = d.args[0] if d.args else None
        role = ""
        if isinstance(first, sx.Ref) and len(first.parts) == 2:
            owner = next((op for op in ops if op.name == first.parts[0]), None)
            role = _roles(owner).get(first.parts[1], "") if owner is not None else ""
        rank = ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER)
        phase = PHASES.index(d.name) if d.name in PHASES else len(PHASES)
        return phase, rank, fmt_directive(d)

    return sorted(directives, key=key)


def fixed_schedule(op: Op, dtypes: dict[str, str]) -> str | None:
    """What an op is when a builder without parameters schedules it (no directive applies, the tuner offers no
    knobs): a reduction of one long row (build_reduce.long_row), a sum of few rows with the kept elements on the
    partitions (build_colreduce.kept_tile), a reduction of few rows with the outer rows on the partitions
    (build_colreduce.outer_op); None otherwise."""
    from tilec.compiler.build_colreduce import kept_tile, outer_op
    from tilec.compiler.build_longrows import few_rows_tile
    from tilec.compiler.build_reduce import long_row
    from tilec.compiler.ops import ReduceOp
    if not isinstance(op, ReduceOp):
        return None
    dtype, plain, tensor = dtypes.get(op.src, "f32"), op.expr is None, isinstance(op.init, str)
    if isinstance(op, ColumnReduceOp):
        if op.op == "add" and kept_tile(op.dim("O"), op.dim("R"), op.dim("F"), dtype, plain, tensor) is not None:
            return "a sum of few rows with the kept elements on the partitions"
        if outer_op(op, dtype):
            return "a reduction of few rows with the outer rows on the partitions"
        return None
    if long_row(op.dim("R"), op.dim("F"), dtype, plain, tensor) is not None:
        return "a reduction of one long row over the partitions"
    if type(op) is ReduceOp and few_rows_tile(op, dtype) is not None:
        return "a reduction of a few long rows, each over the partitions"
    return None


def apply_schedule(ops: tuple[Op, ...], directives: tuple[sx.Directive, ...],
                   dtypes: dict[str, str], target: Target | None = None) -> tuple[Plan, ...]:
    sbuf = sbuf_budget(get_target(target))
    plans = {op.name: default_plan(op, dtypes) for op in ops}
    seen: dict[tuple, sx.Directive] = {}
    for d in directives:  # unknown and repeated directives are reported in the order written
        if d.name not in APPLY and d.name not in ("compute_at", "place"):
            raise bad(d, f"unknown directive `{d.name}`",
                      "directives: " + ", ".join(sorted([*APPLY, "compute_at", "place"])))
        if (earlier := seen.setdefault(setting(d), d)) is not d:
            at = f"line {earlier.span.line}" if earlier.span and earlier.span.line else "earlier"
            raise bad(d, f"`{_as_written(d)}` sets again what `{_as_written(earlier)}` ({at}) sets",
                      "keep one of the two directives")
    ordered: dict[str, sx.Directive] = {}  # an element-wise op's `reorder`: one per op (its tiles have one order)
    for d in canonical_order(ops, directives):
        op = op_for(d, ops)
        if d.name == "reorder" and isinstance(op, EltwiseOp):
            if (earlier := ordered.setdefault(op.name, d)) is not d:  # (located at the later line of the two)
                one, two = sorted((earlier, d), key=lambda x: x.span.line if x.span and x.span.line else 0)
                raise bad(two, f"`{fmt_directive(two)}` sets again what `{fmt_directive(one)}` (line "
                               f"{one.span.line if one.span else '?'}) sets: the order of {op.name}'s tiles",
                          "keep one of the two directives")
        if isinstance(op, EltwiseOp) and op.copy:
            raise bad(d, f"`{op.name}` is a copy (crop, shift, part of a concatenation, upsampling): its schedule "
                         "is chosen by the copy rule and takes no directives yet", "remove the directive")
        fixed = fixed_schedule(op, dtypes)
        if fixed is not None:
            raise bad(d, f"`{op.name}` is {fixed}: its schedule has no parameters yet and takes no directives",
                      "remove the directive")
        if d.name in ("compute_at", "place"):
            plans[op.name] = apply_fusion(op, plans[op.name], d, sbuf, ops, dtypes)
        else:
            plans[op.name] = _kept(plans[op.name], APPLY[d.name](op, plans[op.name], d))
    return tuple(plans[op.name] for op in ops)


def _as_written(d: sx.Directive) -> str:
    """A directive as the user wrote it (one a rewrite's moved sum took over names the temporary: rewrite_names)."""
    return fmt_directive(getattr(d, "written", None) or d)


def _kept(old: Plan, new: Plan) -> Plan:
    """`new` with the fields a directive left equal taken from `old`: a default's sizes remember how they were
    computed (named.py: a pool's band `16384 // (2 * SIZE_W * 4)`), so the default plan written back as directives
    (`tilec explain`'s schedule, pasted back) prints the same kernel."""
    if type(old) is not type(new):
        return new
    same = {f.name: getattr(old, f.name) for f in fields(old) if getattr(old, f.name) == getattr(new, f.name)}
    return replace(new, **same)
