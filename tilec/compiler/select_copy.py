"""Data movement: a statement that copies one tensor into another with each index a loop variable shifted by a
constant (crop, shift, `Y[n, C1 + c, i, j] = B[n, c, i, j]`: one part of a concatenation), possibly padded
(`X[i - 2, j + 1] ?? 0`: a constant where the index leaves X, rules_copy.py) or divided by a
constant (nearest upsampling, `X[n, c, i / 2, j / 2]`, floor division). Selected as an element-wise op marked
`copy`; rules.copy schedules its level-A nest (large DMAs, replication on chip)."""
from __future__ import annotations

import math

from tilec.compiler.exprs import fmt_expr
from tilec.compiler.lower import Comp, affine_index, shifted_index, size_value, uses_names
from tilec.compiler.ops import EltwiseOp, reject
from tilec.errors import TilecError
from tilec.lang import syntax as sx

Index = tuple[str, int, int]  # (loop variable, divisor, constant): v / divisor + constant


def read_index(e: sx.Expr, names: set[str], sizes: dict[str, int]) -> Index | None:
    """`v + c` -> (v, 1, c); `v / k` -> (v, k, 0) (k a positive constant); anything else None."""
    if isinstance(e, sx.BinOp) and e.op == "/" and isinstance(e.lhs, sx.Name) and e.lhs.id in names \
            and not uses_names(e.rhs, names):
        k = size_value(e.rhs, sizes)
        return (e.lhs.id, k, 0) if k >= 1 else None
    if isinstance(e, sx.BinOp) and e.op in "/%":
        return None
    found = shifted_index(e, names, sizes)
    if found is None and uses_names(e, names):  # a strided read `s*v + c` (s >= 2): a strided slice X[c::s]
        try:
            coefs, const = affine_index(e, names, sizes)
        except TilecError:
            return None
        if len(coefs) == 1 and next(iter(coefs.values())) >= 2:
            return next(iter(coefs)), -next(iter(coefs.values())), const
    return (found[0], 1, found[1]) if found else None


def copy_indices(comp: Comp, program) -> list[Index] | None:
    """The read's indices when the statement is a data copy over the output's loops in the output's order."""
    if comp.red_op is not None or not isinstance(comp.init, sx.Access) or comp.init.tensor == comp.target:
        return None
    names = {v for v, _ in comp.extents}
    idx = [read_index(e, names, program.sizes) for e in comp.init.indices if uses_names(e, names)]
    if any(i is None for i in idx):
        return None
    found = [i for i in idx if i is not None]
    if [v for v, _, _ in found] != [v for v in comp.out_vars if comp.extent(v) > 1 or v in {u for u, _, _ in found}]:
        return None
    return found


def is_data_copy(comp: Comp, program) -> bool:
    """A copy that the element-wise and permute rules do not take: a shifted output or a shifted/divided read."""
    idx = copy_indices(comp, program)
    if idx is None:
        return False
    assert isinstance(comp.init, sx.Access)
    src = [size_value(d, program.sizes) if not isinstance(d, int) else d
           for d in program.tensors[comp.init.tensor].shape]
    names = {v for v, _ in comp.extents}
    src = [n for n, e in zip(src, comp.init.indices) if uses_names(e, names)]
    reads_part = len(src) < len(comp.init.indices) \
        or any(c != 0 or k < 0 or comp.extent(v) // k != n for (v, k, c), n in zip(idx, src))  # a crop
    return is_part(comp, program) or reads_part or any(k != 1 for _, k, _ in idx) or comp.init.fill is not None


def is_part(comp: Comp, program) -> bool:
    """Whether the statement writes a part of its output (a shifted index, or a loop shorter than the dimension)."""
    shape = [size_value(d, program.sizes) if not isinstance(d, int) else d for d in program.tensors[comp.target].shape]
    return bool(comp.out_index) or [comp.extent(v) for v in comp.out_vars] != shape


def select_copy(comp: Comp, program) -> EltwiseOp:
    idx = copy_indices(comp, program)
    assert idx is not None and isinstance(comp.init, sx.Access)
    for (v, k, _), e in zip(idx, comp.init.indices):
        if k != 1 and comp.init.fill is not None:
            raise reject(comp, f"a padded upsampling read (`{fmt_expr(e)}` with `?? fill`) is not compiled yet",
                         e.span, "upsample in one copy and pad in another (`P[i] = U[i - 1] ?? 0`)")
        if k > 0 and comp.extent(v) % k:
            raise reject(comp, f"`{fmt_expr(e)}` divides a loop of {comp.extent(v)} iterations by {k}", e.span,
                         f"make the loop's extent a multiple of {k}")
    roles = tuple((f"d{i}", v) for i, v in enumerate(comp.out_vars))
    size = math.prod(comp.extent(v) for v in comp.out_vars)
    return EltwiseOp(comp.target, comp.target, comp.init, (comp.init.tensor,), size, roles, comp.line, comp.span,
                     loop_lines=comp.lines, copy=True, out_index=comp.out_index,
                     loops=tuple((v, comp.extent(v)) for v in comp.out_vars))


def output_box(comp: Comp, program) -> list[tuple[int, int]]:
    """[start, stop) per output dimension that the statement writes."""
    names = {v for v, _ in comp.extents}
    if not comp.out_index:
        return [(0, comp.extent(v)) for v in comp.out_vars]
    out = []
    for v, e in zip(comp.out_vars, comp.out_index):
        _, const = affine_index(e, names, program.sizes)
        out.append((const, const + comp.extent(v)))
    return out


def part_targets(comps: tuple[Comp, ...], program) -> set[str]:
    """The tensors written in parts: by several copies (a concatenation) or at shifted indices."""
    copies = [c for c in comps if is_data_copy(c, program)]
    return {c.target for c in copies if c.out_index or sum(d.target == c.target for d in comps) > 1}


def check_parts(comps: tuple[Comp, ...], program, targets: set[str]) -> None:
    """A tensor written in parts (shifted outputs: a concatenation) is written once, whole: its parts are copies
    that do not overlap and together cover it (a kernel never leaves part of an output unwritten)."""
    for target in sorted(targets):
        parts = [c for c in comps if c.target == target]
        if not all(is_data_copy(c, program) for c in parts):
            other = next(c for c in parts if not is_data_copy(c, program))
            raise TilecError(f"the compiler cannot map `{target}`: it is written in parts, and line {other.line} "
                             "is not a copy", other.span, "write the parts of a tensor as copies of other tensors")
        shape = [size_value(d, program.sizes) if not isinstance(d, int) else d for d in program.tensors[target].shape]
        boxes = [output_box(c, program) for c in parts]
        for a in range(len(boxes)):
            for b in range(a):
                if all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(boxes[a], boxes[b])):
                    raise TilecError(f"the compiler cannot map `{target}`: lines {parts[b].line} and {parts[a].line} "
                                     f"both write some of its elements", parts[a].span,
                                     "write each element of the output once")
        written = sum(math.prod(hi - lo for lo, hi in box) for box in boxes)
        if written != math.prod(shape):
            where = f"line {parts[0].line} writes" if len(parts) == 1 else \
                f"lines {', '.join(str(c.line) for c in parts)} write"
            raise TilecError(f"the compiler cannot map `{target}`: {where} {written} of its {math.prod(shape)} "
                             f"elements", parts[-1].span,
                             "the compiler writes whole outputs: write every element of it (e.g. every channel of "
                             "a concatenation)")
