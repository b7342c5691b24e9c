"""The schedule language: directives (data, printable back to text) folded into one plan record per operation.

A schedule is a sequence of `Directive(name, args)` (from the `.tl` `schedule:` section or `--schedule FILE`). The
default schedule (`default_directives`) is itself a directive list, so `tilec explain` can print it and a user can
copy and edit it. Each directive is applied by one function in `APPLY` (a table keyed by name, as in tinygrad's
`Opt`), which checks legality and returns the updated plan. Directives and their meaning:

    tile OP.v, N        tile size of loop v           conv: k (out channels, on partitions, <= 128), c (in channels,
                                                      contraction, <= 128), y (output rows per matmul), x (columns
                                                      per matmul); eltwise: free elements per tile; transpose: i/j
                                                      block size (<= 128); pool: b (channels on partitions)
    split OP.v, N       rows per band                 conv.y: output rows per input band / output DMA (rows per
                                                      matmul shrink to a divisor of it); transpose.i/j:
                                                      128-blocks per DMA; pool.i: output rows per tile
    reorder OP, a, b..  loop order                    conv outer loops (n, y, k) or its accumulation loops (c, r, s)
    partition OP.v      bind v to partitions          only legal where the engines allow it (conv.k, pool.b, ...)
    compute_at P, C.v   fusion point                  C.i (the pool row loop): fused by bands; C.n: whole image
                                                      live; `root`: not fused, P goes through HBM
    place P, MEM        memory of a tensor            sbuf (fused) | hbm (not fused)
    hoist T, OP.v       where T's preparation goes    `root` (once, before all loops) or inside OP.k
    buffers T, N        buffers of T in flight        1: one buffer reused (serialises); >= 2: one per iteration
    unroll OP.v         fully unroll loop v           nl.static_range
    method OP, M        transpose engine              pe (nc_transpose) | dma (dma_transpose)
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tilec.compiler.select import ConvOp, EltwiseOp, Op, PoolOp, TransposeOp
from tilec.errors import Span, TilecError
from tilec.lang import syntax as sx

PMAX, MOVING_FMAX, PSUM_BANK = 128, 512, 2048
SBUF_BUDGET = 192 * 1024  # usable bytes per partition on trn2 (224 KiB less a compiler reserve)


@dataclass(frozen=True)
class ConvPlan:
    tile_k: int
    tile_c: int
    tile_x: int
    rows: int  # output rows per matmul group (PSUM tile)
    band: int  # output rows per input band
    order: tuple[str, ...] = ("n", "y", "k")
    taps: tuple[str, ...] = ("c", "r", "s")
    fused: bool = True
    hoist_w: str = "root"  # root | k
    x_pin: str = ""  # keep the input band load inside this loop (n | y | k); "" = as far out as it goes
    x_bufs: int = 2
    unroll: tuple[str, ...] = ()


@dataclass(frozen=True)
class PoolPlan:
    tile_b: int
    band: int  # output rows per tile
    x_bufs: int = 2


@dataclass(frozen=True)
class TransposePlan:
    tile: int
    bi: int
    bj: int
    method: str = "pe"


@dataclass(frozen=True)
class EltwisePlan:
    parts: int
    free: int
    x_bufs: int = 2


Plan = ConvPlan | PoolPlan | TransposePlan | EltwisePlan


def directive(name: str, *args: "str | int | tuple") -> sx.Directive:
    """directive("tile", ("conv", "k"), 128) -> `tile conv.k, 128`."""
    conv = [sx.Ref(a) if isinstance(a, tuple) else sx.Ref((a,)) if isinstance(a, str) else a for a in args]
    return sx.Directive(name, tuple(conv))


def fmt_arg(a) -> str:
    if isinstance(a, sx.Ref):
        return ".".join(a.parts)
    if isinstance(a, sx.KeyArg):
        return f"{a.key}={fmt_arg(a.value)}"
    return str(a)


def fmt_directive(d: sx.Directive) -> str:
    return f"{d.name} {', '.join(fmt_arg(a) for a in d.args)}".rstrip()


def print_schedule(ds: tuple[sx.Directive, ...]) -> str:
    return "".join(fmt_directive(d) + "\n" for d in ds)


# ---- defaults ------------------------------------------------------------------------------------------------------


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def best_divisor(n: int, limit: int, multiple: int = 1) -> int:
    ok = [d for d in divisors(n) if d <= limit and d % multiple == 0]
    return max(ok) if ok else n


def default_plan(op: Op, dtypes: dict[str, str]) -> Plan:
    if isinstance(op, ConvOp):
        return _default_conv(op, dtypes)
    if isinstance(op, PoolOp):
        ho = op.dim("H") // op.pool.wy
        row_bytes = op.pool.wy * op.dim("W") * 4
        return PoolPlan(best_divisor(op.dim("B"), PMAX), best_divisor(ho, max(1, 16384 // row_bytes)))
    if isinstance(op, TransposeOp):
        tile = min(PMAX, best_divisor(op.dim("M"), PMAX), best_divisor(op.dim("N"), PMAX))
        elem = _bytes(dtypes[op.src])
        per_dma = max(1, 4096 // (tile * elem))  # >= 4 KiB per partition per DMA saturates the queues
        return TransposePlan(tile, best_divisor(op.dim("M") // tile, per_dma),
                             best_divisor(op.dim("N") // tile, per_dma))
    parts = best_divisor(op.size, PMAX)
    # two or more tiles let loads overlap the vector engine; ~1000 elements per partition keeps DMAs efficient
    return EltwisePlan(parts, best_divisor(op.size // parts, 1024))


def _bytes(dtype: str) -> int:
    return {"f32": 4, "f16": 2, "bf16": 2}[dtype]


def _default_conv(op: ConvOp, dtypes: dict[str, str]) -> ConvPlan:
    wy, wx = (op.pool.wy, op.pool.wx) if op.pool else (1, 1)
    tile_k, tile_c = best_divisor(op.dim("K"), PMAX), best_divisor(op.dim("C"), PMAX)
    wo, ho = op.dim("Wo"), op.dim("Ho")
    tile_x = wo if wo <= MOVING_FMAX else best_divisor(wo, MOVING_FMAX, wx)
    max_rows = MOVING_FMAX // tile_x
    elem = _bytes(dtypes[op.x])
    band_limit = 32 if ho > 32 else ho
    band = ho
    for d in sorted(divisors(ho), reverse=True):
        band_bytes = (op.dim("C") // tile_c) * (d + op.dim("R") - 1) * op.dim("W") * elem
        if d % wy == 0 and d <= band_limit and band_bytes <= 48 * 1024:
            band = d
            break
    rows = best_divisor(band, max_rows, wy)
    return ConvPlan(tile_k, tile_c, tile_x, rows, band)


def default_directives(op: Op, dtypes: dict[str, str]) -> tuple[sx.Directive, ...]:
    """The default plan written as directives (what `tilec explain` shows)."""
    return plan_directives(op, default_plan(op, dtypes))


def _var(op: Op, role: str) -> str:
    return dict(op.vars).get(role, role)


def plan_directives(op: Op, plan: Plan) -> tuple[sx.Directive, ...]:
    """A plan written back as directives (only loops the op really has)."""
    have = dict(op.vars)
    v = lambda role: (op.name, have[role])  # noqa: E731
    if isinstance(plan, ConvPlan):
        sizes = (("tile", "k", plan.tile_k), ("tile", "c", plan.tile_c), ("tile", "x", plan.tile_x),
                 ("tile", "y", plan.rows), ("split", "y", plan.band))
        ds = [directive(name, v(role), n) for name, role, n in sizes if role in have]
        for group in (plan.order, plan.taps):
            present = [have[r] for r in group if r in have]
            if len(present) > 1:
                ds.append(directive("reorder", op.name, *present))
        if op.pool and not plan.fused:
            ds.append(directive("place", op.name, "hbm"))
        if plan.hoist_w != "root":
            ds.append(directive("hoist", op.w, v("k")))
        if plan.x_pin:
            ds.append(directive("hoist", op.x, v(plan.x_pin)))
        if plan.x_bufs != 2:
            ds.append(directive("buffers", op.x, plan.x_bufs))
        ds += [directive("unroll", v(r)) for r in plan.unroll]
        return tuple(ds)
    if isinstance(plan, PoolPlan):
        return (directive("tile", v("b"), plan.tile_b), directive("split", v("i"), plan.band))
    if isinstance(plan, TransposePlan):
        ds = [directive("tile", v("i"), plan.tile), directive("split", v("i"), plan.bi),
              directive("split", v("j"), plan.bj)]
        return tuple(ds + ([directive("method", op.name, "dma")] if plan.method == "dma" else []))
    return (directive("tile", v("d0"), plan.free),)


# ---- applying directives -------------------------------------------------------------------------------------------


def bad(d: sx.Directive | sx.Ref | int, message: str, hint: str = "") -> TilecError:
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
        known = ", ".join(sorted(var for role, var in op.vars if not role.startswith("pool_")))
        raise bad(ref, f"{ref.parts[0]} has no loop `{ref.parts[1]}`", f"its loops are: {known}")
    return roles[ref.parts[1]]


def _int(d: sx.Directive, i: int) -> int:
    if len(d.args) <= i or not isinstance(d.args[i], int) or d.args[i] <= 0:
        raise bad(d, f"`{d.name}` needs a positive integer as argument {i + 1}")
    return d.args[i]


def _div(d: sx.Directive, value: int, extent: int, what: str) -> None:
    if extent % value:
        raise bad(d, f"{what} of {value} does not divide the extent {extent}",
                  f"use a divisor of {extent}: {', '.join(map(str, divisors(extent)[:12]))}")


def apply_tile(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`tile conv.k, 64`: the tile size of one loop (golden: tests/golden/compiler/directives/tile.txt).

    Before:  const TILE_K = 128 ; for kt in affine(2): matmul acc[:128, ..] += Wt_T[.., kt*TILE_K:+128].T @ ..
    After:   const TILE_K = 64  ; for kt in affine(4): matmul acc[:64, ..]  += Wt_T[.., kt*TILE_K:+64].T @ ..
    """
    role, n = ref_role(op, d.args[0], d), _int(d, 1)
    if isinstance(plan, ConvPlan):
        return _tile_conv(op, plan, d, role, n)
    if isinstance(plan, EltwisePlan):
        _div(d, n, op.size // plan.parts, "tile")
        return replace(plan, free=n)
    if isinstance(plan, TransposePlan):
        if n > PMAX:
            raise bad(d, f"tile of {n} on the partition dimension exceeds {PMAX}",
                      "a PE transpose moves at most 128x128 elements")
        _div(d, n, min(op.dim("M"), op.dim("N")), "tile")
        _div(d, n, max(op.dim("M"), op.dim("N")), "tile")
        return replace(plan, tile=n, bi=1, bj=1)
    if role != "b":
        raise bad(d, f"pool loop `{d.args[0].parts[1]}` cannot be tiled; tile the channel loop or split rows")
    if n > PMAX:
        raise bad(d, f"tile of {n} on the partition dimension exceeds {PMAX}")
    _div(d, n, op.dim("B"), "tile")
    return replace(plan, tile_b=n)


def _tile_conv(op: ConvOp, plan: ConvPlan, d, role: str, n: int) -> ConvPlan:
    if role in ("k", "c"):
        if n > PMAX:
            side = "output channels (stationary free size)" if role == "k" else "contraction (partitions)"
            raise bad(d, f"tile of {n} on the partition dimension exceeds {PMAX}",
                      f"{side} of one matmul hold at most 128")
        _div(d, n, op.dim("K" if role == "k" else "C"), "tile")
        return replace(plan, **{f"tile_{role}": n})
    if role == "x":
        _div(d, n, op.dim("Wo"), "tile")
        if n > MOVING_FMAX:
            raise bad(d, f"tile of {n} columns exceeds the matmul moving size of {MOVING_FMAX}")
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
    raise bad(d, f"loop `{d.args[0].parts[1]}` of {op.name} cannot be tiled",
              "conv tiles: out channels, in channels, rows (y), columns (x)")


def apply_split(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`split conv.y, 2`: rows per band, the unit of input loads and output stores (golden: directives/split.txt).

    Before:  for kt: { acc[:, :8, :] ; dma Y[n, kt.., :4, :] <- Y_band }          (one band of 8 rows)
    After:   for yb in affine(4): { X_band rows yb*BAND:+4 ; for kt: { acc[:, :2, :] ; dma Y[n, kt.., yb:+1] } }
    """
    role, n = ref_role(op, d.args[0], d), _int(d, 1)
    if isinstance(plan, ConvPlan) and role == "y":
        _div(d, n, op.dim("Ho"), "split")
        wy = op.pool.wy if op.pool else 1
        if n % wy:
            raise bad(d, f"a band of {n} rows splits pooling windows of {wy} rows", f"use a multiple of {wy}")
        # rows per matmul shrink to the largest divisor of the band that still covers whole pooling windows
        return replace(plan, band=n, rows=best_divisor(n, plan.rows, wy))
    if isinstance(plan, TransposePlan) and role in ("i", "j"):
        _div(d, n, op.dim("M" if role == "i" else "N") // plan.tile, "split")
        return replace(plan, **{f"b{role}": n})
    if isinstance(plan, PoolPlan) and role == "i":
        _div(d, n, op.dim("H") // op.pool.wy, "split")
        return replace(plan, band=n)
    raise bad(d, f"loop `{d.args[0].parts[1]}` of {op.name} cannot be split here")


def apply_reorder(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`reorder conv, k, n, y` (outer loops) or `reorder conv, r, s, c` (accumulation order)
    (goldens: directives/reorder_outer.txt, reorder_taps.txt).

    Before:  for n: { load X_band(n) ; for kt: ... }
    After:   for kt: for n: { load X_band(n) ; ... }          (the band is reloaded for every out-channel tile)
    """
    if not isinstance(plan, ConvPlan):
        raise bad(d, f"{op.name} has a fixed loop order")
    roles = _roles(op)
    names = [a.parts[0] if isinstance(a, sx.Ref) and len(a.parts) == 1 else None for a in d.args[1:]]
    if None in names or any(n not in roles for n in names):
        raise bad(d, f"reorder lists loop variables of {op.name}: {', '.join(v for _, v in op.vars)}")
    order = tuple(roles[n] for n in names)
    for group, field_ in ((("n", "y", "k"), "order"), (("c", "r", "s"), "taps")):
        present = tuple(r for r in group if r in dict(op.vars))
        if sorted(order) == sorted(present):
            return replace(plan, **{field_: _full_order(order, group)})
    raise bad(d, "reorder names either the outer loops (batch, row bands, out-channel tiles) or the "
                 "accumulation loops (in channels, filter taps), all of one group")


def _full_order(order: tuple[str, ...], group: tuple[str, ...]) -> tuple[str, ...]:
    return order + tuple(r for r in group if r not in order)


def apply_partition(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`partition conv.k`: states which loop lives on the 128 partitions; only the engine-legal binding is
    accepted (the IR does not change), anything else is an error that names the legal loop."""
    role = ref_role(op, d.args[0], d)
    allowed = {ConvPlan: "k", PoolPlan: "b", EltwisePlan: "d0", TransposePlan: "i"}[type(plan)]
    if role != allowed:
        why = {ConvPlan: "a matmul puts its output channels on PSUM partitions",
               PoolPlan: "pooling windows run along the free dimension",
               EltwisePlan: "element-wise tensors are flattened onto partitions",
               TransposePlan: "the source rows go on partitions"}[type(plan)]
        raise bad(d, f"{op.name}.{d.args[0].parts[1]} cannot be bound to partitions: {why}",
                  f"bind {op.name}.{_var(op, allowed)}")
    return plan


def apply_fusion(op: Op, plan: Plan, d: sx.Directive, dtypes: dict[str, str]) -> Plan:
    """compute_at conv, Y.i | Y.n | root  and  place conv, sbuf | hbm  (golden: directives/place_hbm.txt).

    Before (fused):  act conv_act <- acc + b ; maximum ... ; dma Y[..] <- Y_band       conv never reaches HBM
    After (hbm):     act conv_band <- acc + b ; dma conv[..] <- conv_band ; ... a separate pool reads conv
    """
    """compute_at conv, Y.i | Y.n | root  and  place conv, sbuf | hbm."""
    if not isinstance(plan, ConvPlan) or not op.pool:
        raise bad(d, f"{op.name} has no consumer to fuse into")
    target = d.args[1] if len(d.args) > 1 else None
    parts = target.parts if isinstance(target, sx.Ref) else ()
    if parts in (("hbm",), ("root",)):
        return replace(plan, fused=False)
    if parts == ("sbuf",):
        return replace(plan, fused=True)
    if d.name == "compute_at" and len(parts) == 2:
        role = ref_role(op, target, d)
        if role == "pool_i":
            return replace(plan, fused=True)
        if role in ("pool_b", "n"):
            return _fuse_whole_image(op, plan, d, dtypes)
    raise bad(d, f"`{d.name}` takes sbuf|hbm, root, or a loop of the consumer (e.g. {op.out}.i)")


def _fuse_whole_image(op: ConvOp, plan: ConvPlan, d, dtypes) -> ConvPlan:
    ho, wo = op.dim("Ho"), op.dim("Wo")
    live = ho * wo * 4  # the fp32 conv rows of one image and out-channel tile, before pooling
    if live > PSUM_BANK * 8 and live > SBUF_BUDGET // 2:
        raise bad(d, f"fusing {op.name} into {op.out} at {d.args[1].parts[1]} needs {ho} rows of {op.name} live, "
                     f"{live // 1024} KiB per partition; at most {SBUF_BUDGET // 2048} KiB of the "
                     f"{SBUF_BUDGET // 1024} KiB SBUF partition can hold it (the rest holds inputs and weights)",
                  f"fuse at {op.out}.{_var(op, 'pool_i')} to keep only a band of rows live")
    return replace(plan, fused=True, band=ho)


def apply_hoist(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`hoist Wt, conv.k` / `hoist X, conv.k`: where a load group is placed (goldens: directives/hoist_*.txt).

    Before:  block weights Wt (all K, once) ; for n: for kt: ...
    After:   for n: for kt: { block weights Wt for this out-channel tile ; ... }
    """
    at = d.args[1] if len(d.args) > 1 else None
    if isinstance(plan, ConvPlan) and isinstance(d.args[0], sx.Ref) and d.args[0].parts == (op.x,):
        if isinstance(at, sx.Ref) and len(at.parts) == 2 and ref_role(op, at, d) in ("n", "y", "k"):
            return replace(plan, x_pin=ref_role(op, at, d))
        raise bad(d, f"the input band of {op.x} is loaded inside one of the loops "
                     f"{', '.join(_var(op, r) for r in ('n', 'y', 'k'))} of {op.name}")
    if not isinstance(plan, ConvPlan) or not isinstance(d.args[0], sx.Ref) or d.args[0].parts != (op.w,):
        raise bad(d, "only conv inputs (weights, input bands) can be hoisted")
    if isinstance(at, sx.Ref) and at.parts == ("root",):
        return replace(plan, hoist_w="root")
    if isinstance(at, sx.Ref) and len(at.parts) == 2 and ref_role(op, at, d) == "k":
        return replace(plan, hoist_w="k")
    raise bad(d, f"hoist {op.w} to `root` (once) or to {op.name}.{_var(op, 'k')} (per out-channel tile)")


def apply_buffers(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`buffers X, 1`: one input-band buffer for the whole kernel (golden: directives/buffers.txt); the
    `legalise` pass then makes the loops sharing it sequential. 2 or more: a buffer per iteration.

    Before:  for n in affine(2): { alloc X_band ; dma X_band <- .. }
    After:   alloc X_band ; for n in sequential(2): { dma X_band <- .. }
    """
    n = _int(d, 1)
    if n > 4:
        raise bad(d, f"{n} buffers of an input band is more than the 4 the SBUF budget allows")
    if not hasattr(plan, "x_bufs"):
        raise bad(d, f"{op.name} has no multi-buffered input")
    return replace(plan, x_bufs=n)


def apply_unroll(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`unroll conv.s` (golden: directives/unroll.txt).

    Before:  for s in affine(3): matmul ..      After:  for s in static(3): matmul ..
    """
    role = ref_role(op, d.args[0], d)
    if not isinstance(plan, ConvPlan) or role not in ("c", "r", "s"):
        raise bad(d, "only the accumulation loops of a conv (in channels, filter taps) can be unrolled")
    return replace(plan, unroll=tuple(sorted(set(plan.unroll) | {role})))


def apply_method(op: Op, plan: Plan, d: sx.Directive) -> Plan:
    """`method Y, dma` (golden: directives/method_dma.txt).

    Before:  dma strip <- A ; transpose.pe tp <- strip[..] ; copy out[..] <- tp
    After:   transpose.dma out[..] <- A[block]
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
    for op in ops:
        owned = {op.name, op.out} | set(getattr(op, "fused", ())) | {getattr(op, "w", None), getattr(op, "x", None)}
        if name in owned:
            return op
    raise bad(first, f"no computation named `{name}`",
              f"computations: {', '.join(op.name for op in ops)}")


def apply_schedule(ops: tuple[Op, ...], directives: tuple[sx.Directive, ...],
                   dtypes: dict[str, str]) -> tuple[Plan, ...]:
    plans = {op.name: default_plan(op, dtypes) for op in ops}
    for d in directives:
        if d.name not in APPLY and d.name not in ("compute_at", "place"):
            raise bad(d, f"unknown directive `{d.name}`",
                      "directives: " + ", ".join(sorted([*APPLY, "compute_at", "place"])))
        op = op_for(d, ops)
        if d.name in ("compute_at", "place"):
            plans[op.name] = apply_fusion(op, plans[op.name], d, dtypes)
        else:
            plans[op.name] = APPLY[d.name](op, plans[op.name], d)
    return tuple(plans[op.name] for op in ops)


def print_plans(ops: tuple[Op, ...], plans: tuple[Plan, ...]) -> str:
    out = []
    for op, plan in zip(ops, plans):
        out.append(f"# {op.name}: {plan}")
        out += [fmt_directive(d) for d in plan_directives(op, plan)]
    return "\n".join(out) + "\n"


def span_of(d: sx.Directive) -> Span | None:
    return getattr(d, "span", None)
