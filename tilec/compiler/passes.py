"""Loop-nest IR passes after building: loop-invariant hoisting of load groups, unrolling, the allocation report."""
from __future__ import annotations

import dataclasses
from dataclasses import replace

from tilec.compiler import ir, named, names
from tilec.compiler.build_util import map_aff
from tilec.compiler.ir import Aff, Block, Kernel, Loop, Stmt, Term
from tilec.compiler.op_scope import is_scope
from tilec.compiler.verify import memory_summary


def hoist(k: Kernel) -> Kernel:
    """Move each hoistable load Block out of every loop whose variable it does not use (and not past its pin).
    The input band leaves the out-channel loop (golden excerpt: tests/golden/compiler/passes/hoist.txt):

        -        block input band X: all contraction tiles, shared by every output tile [hoistable]:  # tl:12
        +      block input band X: all contraction tiles, shared by every output tile [hoistable]:  # tl:12
    """
    return replace(k, body=_hoist_body(k.body))


def _hoist_body(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            inner = _hoist_body(s.body)
            lifted = _lifted(inner, s.var) if not is_scope(s) else []  # (op_scope.py)
            kept = tuple(b for b in inner if not any(b is x for x in lifted))
            out += lifted
            out.append(replace(s, body=kept))
        elif isinstance(s, Block):
            out.append(replace(s, body=_hoist_body(s.body)))
        else:
            out.append(s)
    return tuple(out)


def _lifted(body: tuple[Stmt, ...], var: str) -> list[Stmt]:
    """The blocks of a loop body that leave the loop: hoistable, not using var, and reading nothing that a statement
    staying in the loop writes (a block may read another lifted block's column: both leave, in order)."""
    lifted = [b for b in body if _liftable(b, var) and not _shares_a_write(b, body)]
    while True:
        kept = tuple(b for b in body if not any(b is x for x in lifted))
        stay = [b for b in lifted if _reads_a_write(b, kept)]
        if not stay:
            return lifted
        lifted = [b for b in lifted if not any(b is x for x in stay)]


def _liftable(s: Stmt, var: str) -> bool:
    return isinstance(s, Block) and s.hoist and s.pin != var and var not in _vars(s)


def _shares_a_write(b: Stmt, body: tuple[Stmt, ...]) -> bool:
    """Another statement of the loop body allocates or writes a buffer (by name) that `b` writes: lifting `b` would
    move its write past theirs (two peeled input bands both named X_band: lifted together, the first band's
    matmuls read the second's rows)."""
    mine = _written((b,))
    return any(mine & _written((s,)) for s in body if s is not b)


def _reads_a_write(b: Stmt, body: tuple[Stmt, ...]) -> bool:
    """Another statement of the loop body writes a buffer that `b` reads: `b` computes from the loop's own values
    (a column computed from a row tile's statistic), so it stays in the loop."""
    mine = _read((b,))
    return any(mine & _written((s,)) for s in body if s is not b)


# the fields a statement writes through: its destination, a matmul's accumulator, an activation's row sums
_WRITES = ("dst", "acc", "total")


def _read(body: tuple[Stmt, ...]) -> set[str]:
    return {v.buf.name for x in ir.walk(body) if dataclasses.is_dataclass(x) for f in dataclasses.fields(x)
            if f.name not in ("dst", "total") and isinstance(v := getattr(x, f.name), ir.View)}


def _written(body: tuple[Stmt, ...]) -> set[str]:
    return {x.buf.name for x in ir.walk(body) if isinstance(x, ir.Alloc)} | \
        {v.buf.name for x in ir.walk(body) if not isinstance(x, ir.Alloc)
         for f in _WRITES if isinstance(v := getattr(x, f, None), ir.View)}


def _vars(node) -> set[str]:
    found: set[str] = set()

    def fn(x: Aff) -> Aff:
        found.update(x.vars())
        return x
    map_aff(node, fn)
    return found


def unroll(k: Kernel, names: set[str]) -> Kernel:
    """Loops the schedule unrolls (by their variables in the built nest) become `static`
    (nl.static_range: traced once per iteration) (golden excerpt: tests/golden/compiler/passes/unroll.txt):

        -        for r in affine(3):  # tl:14
        +        for r in static(3):  # tl:14
    """
    return replace(k, body=_unroll(k.body, names)) if names else k


def unroll_stmts(body: tuple[Stmt, ...], names: set[str]) -> tuple[Stmt, ...]:
    """The loops named in `names` of these statements (one op's, before they join the kernel) as static ranges."""
    return _unroll(body, names)


def _unroll(body: tuple[Stmt, ...], names: set[str]) -> tuple[Stmt, ...]:
    out = []
    for s in body:
        if isinstance(s, Loop):
            s = replace(s, body=_unroll(s.body, names), kind="static" if s.var in names else s.kind)
        elif isinstance(s, Block):
            s = replace(s, body=_unroll(s.body, names))
        out.append(s)
    return tuple(out)


def rename_consts(stmts: list[Stmt], prefix: str) -> list[Stmt]:
    """Prefix every named constant (in index terms, slice sizes, and the names of trip counts and dimensions but the
    program's sizes, which the ops share): two ops in one kernel keep their own."""
    def fn(x: Aff) -> Aff:
        return Aff(tuple(Term(t.var, t.coef, prefix + t.name if t.name else "") for t in x.terms), x.const)

    def sl_fn(x: ir.Sl) -> ir.Sl:
        return replace(x, name=prefix + x.name) if x.name else x

    def text_fn(x: named.Named) -> int:
        return named.renamed(x, {w: prefix + w for w in named.words(x.text) if not named.is_size(w)})
    return list(named.map_ints(map_aff(tuple(stmts), fn, sl_fn), text_fn))


def peak_usage(body: tuple[Stmt, ...]) -> tuple[int, int]:
    """Worst case over nesting paths: (SBUF bytes per partition, PSUM tiles) live at once."""
    sbuf = psum = 0
    best_s = best_p = 0
    for s in body:
        if isinstance(s, ir.Alloc) and s.buf.memory == "sbuf":
            sbuf += s.buf.bytes_per_partition()
        elif isinstance(s, ir.Alloc) and s.buf.memory == "psum":
            psum += 1
        elif isinstance(s, Block):
            inner_s, inner_p = peak_usage(s.body)
            sbuf, psum = sbuf + inner_s, psum + inner_p
        elif isinstance(s, Loop):
            inner_s, inner_p = peak_usage(s.body)
            best_s, best_p = max(best_s, sbuf + inner_s), max(best_p, psum + inner_p)
    return max(best_s, sbuf), max(best_p, psum)


def allocations(k: Kernel) -> list[ir.Buf]:
    return [s.buf for s in ir.walk(k.body) if isinstance(s, ir.Alloc) and s.buf.memory == "sbuf"]


def allocation_report(k: Kernel, budget: int, banks: int, bank_bytes: int) -> str:
    lines = [f"{'buffer':<24} {'memory':<6} {'shape':<28} bytes/partition"]
    for name, memory, shape, size in memory_summary(k):
        lines.append(f"{name:<24} {memory:<6} {shape:<28} {size}")
    sbuf, psum = peak_usage(k.body)
    lines.append(f"peak SBUF per partition: {sbuf} bytes ({sbuf / 1024:.1f} KiB of {budget // 1024} KiB usable)")
    lines.append(f"peak PSUM tiles live: {psum} of {banks} banks ({bank_bytes // 1024} KiB each)")
    return "\n".join(lines) + "\n"


def legalise(k: Kernel) -> Kernel:
    """An affine loop whose iterations write the same location of a buffer allocated outside it (a
    single-buffered band, say) carries a dependence: it becomes a sequential_range. PSUM accumulation (matmul +=) is
    exempt (golden excerpt: tests/golden/compiler/passes/legalise.txt):

        -    for n in affine(2):  # tl:11
        +    for n in sequential(2):  # tl:11
    """
    return replace(k, body=_legalise(k.body))


def _legalise(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    out = []
    for s in body:
        if isinstance(s, Loop):
            s = replace(s, body=_legalise(s.body))
            if s.kind == "affine" and _carries(s):
                s = replace(s, kind="sequential")
        elif isinstance(s, Block):
            s = replace(s, body=_legalise(s.body))
        out.append(s)
    return tuple(out)


def _carries(loop: Loop) -> bool:
    local = {x.buf.name for x in ir.walk(loop.body) if isinstance(x, ir.Alloc)}
    for x in ir.walk(loop.body):
        dst = getattr(x, "dst", None)
        if isinstance(x, ir.Matmul) or dst is None or dst.buf.name in local or dst.buf.memory == "hbm":
            continue
        if loop.var not in _vars(dst):
            return True
    return False


def fp32_operands(k: Kernel) -> Kernel:
    """A tensor_scalar's (P, 1) operand and an activation's scale column must be float32 (NISA; the interpreter's
    [tensor_scalar_operand_dtype] and [err_activation_scale_invalid_type]). A statistic the program keeps in f16 or
    bf16 (`s[i]` of a bf16 tensor) is read through an fp32 copy made just before its first such use in a body (a
    widening: exact). Found by the fuzzer's several-statistics nests (gen_nests.py): `A * 3 - s6[i] + s2[i]` with
    bf16 s6, s2 built a kernel the interpreter refused."""
    taken = {x.buf.name for x in ir.walk(k.body) if isinstance(x, ir.Alloc)}
    taken |= {b.name for b in (*k.params, *k.outputs)}
    return replace(k, body=_fp32_body(k.body, taken))


def _fp32_body(body: tuple[Stmt, ...], taken: set[str]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    made: dict[ir.View, ir.View] = {}  # a narrow column -> its fp32 copy, until the column is written again

    def wide(v: "float | ir.View", line: int) -> "float | ir.View":
        if not isinstance(v, ir.View) or v.buf.dtype == "f32":
            return v
        if v not in made:
            buf = ir.Buf(names.unique(f"{v.buf.name}_f32", taken), "sbuf", "f32", v.shape())
            out.extend([ir.Alloc(buf, line=line), ir.Copy(ir.whole(buf), v, line=line)])
            made[v] = ir.whole(buf)
        return made[v]

    for s in body:
        if isinstance(s, (Loop, Block)):
            out.append(replace(s, body=_fp32_body(s.body, taken)))
            made.clear()
            continue
        if isinstance(s, ir.Scalar):
            s = replace(s, value=wide(s.value, s.line), value1=wide(s.value1, s.line))
        elif isinstance(s, ir.Act):
            s = replace(s, scale=wide(s.scale, s.line))
        out.append(s)
        dst = getattr(s, "dst", None)
        if isinstance(dst, ir.View):  # a column written again is copied again at its next use
            for v in [v for v in made if v.buf.name == dst.buf.name]:
                del made[v]
    return tuple(out)
