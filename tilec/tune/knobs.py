"""Which knobs a program gets: the compiler's ops and default schedule, turned into a Space.

The compiler's records say what it recognised (`Result.ops`: op kind, dims, role -> loop variable) and the default
schedule it would apply (`Result.plans`, as directives by `plan_directives`). Both are read here, from
`tilec.compiler.api.compile_file` with no schedule (never its printed text), so knob names use the user's loop
names and each knob's first value is the compiler's default:

    conv      tile k, tile c (<= 128 partitions), tile x (<= 512 moving), tile y = rows per matmul group
              (rows * tile x <= 512 fp32 = one 2 KiB PSUM bank), split y = rows per input band,
              split x = columns per input band (whole rows by default),
              reorder of the outer loops and of the accumulation loops, place (fused in SBUF | via HBM),
              hoist of the weights (root | per out-channel tile) and of the input band (n | y | k),
              split of the weight loads (one DMA per out-channel tile | per (out, in) channel tile block),
              buffers of the input band
    pool      tile b (<= 128 partitions), split i (output rows per tile)
    transpose tile i (<= 128), split i / split j (blocks per DMA), method pe | dma
    eltwise   tile of the free dimension; a broadcast layout's tile order (reorder: free tiles outside or inside the
              partition tiles), flattened data's free tiles per DMA (split 2 | 4)
    reduce    rows per partition tile, elements per free tile (ragged: a smaller last tile)

Static checks repeat the compiler's cheapest rules (divisibility, partition and PSUM limits, a rough SBUF bound);
the compiler's TilecError stays the authority for anything they miss.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from tilec.compiler.ir import DTYPE_BYTES
from tilec.errors import InternalError, TilecError
from tilec.tune.bound import Bound, conv_bound, total_bound, x_tile
from tilec.tune.evaluate import Job, compile_job
from tilec.tune.experts import expert_points, free_role
from tilec.compiler.schedule import REDUCE_FREE, eltwise_plan, plan_directives, sbuf_budget, tile_size
from tilec.target import Target
from tilec.tune.space import DIRECTIVES, Check, Knob, Space

# the widest element-wise tile the search offers, in elements per partition (64 KiB of fp32): a bound of the search,
# not of the hardware (VectorE takes up to Target.vector_sbuf_fmax); the SBUF check bounds it further
WIDEST_FREE = 16384


@dataclass(frozen=True)
class OpView:
    """One op of the compiler's selection (`Result.ops`), with its default directives (`plan_directives`)."""

    kind: str  # conv | pool | transpose | eltwise | reduce (others keep the compiler's default schedule)
    name: str
    out: str
    dims: dict[str, int]
    vars: dict[str, str]  # role -> the .tl loop variable
    pool: tuple[int, int] | None = None  # (wy, wx) of a pool or a conv's fused pool
    tensors: dict[str, str] = field(default_factory=dict)  # stationary / moving (conv), src (transpose)
    w_layout: str = ""  # conv weights: kc (out-channel major) | ck (contraction-major)
    size: int = 0  # element-wise: elements of the output
    rows: tuple[str, ...] = ()  # element-wise: broadcast rows (tiles bounded by a matmul's moving size)
    padded: bool = False  # a conv's zero-padded read (a halo): no column bands, at least two input band buffers
    run: tuple[int, int] = (0, 0)  # element-wise with broadcasts: its loops [a, b) go on the partitions
    # (directive, role) -> default value: an int (tile, split sizes) or a tuple of roles (reorder)
    defaults: dict[tuple[str, str], Any] = field(default_factory=dict)

    def var(self, role: str) -> str:
        return self.vars.get(role, role)

    def ref(self, role: str) -> str:
        return f"{self.name}.{self.var(role)}"

    def tensor(self, label: str) -> str | None:
        return self.tensors.get(label)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ---- reading the compiler's records --------------------------------------------------------------------------------


