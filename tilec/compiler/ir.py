"""The loop-nest IR: tile-level loops over explicit buffers in HBM, SBUF and PSUM, one statement per engine op.

Term grammar (every node is a small frozen record; `print_ir` prints it the way it is written here):

    Aff    = sum of coef*var terms + const          coef may carry a constant's name: `ct*TILE_C + 2`
    Idx    = Aff                                     a single element of a dimension (drops it)
           | Sl(start: Aff, size, step)              `start:start+size` (step > 1: `start:start+size*step:step`)
    View   = buf[Idx, ...]                           a rectangular (possibly strided) region of a buffer
           | buf[Idx, ...].permute(p0, p1, ..)       its slices' axes reordered (numpy's transpose of the region):
                                                     HBM views moved by a DMA only (one store of row pairs' band)
           | buf[Idx, ...].blocks(axis, count, step)  the region repeated `count` times, `step` further along buffer
                                                     axis `axis` each time, as a leading axis of the view (HBM side
                                                     of a DMA only: dma_merge's one DMA for a loop of block DMAs)
    Buf    = name, memory in hbm|sbuf|psum, dtype, shape      on-chip shapes put the partition dimension first
    Stmt   = Loop(var, extent, kind, body)           kind in affine|sequential|static
           | Alloc(buf, zero)                        an on-chip buffer (zero: PSUM accumulator set to 0)
           | Reshape(buf, base)                      an HBM view of a kernel argument with another shape
           | Dma(dst, src)                           HBM <-> SBUF copy
           | Matmul(acc, stationary, moving)         acc (PSUM) += stationary.T @ moving
           | Transpose(dst, src)                     PE transpose of src (SBUF) into dst (PSUM); or DMA transpose
           | Copy(dst, src, engine)                  PSUM/SBUF -> SBUF copy with a dtype cast
           | Act(dst, src, func, bias, scale, total)  dst = func(src * scale + bias), bias per partition;
                                                     total (P, 1) = the sum of dst along the free dims
           | Binary(dst, a, b, op, engine)           dst = a op b element-wise (tensor_tensor)
           | Scalar(dst, src, op, value, reverse, engine)  dst = src op value (tensor_scalar); value: a constant or
                                                     a (P, 1) column, one scalar per partition; reverse: value op src
           | Reduce(dst, src, op)                     dst (P, 1) = op over the free elements of src (tensor_reduce);
                                                     op bn_stats / bn_aggr: VectorE's mean and variance pair
           | Reduce(dst, src, op, window=(step, taps))  a window reduction: dst[.., o] = op over k < taps of
                                                     src[.., o*step + k] (src's last axis read through an
                                                     overlapping access pattern; printed `window taps/step`)
           | Identity(dst)                           dst (SBUF, n x n) = I, built on chip: a memset to 1, then an
                                                     affine_select keeping partition p == column f (GpSimdE)
           | Block(label, body, hoist, pin)          a named group of statements (one phase of a kernel); a
                                                     hoistable block is a load the `hoist` pass may lift out
                                                     of loops it does not use (never out of loop `pin`)
    Kernel = name, params: Buf..., outputs: Buf..., consts: (name, value)..., body: Stmt...

`engine` on Copy, Binary and Scalar names the engine the instruction runs on, in NKI's spelling (vector | scalar |
gpsimd; printed as `copy.gpsimd`, `add.scalar`, ...): "" is the instruction's default (VectorE). Which engines each
instruction accepts on a generation is `Instr.engines` of tilec/target.py; the verifier checks it, codegen writes
`engine=nisa.<name>_engine`, and the interpreter and the performance model run the instruction on that engine.

Every statement may carry `line`, the .tl line it comes from (printed as `# tl:LINE`), so generated code and the
performance model can attribute work to the user's program.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

MEMORIES = ("hbm", "sbuf", "psum")
DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2}


@dataclass(frozen=True)
class Term:
    var: str
    coef: int = 1
    name: str = ""  # the named constant `coef` stands for, e.g. TILE_K ("" = literal)


@dataclass(frozen=True)
class Aff:
    terms: tuple[Term, ...] = ()
    const: int = 0

    def vars(self) -> tuple[str, ...]:
        return tuple(t.var for t in self.terms)

    def plus(self, other: "Aff | int") -> "Aff":
        if isinstance(other, int):
            return Aff(self.terms, self.const + other)
        return Aff(self.terms + other.terms, self.const + other.const)


def aff(*parts: "Term | str | int") -> Aff:
    """aff("y", Term("ct", 128, "TILE_C"), 3) -> y + ct*TILE_C + 3."""
    terms, const = [], 0
    for p in parts:
        if isinstance(p, int):
            const += p
        elif isinstance(p, str):
            terms.append(Term(p))
        else:
            terms.append(p)
    return Aff(tuple(terms), const)


@dataclass(frozen=True)
class Sl:
    start: Aff
    size: int
    step: int = 1
    name: str = ""  # the named constant `size` stands for (codegen prints it)


Idx = Union[Aff, Sl]


def full(n: int) -> Sl:
    return Sl(Aff(), n)


@dataclass(frozen=True)
class Buf:
    name: str
    memory: str  # hbm | sbuf | psum
    dtype: str  # f32 | f16 | bf16
    shape: tuple[int, ...]

    def bytes_per_partition(self) -> int:
        size = DTYPE_BYTES[self.dtype]
        for d in self.shape[1:]:
            size *= d
        return size


@dataclass(frozen=True)
class View:
    buf: Buf
    idx: tuple[Idx, ...]
    # the region's axes (its slices, in index order) in this order: element [j0, j1, ..] of the view is the region's
    # element whose axis perm[a] index is j_a (numpy's `region.transpose(perm)`); () = as indexed. A DMA moves
    # elements in row-major order of both views' shapes, so an HBM side permuted this way meets an on-chip side laid
    # out in another order (verify.py: HBM views of a DMA only)
    perm: tuple[int, ...] = ()
    # (axis, count, step) per leading axis, outermost first: the region (permuted) repeated `count` times, shifted
    # by `step` elements along the buffer's axis `axis` each time (an HBM access pattern's extra dimension; only the
    # HBM side of a DMA, after every pass that reads views: dma_merge.py)
    blocks: tuple[tuple[int, int, int], ...] = ()

    def shape(self) -> tuple[int, ...]:
        dims = tuple(i.size for i in self.idx if isinstance(i, Sl))
        return tuple(b[1] for b in self.blocks) + (tuple(dims[p] for p in self.perm) if self.perm else dims)


def whole(buf: Buf) -> View:
    return View(buf, tuple(full(n) for n in buf.shape))


@dataclass(frozen=True)
class Loop:
    var: str
    extent: int
    body: tuple["Stmt", ...]
    kind: str = "affine"  # affine | sequential | static
    extent_name: str = ""  # named constant for the trip count
    line: int = 0
    note: str = ""  # the .tl loop it implements, e.g. "for c in 0..C"


@dataclass(frozen=True)
class Alloc:
    buf: Buf
    zero: bool = False
    line: int = 0


@dataclass(frozen=True)
class Reshape:
    buf: Buf
    base: Buf
    line: int = 0


@dataclass(frozen=True)
class Dma:
    dst: View
    src: View
    line: int = 0
    # trigger: the engine named to issue it ("sync"; NKI 0.6 dge_mode=hwdge, engine=...), "" for the compiler's choice
    trigger: str = ""


@dataclass(frozen=True)
class Matmul:
    acc: View
    stationary: View
    moving: View
    line: int = 0
    # start: the matmul starts a new sum over its region of acc (overwrites whatever the tile holds: a PSUM tile
    # reused for another sum), NKI 0.1 `acc[...] = nc_matmul(..)`, 0.6 accumulate=False; else it adds, but the first
    # matmul of a zeroed allocation (verify.chain_starts)
    start: bool = False
    # ones: stationary holds only ones and zeros (is_stationary_onezero=True: fp32 at up to 2x, ISA1/ISA6 nc_matmul)
    ones: bool = False


@dataclass(frozen=True)
class Transpose:
    dst: View
    src: View
    engine: str = "pe"  # pe (nc_transpose into PSUM) | dma (dma_transpose HBM -> SBUF)
    line: int = 0


@dataclass(frozen=True)
class Copy:
    dst: View
    src: View
    line: int = 0
    engine: str = ""  # "": the default (VectorE) | scalar | gpsimd (SBUF only)


@dataclass(frozen=True)
class Act:
    dst: View
    src: View
    func: str = "copy"  # copy | an activation of tilec.lang.functions (relu, exp, sqrt, ...)
    bias: View | None = None
    scale: "float | View" = 1.0  # a constant, or a (P, 1) column: one factor per partition
    line: int = 0
    total: View | None = None  # a (P, 1) column that also receives the sum of the result along the free dims


@dataclass(frozen=True)
class Binary:
    dst: View
    a: View
    b: View
    op: str  # add | subtract | multiply | divide | maximum | minimum
    line: int = 0
    engine: str = ""  # "": the default (VectorE) | gpsimd (SBUF only; a second engine sharing the work)
    # != 1: dst = (a * scale0) op b, one VectorE scalar_tensor_tensor (VectorE only): abs(x) = max(-x, x)
    scale0: float = 1.0


@dataclass(frozen=True)
class Scalar:
    dst: View
    src: View
    op: str  # add | subtract | multiply | divide | maximum | minimum
    value: "float | View"  # a constant, or a (P, 1) view: one scalar per partition, broadcast along the free dims
    line: int = 0
    reverse: bool = False  # value op src (for the non-commutative subtract)
    engine: str = ""  # "": the default (VectorE) | scalar (multiply or add only)
    op1: str = ""  # a second operator applied to the first one's result in the same instruction (a clamp's min)
    value1: "float | View" = 0.0  # its operand: a constant or a (P, 1) column, as `value`


@dataclass(frozen=True)
class Reduce:
    dst: View  # a (P, 1) column, or (P, G) for a (P, G, F) src
    src: View  # (P, F): every free element of a partition folds into its one value; (P, G, F): the last axis
    # add | maximum | minimum; or VectorE's statistics pair (mean_var.py): bn_stats (src (P, <= 512) -> dst (P, 6):
    # count, mean, variance * count of the even then the odd elements), bn_aggr (src (P, 3k) triples -> dst (P, 2):
    # the mean and the variance)
    op: str
    line: int = 0
    # (step, taps): a window reduction along src's last axis (see `window_shape`); () = the plain reduction above
    window: tuple[int, ...] = ()


def window_shape(src: View, window: tuple[int, ...]) -> tuple[int, ...]:
    """The access pattern a window Reduce reads: src's shape with its last axis (o - 1) * step + taps elements long
    read as (o, taps), element [.., o, k] = src[.., o*step + k]: an affine window view `[p, .., o*step + k]` whose
    windows overlap when step < taps (NKI 0.1 `t[i_p, i_r, s*i_o + i_k]` over nl.mgrid, 0.6 `.ap([[F, P], ..,
    [s, O], [1, K]])`; docs/notes/pool18.md). () when the last axis is not such a span."""
    step, taps = window
    *rest, span = src.shape()
    if step < 1 or taps < 1 or span < taps or (span - taps) % step:
        return ()
    return (*rest, (span - taps) // step + 1, taps)


def window_axes(src: View, window: tuple[int, ...], out: tuple[int, ...]) -> list[int | None] | None:
    """For each axis of `out` (a window Reduce's dst shape, which may have dropped or kept unit axes: the squeeze
    pass) the axis of window_shape(src, window) it walks (None: a unit axis of its own); None if they do not match."""
    shape = window_shape(src, window)[:-1]
    axes: list[int | None] = []
    w = 0
    for n in out:
        while w < len(shape) and shape[w] == 1 and n != 1:
            w += 1
        if w < len(shape) and shape[w] == n:
            axes.append(w)
            w += 1
        elif n == 1:
            axes.append(None)
        else:
            return None
    return axes if all(n == 1 for n in shape[w:]) else None


@dataclass(frozen=True)
class Identity:
    """dst = the n x n identity matrix, built on chip with no HBM round trip: `memset(dst, 1)` (VectorE), then
    `affine_select(p - f == 0, dst, 0)` (GpSimdE). Both dialects document both instructions (NKI 0.1: nki-spec
    §1.10.10 memset, §1.10.11 affine_select with an arange predicate; 0.6: the [[step, num]] pattern with
    channel_multiplier and cmp_op, nki-spec §3); their costs are nki-spec §2.4 (memset max(64, N), affine_select
    150 + N GpSimdE cycles). `nl.shared_identity_matrix` is not used: its docs (v2.29.0/v2.30.0) say it behaves as
    `nl.shared_constant`, a tensor in HBM loaded at model load time, so reading it is still a DMA."""
    dst: View
    line: int = 0


@dataclass(frozen=True)
class Block:
    label: str
    body: tuple["Stmt", ...]
    line: int = 0
    hoist: bool = False  # a load group that `hoist` may move out of loops it does not depend on
    pin: str = ""  # ...but never out of this loop (the schedule's `hoist T, OP.v`)


Stmt = Union[Loop, Alloc, Reshape, Dma, Matmul, Transpose, Copy, Act, Binary, Scalar, Reduce, Identity, Block]


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Buf, ...]
    outputs: tuple[Buf, ...]
    body: tuple[Stmt, ...]
    consts: tuple[tuple[str, int], ...] = ()
    notes: tuple[str, ...] = field(default=())  # header comment lines (program, schedule)


# ---- printer -------------------------------------------------------------------------------------------------------


def fmt_aff(a: Aff) -> str:
    parts = []
    for t in a.terms:
        coef = t.name or (str(t.coef) if t.coef != 1 else "")
        parts.append(f"{t.var}*{coef}" if coef else t.var)
    if a.const or not parts:
        parts.append(str(a.const))
    return " + ".join(parts).replace("+ -", "- ")


def fmt_idx(i: Idx) -> str:
    if isinstance(i, Aff):
        return fmt_aff(i)
    if not i.start.terms and i.start.const == 0 and i.step == 1:
        return f":{i.size}"
    stop = f"+{i.size}" if i.step == 1 else f"+{(i.size - 1) * i.step + 1}:{i.step}"
    return f"{fmt_aff(i.start)}:{stop}"


def fmt_view(v: View) -> str:
    perm = f".permute({', '.join(map(str, v.perm))})" if v.perm else ""
    blocks = "".join(f".blocks({axis}, {count}, {step})" for axis, count, step in v.blocks)
    return f"{v.buf.name}[{', '.join(fmt_idx(i) for i in v.idx)}]{perm}{blocks}"


def fmt_buf(b: Buf) -> str:
    return f"{b.name}: {b.memory} {b.dtype}[{', '.join(map(str, b.shape))}]"


def _stmt_head(s: Stmt) -> str:
    if isinstance(s, Alloc):
        return f"alloc {fmt_buf(s.buf)}" + (" = 0" if s.zero else "")
    if isinstance(s, Reshape):
        return f"view {fmt_buf(s.buf)} = {s.base.name}"
    if isinstance(s, Dma):
        return f"dma {fmt_view(s.dst)} <- {fmt_view(s.src)}" + (f" [{s.trigger}]" if s.trigger else "")
    if isinstance(s, Matmul):
        op = "=" if s.start else "+="
        return f"matmul {fmt_view(s.acc)} {op} {fmt_view(s.stationary)}.T @ {fmt_view(s.moving)}"
    if isinstance(s, Transpose):
        return f"transpose.{s.engine} {fmt_view(s.dst)} <- {fmt_view(s.src)}"
    if isinstance(s, Copy):
        return f"copy{_on(s.engine)} {fmt_view(s.dst)} <- {fmt_view(s.src)}"
    if isinstance(s, Act):
        bias = f" + {fmt_view(s.bias)}" if s.bias else ""
        scale = f" * {fmt_view(s.scale)}" if isinstance(s.scale, View) else f" * {s.scale:g}" if s.scale != 1.0 else ""
        total = f", sum -> {fmt_view(s.total)}" if s.total is not None else ""
        return f"act {fmt_view(s.dst)} <- {s.func}({fmt_view(s.src)}{scale}{bias}){total}"
    if isinstance(s, Binary):
        scaled = f" * {s.scale0:g}" if s.scale0 != 1.0 else ""
        return f"{s.op}{_on(s.engine)} {fmt_view(s.dst)} <- {fmt_view(s.a)}{scaled}, {fmt_view(s.b)}"
    if isinstance(s, Scalar):
        value = fmt_view(s.value) if isinstance(s.value, View) else f"{s.value:g}"
        args = f"{value}, {fmt_view(s.src)}" if s.reverse else f"{fmt_view(s.src)}, {value}"
        value1 = fmt_view(s.value1) if isinstance(s.value1, View) else f"{s.value1:g}"
        then = f" then {s.op1} {value1}" if s.op1 else ""
        return f"{s.op}{_on(s.engine)} {fmt_view(s.dst)} <- {args}{then}"
    if isinstance(s, Reduce):
        window = f" window {s.window[1]}/{s.window[0]}" if s.window else ""
        return f"reduce.{s.op} {fmt_view(s.dst)} <- {fmt_view(s.src)}{window}"
    if isinstance(s, Identity):
        return f"identity {fmt_view(s.dst)}"
    raise TypeError(type(s).__name__)


def _on(engine: str) -> str:
    return f".{engine}" if engine else ""


def _lines(body: tuple[Stmt, ...], depth: int, out: list[str]) -> None:
    pad = "  " * depth
    for s in body:
        tag = f"  # tl:{s.line}" if getattr(s, "line", 0) else ""
        if isinstance(s, Loop):
            extent = s.extent_name or str(s.extent)
            out.append(f"{pad}for {s.var} in {s.kind}({extent}):{tag}")
            _lines(s.body, depth + 1, out)
        elif isinstance(s, Block):
            how = f" [hoistable{', inside ' + s.pin if s.pin else ''}]" if s.hoist else ""
            out.append(f"{pad}block {s.label}{how}:{tag}")
            _lines(s.body, depth + 1, out)
        else:
            out.append(pad + _stmt_head(s) + tag)


def print_ir(k: Kernel) -> str:
    out = [f"kernel {k.name}({', '.join(fmt_buf(p) for p in k.params)})"]
    out += [f"  out {fmt_buf(b)}" for b in k.outputs]
    out += [f"  const {name} = {value}" for name, value in k.consts]
    _lines(k.body, 1, out)
    return "\n".join(out) + "\n"


def engine_of(s: Stmt) -> str:
    """The instruction stream that runs `s`: pe (TensorE), scalar (ScalarE), vector (VectorE), gpsimd, dma (a transfer
    or a DMA transpose); "" for what is no instruction (allocations, loops, blocks) or an identity's fill."""
    if isinstance(s, Dma):
        return "dma"
    if isinstance(s, (Matmul, Transpose)):
        return "dma" if getattr(s, "engine", "pe") == "dma" else "pe"
    if isinstance(s, Act):
        return "scalar"
    if isinstance(s, (Binary, Copy, Scalar)):
        return s.engine or "vector"
    return "vector" if isinstance(s, Reduce) else ""

def view_vars(v: View) -> set[str]:
    """The loop variables a view's indices use."""
    return {t.var for i in v.idx for t in (i.start.terms if isinstance(i, Sl) else i.terms)}


def views(s: Stmt) -> list[View]:
    """The operands of a statement that are views of buffers, in field order."""
    return [v for v in vars(s).values() if isinstance(v, View)]


def walk(body: tuple[Stmt, ...]):
    """Every statement, pre-order, with nested loops and blocks."""
    for s in body:
        yield s
        if isinstance(s, (Loop, Block)):
            yield from walk(s.body)
