"""The operation records selection produces (one per engine-level computation) and helpers over index maps.

Each op keeps `vars`: role -> the .tl loop variable, so schedule directives can name loops by the user's names
(`conv.y`). `reject` is the one way selection says "this statement has no mapping": a TilecError at the statement.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from tilec.compiler.exprs import accesses
from tilec.compiler.lower import Comp, affine_index
from tilec.errors import Span, TilecError
from tilec.lang import syntax as sx


class _LoopLines:
    """Pools, transposes, element-wise ops and reductions: named dimensions; each loop carries the line of the .tl
    `for` it implements."""

    # fields of the dataclasses that mix this in (annotations only: _LoopLines itself is not a dataclass)
    dims: tuple[tuple[str, int], ...]
    vars: tuple[tuple[str, str], ...]
    line: int
    loop_lines: tuple[tuple[str, int], ...]

    def line_of(self, role: str) -> int:
        """The .tl line of the loop playing `role` (the statement's line if unknown)."""
        return dict(self.loop_lines).get(dict(self.vars).get(role, ""), self.line)

    def dim(self, d: str) -> int:
        return dict(self.dims)[d]


@dataclass(frozen=True)
class PoolSpec:
    wy: int
    wx: int
    op: str  # maximum | minimum | add
    scale: float = 1.0


@dataclass(frozen=True)
class EpiStep:
    """One element-wise step of a contraction's fused epilogue (eviction_fusion.py), applied to the value v after
    the eviction (and its bias, relu, residual): kind "func": v = op(v), an activation of the function table;
    "alu": v = v op operand (reverse: operand op v), the operand a constant, ("col", b) a per-output-channel
    vector read b[k], or ("tensor", S) a tensor read at the output's element; "round": v rounded to dtype `op` (a
    narrow intermediate the fusion does not store)."""
    kind: str
    op: str
    operand: "float | tuple[str, str] | str | None" = None  # (round: the tensor name)
    reverse: bool = False


@dataclass(frozen=True)
class Window:
    """A pool whose windows overlap, leave gaps or reach into padding (rules_pool.py): output element o of a pooled
    axis reads input o*stride + tap + offset, tap < window; reads outside the input are the reduction's identity
    (a padded read `?? -inf` / `?? 0`), so they are skipped. count "inside": an average divides each window by the
    number of its taps inside the input (torch's count_include_pad=False), on top of `PoolSpec.scale`."""
    stride: tuple[int, int]
    offset: tuple[int, int]  # the constant of the index: -padding
    out: tuple[int, int]  # Ho, Wo
    count: str = "window"  # window | inside


@dataclass(frozen=True)
class ConvOp:
    name: str  # the .tl tensor the contraction writes (schedule refers to it)
    out: str  # the tensor written to HBM (the pool/relu result when fused)
    x: str
    w: str
    bias: str | None
    dims: tuple[tuple[str, int], ...]  # N C K H W Ho Wo R S
    # "kc" (out-channel major, needs a transpose) | "ck" (contraction-major) | "dw" (depthwise: W[k, taps])
    w_layout: str
    vars: tuple[tuple[str, str], ...]  # role -> .tl loop variable
    relu: bool = False
    pool: PoolSpec | None = None
    fused: tuple[str, ...] = ()  # names of the computations folded into this one
    line: int = 0
    lines: tuple[tuple[str, int], ...] = ()  # role -> .tl line of its loop
    texts: tuple[tuple[str, str], ...] = ()  # role -> its .tl loop, e.g. ("c", "for c in 0..C")
    span: Span | None = field(default=None, compare=False)
    stride: tuple[int, int] = (1, 1)  # window step along (y, x): X[.., 2*y + r, 2*x + s]
    # input row (column) of output row y and tap r: stride*y + dilation*r + offset; a zero-padded read
    # (`X[.., y + r - 1, ..] ?? 0`) has a negative offset and may run past either end (the halo, zeroed in SBUF)
    offset: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    w_batch: bool = False  # the stationary operand has the batch index too (a batched matmul: one matrix per n)
    x_transposed: bool = False  # a matmul's moving operand stored [batch.., j, k] (A B^T): transposed on load
    residual: str | None = None  # a tensor indexed like the output added on the eviction (`Y = conv + S`)
    post_relu: bool = False  # relu after the residual add (`Y = relu(conv + S)`)
    residual_shared: bool = False  # the residual has no batch index: one image for every n (`P[h, i, j] = Mk[i, j]`)
    clamp: float | None = None  # with relu: the upper bound of a relu6-style `min(relu(..), 6)` on the eviction
    bias_role: str = "k"  # the role indexing the bias: k (a column per out channel) | x (a matmul's row along x)
    groups: int = 1  # a grouped convolution: C and K are G groups each, W[k, c of k's group, ..] (block diagonal)
    # relu of the stationary operand (`relu(A[i, k]) * B[k, j]`): its upper bound (inf: relu, c: `min(relu(.), c)`),
    # applied in place to the stationary tiles after each load; None: none
    w_relu: float | None = None
    scale: float = 1.0  # -1: a negated product (`A * (-B)`, `-(A * B)`), applied on the eviction before the bias
    epilogue: tuple[EpiStep, ...] = ()  # element-wise steps of consumer statements after all the above

    def dim(self, d: str) -> int:
        return dict(self.dims)[d]


@dataclass(frozen=True)
class PoolOp(_LoopLines):
    name: str
    out: str
    src: str
    dims: tuple[tuple[str, int], ...]  # B (rows = flattened leading dims) H W
    pool: PoolSpec
    vars: tuple[tuple[str, str], ...]
    relu: bool = False
    line: int = 0
    span: Span | None = field(default=None, compare=False)
    loop_lines: tuple[tuple[str, int], ...] = ()  # .tl loop variable -> line of its `for`
    window: Window | None = None  # None: non-overlapping windows (window == stride, no padding; build_pool)

    def windowed(self) -> "PoolOp":
        """The pool with its window made explicit (window == stride, no padding, when selection left it None)."""
        if self.window is not None:
            return self
        out = (self.dim("H") // self.pool.wy, self.dim("W") // self.pool.wx)
        return replace(self, window=Window((self.pool.wy, self.pool.wx), (0, 0), out))

    @property
    def out_rows(self) -> int:
        return self.window.out[0] if self.window else self.dim("H") // self.pool.wy


@dataclass(frozen=True)
class TransposeOp(_LoopLines):
    name: str
    out: str
    src: str
    dims: tuple[tuple[str, int], ...]  # M N (source shape)
    vars: tuple[tuple[str, str], ...]
    line: int = 0
    span: Span | None = field(default=None, compare=False)
    loop_lines: tuple[tuple[str, int], ...] = ()  # .tl loop variable -> line of its `for`
    src_vars: tuple[str, ...] = ()  # the loop variables indexing the source, in its order
    loops: tuple[tuple[str, int], ...] = ()  # the .tl loops (variable, trip count), outermost first
    out_vars: tuple[str, ...] = ()  # the output's loop variables in its order, when two single dimensions swap
    #   around dimensions that stay in place (`Y[c, b, a] = X[a, b, c]`); () for a swap of two runs after a batch
    value: sx.Expr | None = None  # the statement's value when it does work on the way (`relu(X[b, i, j])`, `s[c] *
    #   X[n, h, w, c] - 1.5`: fn_chain.py), computed on the transpose's eviction; None for a plain permute
    vectors: tuple[str, ...] = ()  # the other tensors the value reads (over the output's partition run)
    steps: tuple["TransposeOp | EltwiseOp", ...] = ()  # a permute of several steps (select_permute.py), through HBM
    #   intermediates: transposes (rules.transpose) and DMA copies (rules.copy); the op's own fields are its first
    #   transpose's (directives schedule that step, the other transposes take their default plans)


@dataclass(frozen=True)
class EltwiseOp(_LoopLines):
    name: str
    out: str
    expr: sx.Expr
    inputs: tuple[str, ...]
    size: int  # elements of the output
    vars: tuple[tuple[str, str], ...]
    line: int = 0
    span: Span | None = field(default=None, compare=False)
    columns: tuple[str, ...] = ()  # broadcast operands indexed by the partition run: one scalar per partition
    layout: tuple[tuple[str, int], ...] = ()  # with broadcasts: the output as O (outer) x P (partitions) x F (free)
    run: tuple[int, int] = (0, 0)  # with broadcasts: the output indices [a, b) that go on the partitions
    fused: tuple[str, ...] = ()  # temporaries of earlier element-wise statements folded into this one
    loop_lines: tuple[tuple[str, int], ...] = ()  # .tl loop variable -> line of its `for`
    rows: tuple[str, ...] = ()  # broadcast operands indexed by the free (trailing) indices: one row for all partitions
    copy: bool = False  # a data copy with shifted or divided indices (select_copy.py; scheduled by rules.copy)
    out_index: tuple[sx.Expr, ...] = ()  # a copy's output indices when shifted (`Y[n, C1 + c, i, j]`)
    loops: tuple[tuple[str, int], ...] = ()  # a copy's loops and their trip counts

    def dim(self, d: str) -> int:
        return dict(self.layout)[d]


@dataclass(frozen=True)
class ReduceOp(_LoopLines):
    """`s[i] += A[i, j]` (or max=, min=): the kept (leading) indices flattened onto rows R, the reduced (trailing)
    ones onto F elements per row; `init` a constant or a tensor indexed like the output, `scale` a constant
    factor of the summed term (a mean: `A[i, j] / N`)."""
    name: str
    out: str
    src: str
    dims: tuple[tuple[str, int], ...]  # R (rows: flattened kept dims) F (flattened reduced dims)
    op: str  # add | maximum | minimum
    vars: tuple[tuple[str, str], ...]  # k0.. kept loops, r0.. reduced loops
    init: float | str = 0.0  # a constant, or the name of a tensor indexed like the output
    scale: float = 1.0
    line: int = 0
    span: Span | None = field(default=None, compare=False)
    loop_lines: tuple[tuple[str, int], ...] = ()  # .tl loop variable -> line of its `for`
    update_line: int = 0  # .tl line of the `+=` statement (the initial value is at `line`)
    expr: "sx.Expr | None" = None  # an element-wise expression of same-indexed tensors reduced (None: src itself)
    inputs: tuple[str, ...] = ()  # the tensors `expr` reads (src first)


@dataclass(frozen=True)
class ColumnReduceOp(ReduceOp):
    """`s[j] += A[i, j]`, `s[b, n] += A[b, m, n] / M`: a sum over leading or middle dimensions. dims O (flattened
    kept indices before the reduced ones), R (reduced, on the partitions), F (kept indices after them, the free
    dimension); per O and free tile, ones[R, 1].T @ A[R, F] on TensorE accumulates the column sums in PSUM."""


Op = ConvOp | PoolOp | TransposeOp | EltwiseOp | ReduceOp


SUPPORTED = ("supported: convolution/matmul contractions (windows `stride*y + r`), window max/avg pools, "
             "transposes and permutes (`Y[b, j, i] = X[b, i, j]`), reductions over a run of dimensions "
             "(`s[i] += A[i, j]`, `s[j] += A[i, j]`), element-wise expressions (operands indexed like the output, "
             "or broadcast along a run of its indices)")


def reject(comp: Comp, why: str, span: Span | None = None, hint: str = SUPPORTED) -> TilecError:
    return TilecError(f"the compiler cannot map `{comp.target}` to Trainium engines: {why}", span or comp.span, hint)


def index_maps(acc: sx.Access, comp: Comp, program) -> list[tuple[dict[str, int], int]]:
    loop_vars = {v for v, _ in comp.extents}
    return [affine_index(e, loop_vars, program.sizes) for e in acc.indices]


def plain(m: tuple[dict[str, int], int]) -> str | None:
    coefs, const = m
    if const == 0 and len(coefs) == 1:
        (v, c), = coefs.items()
        return v if c == 1 else None
    return None


def reads(c: Comp) -> list[sx.Access]:
    found = accesses(c.init) if c.init is not None else []
    return found + (accesses(c.update) if c.update is not None else [])


def is_permutation(comp: Comp, acc: sx.Access, program) -> bool:
    names = [plain(m) for m in index_maps(acc, comp, program)]
    if any(n is None for n in names):  # an index that is not a plain loop variable (a loop may be called `None`)
        return False
    return sorted(str(n) for n in names) == sorted(comp.out_vars) and names != list(comp.out_vars)