def op_views(ops: tuple, plans: tuple, dtypes: dict[str, str] | None = None) -> list[OpView]:
    """The compiler's ops and default plans as the tuner sees them (records, never printed text). A copy and an op
    whose builder has no parameters (directives.fixed_schedule) are of kind `fixed`: no knobs (the compiler
    refuses any directive on them)."""
    from tilec.compiler.directives import fixed_schedule
    views = []
    for op, plan in zip(ops, plans):
        pool = getattr(op, "pool", None)
        tensors = {label: getattr(op, attr) for label, attr in (("stationary", "w"), ("moving", "x"), ("src", "src"))
                   if isinstance(getattr(op, attr, None), str)}
        dims = dict(getattr(op, "dims", ()) or getattr(op, "layout", ()))  # an element-wise broadcast: O, P, F
        fixed = getattr(op, "copy", False) or fixed_schedule(op, dtypes or {}) is not None
        view = OpView("fixed" if fixed else type(op).__name__.removesuffix("Op").lower(), op.name, op.out, dims,
                      dict(op.vars), (pool.wy, pool.wx) if pool else None, tensors, getattr(op, "w_layout", ""),
                      getattr(op, "size", 0), tuple(getattr(op, "rows", ())),
                      padded=any(o != 0 for o in getattr(op, "offset", (0, 0))), run=getattr(op, "run", (0, 0)))
        _defaults(view, plan_directives(op, plan))
        views.append(view)
    return views


def _defaults(op: OpView, directives: tuple) -> None:
    """Fill `defaults` from the op's default directives (tile/split sizes, loop orders)."""
    roles = {v: r for r, v in op.vars.items() if not r.startswith("pool_")}  # a fused pool shares `n`
    for d in directives:
        first = d.args[0] if d.args else None
        parts: tuple[str, ...] = getattr(first, "parts", ())
        if len(parts) != 2 and d.name != "reorder":
            continue
        if d.name in ("tile", "split") and len(d.args) == 2 and isinstance(d.args[1], int):
            op.defaults[(d.name, roles.get(parts[1], parts[1]))] = d.args[1]
        elif d.name == "reorder":
            order = tuple(roles.get(a.parts[-1], a.parts[-1]) for a in d.args[1:])
            op.defaults[("reorder", "taps" if "c" in order else "outer")] = order


# ---- knobs per op kind ---------------------------------------------------------------------------------------------


def _with_default(default: object, values: list) -> tuple:
    """`values` with the compiler's default first (None = no directive, for knobs that may be left out)."""
    return tuple([default] + [v for v in values if v != default])


def _prefer(legal: list[int], least: int) -> list[int]:
    """The legal tile sizes of at least `least` (small tiles waste the engines), or all of them when a size has
    no such divisor (N = 521: 1 and 521 > 512)."""
    return [v for v in legal if v >= least] or legal


def _channel_tiles(channels: int, limit: int) -> list[int]:
    """Conv channel tiles: divisors of at least 32; none (only the compiler's ragged default, None) for a count above
    the limit without one (257: 128-channel tiles plus a remainder tile, not 257 tiles of one channel)."""
    legal = [v for v in divisors(channels) if v <= limit]
    good = [v for v in legal if v >= min(32, channels)]
    return good or ([] if channels > limit else legal)


