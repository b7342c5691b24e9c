"""Heuristic first guesses ("expert" points): what a careful person writing the kernel by hand would try first.

Rules of thumb from the assignment and the NKI docs: fill the 128 partitions; make the matmul moving operand as
wide as one PSUM bank allows (rows x columns <= 512); keep DMAs at >= 2-4 KiB per partition; load weights once;
keep the input band double-buffered (the default) so loads overlap the tensor engine.
"""
from __future__ import annotations

from tilec.compiler.ir import DTYPE_BYTES
from tilec.target import invariant
from tilec.tune.space import Point, Space

# the full tile and the widest matmul of every NeuronCore generation (tilec/target.py)
PMAX, MOVING_FMAX = invariant("pmax"), invariant("moving_fmax")


def largest(values: tuple, ok) -> int | None:
    fits = [v for v in values if isinstance(v, int) and ok(v)]
    return max(fits) if fits else None


def set_known(space: Space, point: Point, **wanted: object) -> Point:
    """`point` with the named knobs set, skipping values that knob does not offer."""
    values = list(point)
    for i, knob in enumerate(space.knobs):
        if knob.name in wanted and wanted[knob.name] in knob.values:
            values[i] = wanted[knob.name]
    return tuple(values)


def knob_values(space: Space, name: str) -> tuple:
    return next((k.values for k in space.knobs if k.name == name), ())


def conv_experts(space: Space, op, dtypes: dict[str, str]) -> list[dict]:
    """Full 128x128 tiles, whole output rows as the moving operand, as many rows per matmul as a PSUM bank
    holds; then the widest input band first (fewest DMAs), double-buffered (the NKI compiler's rotation: more buffers
    build the same kernel). Illegal combinations
    (e.g. a band too big for SBUF) are dropped by the caller, so the widest *legal* band comes first."""
    wy = (op.pool or (1, 1))[0]
    k, c, x, y = (f"tile {op.ref(r)}" for r in "kcxy")
    tx = largest(knob_values(space, x), lambda v: True) or op.dims["Wo"]
    rows = largest(knob_values(space, y), lambda v: v * tx <= MOVING_FMAX and v % wy == 0) or 1
    bands = sorted((b for b in knob_values(space, f"split {op.ref('y')}") if isinstance(b, int) and b % rows == 0),
                   reverse=True)
    if not bands:  # a matmul (one spatial dim): whole rows, or one band per moving tile so the last store is small
        return [{k: PMAX, c: PMAX, x: tx, f"split {op.ref('x')}": cols} for cols in (None, tx)]
    # weights loaded per in-channel tile let the first PE transposes start after a smaller DMA (a convolution
    # has R*S transposes per tile block to hide; a matmul's single one is better served by one big DMA)
    split_w = {f"split {op.tensor('stationary')}": op.ref("c")}
    return [{k: PMAX, c: PMAX, x: tx, y: rows, f"split {op.ref('y')}": b, **extra}
            for b in bands for extra in ({}, split_w)]


def transpose_experts(space: Space, op, dtypes: dict[str, str]) -> list[dict]:
    tile = f"tile {op.ref('i')}"
    si, sj = f"split {op.ref('i')}", f"split {op.ref('j')}"
    elem = DTYPE_BYTES.get(dtypes.get(op.tensor("src") or "", "f32"), 4)
    per_dma = max(1, 8192 // (PMAX * elem))  # 8 KiB per partition per DMA
    out = []
    for method in (None, "dma"):
        want = {tile: PMAX, f"method {op.name}": method}
        for s, extent in ((si, op.dims["M"]), (sj, op.dims["N"])):
            want[s] = largest(knob_values(space, s), lambda v: v <= per_dma and (extent // PMAX) % v == 0)
        out.append(want)
    return out


def free_role(op) -> str:
    """The role of the element-wise loop whose tile is the free size (the compiler's default directive names it:
    a loop of the free run of a broadcast layout; any loop of flattened data)."""
    return next((role for name, role in op.defaults if name == "tile"), "d0")


def eltwise_experts(space: Space, op, dtypes: dict[str, str]) -> list[dict]:
    name = f"tile {op.ref(free_role(op))}"
    return [{name: largest(knob_values(space, name), lambda v: v <= n)} for n in (2048, 8192)]


EXPERTS = {"conv": conv_experts, "transpose": transpose_experts, "eltwise": eltwise_experts}


def expert_points(space: Space, ops: list, dtypes: dict[str, str], limit: int = 6) -> list[Point]:
    """Up to `limit` legal points combining the ops' expert guesses, in the rules' order of preference (ops
    without rules keep the compiler's default)."""
    points = [space.default_point()]
    for op in ops:
        rules = EXPERTS.get(op.kind)
        if rules is None:
            continue
        guesses = rules(space, op, dtypes)
        points = [set_known(space, p, **g) for p in points for g in guesses] or points
    unique: list[Point] = []
    for p in points:
        if p not in unique and p != space.default_point() and space.check(p) is None:
            unique.append(p)
    return unique[:limit]