def channel_tiles_of(channels: int, tile: int | None, limit: int) -> int:
    """How many tiles a knob value makes (None: the ragged default, ceil(channels / limit))."""
    return -(-channels // (tile or limit))


def conv_knobs(op: OpView, dtypes: dict[str, str], t: Target) -> tuple[list[Knob], list[Check]]:
    d, dflt = op.dims, op.defaults
    wy, wx = op.pool or (1, 1)
    tiles_k = _channel_tiles(d["K"], t.stationary_fmax)
    tiles_c = _channel_tiles(d["C"], t.pmax)
    tiles_x = _prefer([v for v in divisors(d["Wo"]) if v <= t.moving_fmax and v % wx == 0], min(16, d["Wo"]))
    rows = [v for v in divisors(d["Ho"]) if v % wy == 0 and v * min(tiles_x) <= t.moving_fmax]
    bands = [v for v in divisors(d["Ho"]) if v % wy == 0 and v <= 128]  # the SBUF check bounds them further
    knobs = [
        Knob(f"tile {op.ref('k')}", "tile", op.ref("k"), _with_default(dflt.get(("tile", "k")), tiles_k)),
        Knob(f"tile {op.ref('c')}", "tile", op.ref("c"), _with_default(dflt.get(("tile", "c")), tiles_c)),
        Knob(f"tile {op.ref('x')}", "tile", op.ref("x"), _with_default(dflt.get(("tile", "x")), tiles_x)),
    ]
    if "y" in op.vars:
        knobs += [Knob(f"tile {op.ref('y')}", "tile", op.ref("y"), _with_default(dflt.get(("tile", "y")), rows)),
                  Knob(f"split {op.ref('y')}", "split", op.ref("y"),
                       _with_default(dflt.get(("split", "y")), bands))]
    # column bands (None: whole rows, the default); applied after `tile x`, so a band must be a multiple of it
    col_bands = [v for v in divisors(d["Wo"]) if v % wx == 0 and min(16, d["Wo"]) <= v < d["Wo"]]
    if col_bands and not op.padded:  # (build_conv: column bands of a padded read are not compiled yet)
        knobs.append(Knob(f"split {op.ref('x')}", "split", op.ref("x"),
                          _with_default(dflt.get(("split", "x")), [None, *col_bands])))
    outer = tuple(r for r in ("n", "y", "k") if r in op.vars)
    taps = tuple(r for r in ("c", "r", "s") if r in op.vars)
    for label, group in (("outer", outer), ("taps", taps)):
        if len(group) > 1:
            # None (no directive) is the compiler's order; these knobs set one plan field each, so leaving
            # them out is exactly the default, and the schedule text stays short
            default = tuple(op.var(r) for r in dflt.get(("reorder", label), group))
            orders = [tuple(op.var(r) for r in p) for p in itertools.permutations(group)]
            knobs.append(Knob(f"reorder {op.name} {label}", "reorder", op.name,
                              (None, *[o for o in orders if o != default])))
    if op.pool:
        knobs.append(Knob(f"place {op.name}", "place", op.name, (None, "hbm")))  # default: fused, in SBUF
    weights, moving = op.tensor("stationary"), op.tensor("moving")
    if weights:
        knobs.append(Knob(f"hoist {weights}", "hoist", weights, (None, op.ref("k"))))  # default: root
    checks = [conv_check(op, moving, dtypes.get(moving or "", "f32"), t)]
    if weights and op.w_layout == "kc":  # contraction-major weights are loaded per in-channel tile anyway
        split_w = Knob(f"split {weights}", "split", weights, (None, op.ref("c")))  # default: one DMA per k tile
        knobs.append(split_w)
        checks.append(weight_split_check(op, split_w.name))
    if moving:
        pins = tuple(op.ref(r) for r in ("n", "y", "k") if r in op.vars)  # default: as far out as it goes
        knobs.append(Knob(f"hoist {moving}", "hoist", moving, (None, *pins)))
        if not op.padded:  # default: 2 (the compiler rotates them; 3 or 4 is refused: the same kernel); a padded
            knobs.append(Knob(f"buffers {moving}", "buffers", moving, (None, 1)))  # read zeroes each band's halo
    return knobs, checks


def weight_split_check(op: OpView, name: str) -> Check:
    """Loads per in-channel tile with one in-channel tile in all: the default kernel again, so skip the point."""
    def check(named: dict) -> str | None:
        if named[name] is not None and named[f"tile {op.ref('c')}"] == op.dims["C"]:
            return f"{name} per in-channel tile with one tile of {op.dims['C']} channels is the default load"
        return None

    return check


def conv_check(op: OpView, moving: str | None, dtype: str, t: Target) -> Check:
    """The compiler's order-dependent rules for tile/split, and a rough SBUF bound on the input bands."""
    d = op.dims
    wy = (op.pool or (1, 1))[0]

    def check(named: dict) -> str | None:
        tx = x_tile(op, named)
        has_y = "y" in op.vars  # a matmul has no row role (and its column loop may be *named* y: C.y is x)
        rows = named.get(f"tile {op.ref('y')}", 1) if has_y else 1
        band = named.get(f"split {op.ref('y')}", rows) if has_y else rows
        band_x = named.get(f"split {op.ref('x')}")
        if rows * tx > t.moving_fmax:
            return f"{rows} rows of {tx} columns is {rows * tx} elements per matmul; one PSUM bank holds {t.psum_fmax}"
        # the compiler would shrink rows (columns) to fit a band: the same plan as another point, so skip it
        if band % rows:
            return f"a band of {band} rows is not a multiple of the {rows} rows per matmul"
        if band_x and band_x % tx:
            return f"a band of {band_x} columns is not a multiple of the {tx} columns per matmul"
        if rows % wy or band % wy:
            return f"rows and bands must be multiples of the pool window {wy}"
        bufs = (named.get(f"buffers {moving}") or 2) if moving else 2
        width = band_x + d.get("S", 1) - 1 if band_x else d["W"]
        band_bytes = (band + d.get("R", 1) - 1) * width * DTYPE_BYTES[dtype] * channel_tiles_of(d["C"], named[f"tile {op.ref('c')}"], t.pmax)
        if band_bytes * bufs > sbuf_budget(t) // 2:
            return f"{bufs} input bands of {band_bytes // 1024} KiB per partition exceed half of SBUF"
        return None

    return check


def pool_knobs(op: OpView, dtypes: dict[str, str], t: Target) -> tuple[list[Knob], list[Check]]:
    wy = (op.pool or (1, 1))[0]
    tiles = [v for v in divisors(op.dims["B"]) if v <= t.pmax]
    bands = [v for v in divisors(op.dims.get("Ho", op.dims["H"] // wy)) if v <= 64]  # Ho: a window pool
    return [Knob(f"tile {op.ref('b')}", "tile", op.ref("b"), _with_default(op.defaults.get(("tile", "b")), tiles)),
            Knob(f"split {op.ref('i')}", "split", op.ref("i"),
                 _with_default(op.defaults.get(("split", "i")), bands))], []


def transpose_knobs(op: OpView, dtypes: dict[str, str], t: Target) -> tuple[list[Knob], list[Check]]:
    m, n = op.dims["M"], op.dims["N"]
    tiles = [v for v in divisors(min(m, n)) if v <= t.pmax and max(m, n) % v == 0 and v >= 32]
    splits_i = sorted({v for size in tiles for v in divisors(m // size) if v <= 32})
    splits_j = sorted({v for size in tiles for v in divisors(n // size) if v <= 32})
    dflt = op.defaults
    knobs = [Knob(f"tile {op.ref('i')}", "tile", op.ref("i"), _with_default(dflt.get(("tile", "i")), tiles)),
             Knob(f"split {op.ref('i')}", "split", op.ref("i"), _with_default(dflt.get(("split", "i")), splits_i)),
             Knob(f"split {op.ref('j')}", "split", op.ref("j"), _with_default(dflt.get(("split", "j")), splits_j)),
             Knob(f"method {op.name}", "method", op.name, (None, "dma"))]  # default: pe

    elem = DTYPE_BYTES[dtypes.get(op.tensor("src") or "", "f32")]

    def check(named: dict) -> str | None:
        tile = named[knobs[0].name]
        if tile is None:  # no tile directive: the compiler's ragged blocks (min(128, M) x min(128, N))
            tile, tj = min(m, t.pmax), min(n, t.pmax)
        else:  # the column blocks: the default rectangular ones are kept, else they follow the tile (directives.py)
            tj = dflt.get(("tile", "j")) or (tile if n % tile == 0 else dflt.get(("tile", "i"), tile))
        for knob, extent, size in ((knobs[1], m, tile), (knobs[2], n, tj)):
            if (extent // size) % named[knob.name]:
                return f"{knob.name}, {named[knob.name]} does not divide the {extent // size} blocks of {size}"
        # a strip of bi x bj blocks in and one out, each bi*bj*t elements per partition (a rough bound)
        strip = named[knobs[1].name] * named[knobs[2].name] * max(tile, tj) * elem
        if 2 * strip > sbuf_budget(t):
            return f"strips of {named[knobs[1].name]}x{named[knobs[2].name]} blocks need {2 * strip // 1024} KiB " \
                   f"of SBUF per partition"
        return None

    return knobs, [check]


def eltwise_knobs(op: OpView, dtypes: dict[str, str], t: Target) -> tuple[list[Knob], list[Check]]:
    size = op.size
    plan = eltwise_plan(size, {d: op.dims[d] for d in ("P", "F") if d in op.dims}, len(op.rows))
    free, widest = size // plan.parts, WIDEST_FREE
    if "F" in op.dims:  # with a broadcast the tile counts elements of the free dims F (the compiler's own rule)
        free, widest = op.dims["F"], t.moving_fmax if op.rows else WIDEST_FREE  # rows ride on a ones-matmul
    frees = [v for v in divisors(free) if v >= min(64, free) and v <= widest]
    if free % tile_size(free, min(widest, 1024)):  # no good divisor: round widths, the last tile smaller
        frees = sorted(set(frees) | {v for v in (256, 512, 1024) if v < free and v <= widest})
    frees = frees or [free]
    role = free_role(op)
    values = _with_default(op.defaults.get(("tile", role)), frees)
    knobs = [Knob(f"tile {op.ref(role)}", "tile", op.ref(role), values)]
    names, (a, b) = list(op.vars.values()), op.run
    if "F" in op.dims and b > a and len(names) > b:  # a broadcast layout: its free tiles outside or inside its
        # partition tiles (`reorder`, directives._reorder_broadcast; None: the rule's choice)
        orders = (tuple(names[b:] + names[a:b]), tuple(names[a:b] + names[b:]))
        knobs.append(Knob(f"reorder {op.name}", "reorder", op.name, (None,) + orders))
    elif "F" not in op.dims:  # flattened data: N free tiles per DMA (`split`, core21)
        knobs.append(Knob(f"split {op.ref(role)}", "split", op.ref(role), (None, 2, 4)))
    return knobs, []


def reduce_knobs(op: OpView, dtypes: dict[str, str], t: Target) -> tuple[list[Knob], list[Check]]:
    """Rows per partition tile (<= 128) and elements per free tile (<= 4096: one tensor_reduce each, folded into
    the accumulator column): the divisors of the kept rows R and of the reduced size F, and where they have no good
    divisor round sizes, the last tile smaller (the rule cuts a ragged remainder, core22)."""
    rows, free = op.dims["R"], op.dims["F"]
    parts = [v for v in divisors(rows) if v <= t.pmax and v >= min(32, rows)]
    if rows % tile_size(rows, t.pmax):
        parts = sorted(set(parts) | {v for v in (64, 128) if v < rows and v <= t.pmax})
    frees = [v for v in divisors(free) if v <= REDUCE_FREE and v >= min(64, free)]  # the compiler's own bound
    if free % tile_size(free, min(REDUCE_FREE, 1024)):
        frees = sorted(set(frees) | {v for v in (512, 1024, 2048, 4096) if v < free and v <= REDUCE_FREE})
    parts, frees = parts or [min(rows, t.pmax)], frees or [min(free, REDUCE_FREE)]
    dflt = op.defaults
    return [Knob(f"tile {op.ref('k0')}", "tile", op.ref("k0"), _with_default(dflt.get(("tile", "k0")), parts)),
            Knob(f"tile {op.ref('r0')}", "tile", op.ref("r0"), _with_default(dflt.get(("tile", "r0")), frees))], []


KNOBS_FOR = {"conv": conv_knobs, "pool": pool_knobs, "transpose": transpose_knobs, "eltwise": eltwise_knobs,
             "reduce": reduce_knobs}


# ---- the space of a program ----------------------------------------------------------------------------------------


def _accepted(knob: Knob, ops: tuple, dtypes: dict[str, str], target) -> Knob:
    """The knob without its directives when the compiler's checks refuse every value of it on its own
    (directives.apply_schedule, the checks a directive meets before any builder runs): `hoist e` of a matmul's
    stationary operand, `tile Y.c` of a pool's channel loop, `tile y.x` of a matvec without that loop were
    candidates the compiler refused every time (core17: 6 of the 561 one-knob candidates of tests/programs/gaps15).
    Only None (no directive) stays then; a knob of which some value passes is kept whole, as values refused alone
    may pass with other knobs (`tile conv.y, 6` with `tile conv.x, 74`: the space's checks judge those). A knob
    with no None keeps its values (its checks read them)."""
    from tilec.compiler.directives import apply_schedule
    from tilec.lang.api import parse_schedule
    keep = []
    for v in knob.values:
        line = None if v is None else DIRECTIVES[knob.kind](knob, v)
        if line is not None:
            try:
                apply_schedule(ops, tuple(parse_schedule(line + "\n", "<tune>")), dtypes, target)
            except TilecError:
                continue
            except KeyError:  # a tensor of the compiler's own rewrites (permute_split's Y_pre): the compile decides
                pass
        keep.append(v)
    return knob if keep != [None] else replace(knob, values=(None,))



def build_space(job: Job) -> Space:
    """The schedule space of the job's program at its shapes (compiles the default schedule once)."""
    return space_of(compile_job(job, None), job.target)


def space_of(compiled, target: str) -> Space:
    """The schedule space around a program compiled with its default schedule (tilec.compiler.api.Compiled)."""
    dtypes = {name: t.dtype for name, t in compiled.program.tensors.items()}
    ops = op_views(compiled.result.ops, compiled.result.plans, dtypes)
    knobs: list[Knob] = []
    checks: list[Check] = []
    chained = {name for chain in compiled.result.chains for name in chain.members}
    # (a fused chain's convs have no tile knobs to bound them by: left out, the sum is still a lower bound)
    bounds: list[Bound] = [conv_bound(op, dtypes.get(op.tensor("moving") or "", "f32"), target)
                           for op in ops if op.kind == "conv" and op.name not in chained]
    for op in ops:
        rules = KNOBS_FOR.get(op.kind)
        if rules is None:  # an op kind the tuner does not know yet keeps the compiler's default schedule
            continue
        if op.name in chained:  # a row chain fused into one pass: a directive on one statement builds it alone
            continue           # (audit15: 3x slower), so the chain keeps the compiler's own tiles
        try:
            k, c = rules(op, dtypes, compiled.result.target)
        except KeyError as missing:  # the compiler's printed stage changed shape: a bug to fix here, loudly
            raise InternalError(f"the tuner cannot read {op.kind} {op.name} from the compiler's `select` stage "
                                f"(missing {missing}); update tilec/tune/knobs.py") from None
        # a statement the compiler split into several nests of one name (permute_split's per-head copies) gets its
        # knobs once: the directive names the statement, not one nest (nor twice from one op: depthwise_conv1d)
        seen = {kn.name for kn in knobs}
        for kn in k:
            if kn.name not in seen:
                seen.add(kn.name)
                knobs.append(_accepted(kn, compiled.result.ops, dtypes, compiled.result.target))
        checks += c
    bound = functools.partial(total_bound, tuple(bounds), target=target) if bounds else None
    space = Space(tuple(knobs), tuple(checks), bound=bound)
    return replace(space, experts=tuple(expert_points(space, ops, dtypes)))
