"""The NKI 0.6 form (`import nki`, Neuron SDK 2.29+) of a kernel: the view-model decisions that differ from 0.1.

The same scheduled IR renders through `tilec/templates/nki06/`; what changes is decided here, per statement:

    every ISA call writes its destination (dst-first keywords, no dtype=: the destination's dtype is the output's)
    a PSUM accumulator is allocated uninitialised (nl.ndarray), and its chain of matmuls says accumulate=:
        the first matmul overwrites (accumulate=False, or `k > 0 or ...` over the loops it runs in), the rest add;
        a matmul that starts a new sum in a reused PSUM tile (ir.Matmul.start) says accumulate=False;
        zero-initialising PSUM and accumulating onto it is undefined behaviour on NeuronCore-v2/v3 [ISA6 nc_matmul]
    an SBUF buffer that starts at zero is nl.ndarray + nisa.memset(dst, 0.0) (0.6's memset writes a destination)
    loops are Python `range` (every NKI 0.6 loop but fori_loop/while_loop is unrolled at specialisation)
    tensor_reduce names the trailing free axes of its source (axis=1 only for 2-D tiles) [MIG 0.3 tensor_reduce]
    an instruction on a named engine says engine=nisa.engine.gpsimd (0.1: engine=nisa.gpsimd_engine) [ISA6]
    a permuted HBM view of a DMA is an access pattern on its tensor, `.ap(pattern=[[stride, count], ..], offset=)`
        (0.1: an advanced index over nl.mgrid, which 0.6 removed) [MIG, spec §1.12]
"""
from __future__ import annotations

from tilec.compiler.codegen import STATS_OPS, Compute, _ViewModel
from tilec.compiler.ir import Alloc, Loop, Matmul, Reduce, Sl, Stmt, Transpose, View, window_axes
from tilec.compiler.verify import disjoint, static_box
from tilec.errors import InternalError


class ViewModel06(_ViewModel):
    def __init__(self, names, consts: dict[str, int]) -> None:
        super().__init__(names, consts)
        self.loops: list[str] = []  # IR loop variables enclosing the statement being rendered, outermost first
        self.chains: dict[str, list] = {}  # PSUM accumulator -> [loop depth at its allocation, regions started]

    def stmt(self, s: Stmt) -> dict:
        if isinstance(s, Loop):
            self.loops.append(s.var)
            try:
                out = super().stmt(s)
            finally:
                self.loops.pop()
            return {**out, "range": "range"}
        out = super().stmt(s)
        if isinstance(s, Alloc):
            chain = s.zero and s.buf.memory == "psum"
            if chain:
                self.chains[s.buf.name] = [len(self.loops), []]
            return {**out, "memset": s.zero and not chain}
        if isinstance(s, Matmul):
            return {**out, "accumulate": self.accumulate(s)}
        if isinstance(s, Transpose) and s.engine == "dma" and _shape(s.dst) != _shape(s.src)[::-1]:
            # 0.4+: dst.shape is the transposed src.shape exactly, including rank [RN 0.4, ISA6 dma_transpose]
            raise InternalError(f"dma_transpose {s.src.buf.name} {_shape(s.src)} -> {s.dst.buf.name} {_shape(s.dst)}")
        return out

    def accumulate(self, s: Matmul) -> str:
        """The accumulate= flag of a matmul into a PSUM accumulator: the chain's first matmul statement overwrites
        on the first iteration of the loops it runs in (those not choosing which part of the accumulator it
        writes) and adds afterwards; later statements of the chain add, but for one whose region (without loop
        variables) is disjoint from every region started before: it starts a sum of its own in the same tile (two
        sums sharing a PSUM bank, rules_pool's taps and whole rows; verify.chain_starts checks the same). A matmul
        marked `start` overwrites always (a PSUM tile reused for a new sum) and begins the tile's chain again."""
        if s.start:
            self.chains[s.acc.buf.name] = [len(self.loops), [static_box(s.acc)]]
            return "False"
        chain = self.chains.get(s.acc.buf.name)
        if chain is None:  # an accumulator that was not zeroed: an IR the 0.1 form could not run either
            raise InternalError(f"matmul into {s.acc.buf.name}, which no zeroed PSUM allocation starts")
        depth, started = chain
        box = static_box(s.acc)
        if started and not (box is not None and all(b is not None and disjoint(box, b) for b in started)):
            return "True"
        started.append(box)
        placed = {v for i in s.acc.idx for v in (i.start.vars() if isinstance(i, Sl) else i.vars())}
        over = [self.names(v, "var") for v in self.loops[depth:] if v not in placed]
        return " or ".join(f"{v} > 0" for v in over) or "False"

    def compute(self, s: Compute, tag: str) -> dict:
        out = super().compute(s, tag)
        if isinstance(s, Reduce) and s.window:
            return out
        if isinstance(s, Reduce) and s.op not in STATS_OPS:
            rank = len(_shape(s.src))
            if rank < 2:
                raise InternalError(f"tensor_reduce of a {rank}-D view of {s.src.buf.name}")
            axes = tuple(range(1, rank)) if out["keepdims"] == "True" else (rank - 1,)
            out["axis"] = str(axes[0]) if len(axes) == 1 else repr(axes)
        return out

    def engine(self, name: str) -> str:
        return f", engine=nisa.engine.{name}" if name else ""  # 0.6 spells engines as members of nisa.engine [ISA6]

    def dma_view(self, v: View, pre: list[str]) -> str:
        """A permuted HBM view (ir.View.perm) as `.ap()` over its tensor's row-major storage: one [stride, count]
        pair per view axis (the region's slice perm[a]), the offset of the region's first element; the view is
        named on the lines before the DMA (`pre`)."""
        if not v.perm and not v.blocks:
            return self.view(v)  # (a reversed HBM view: an .ap() with a negative step, reversed_view)
        pairs, offset = self._ap(v)
        strides = _strides(v.buf.shape)
        pattern = [[strides[axis] * step, count] for axis, count, step in v.blocks] + \
            ([pairs[q] for q in v.perm] if v.perm else pairs)
        name = self.names(f"{v.buf.name}_view", "view")  # named on a line of its own: kernel lines stay short
        head = f"{name} = {self.names(v.buf.name)}.ap("
        pre.append(f"{head}pattern={pattern},\n{' ' * len(head)}offset={' + '.join(offset) or 0})")
        return name

    def reversed_view(self, v: View) -> str:
        """A view read backwards along a free axis (a flip): an access pattern on the tile, `.ap(pattern=[[F, P],
        [-1, F]], offset=F - 1)`, the partition pair first and contiguous, a free pair with a negative step (an
        engine access pattern's free strides are signed [ARCH, nki-aps])."""
        pattern, offset = self._ap(v)
        return f"{self.names(v.buf.name)}.ap(pattern={pattern}, offset={' + '.join(offset) or 0})"

    def window_view(self, v: View, window: tuple[int, ...], out: tuple[int, ...], pre: list[str]) -> str:
        """The access pattern of a window Reduce (ir.window_shape) as `.ap()` on its tile: a [step, count] pair
        per axis of the result `out` (the partition pair first), then [1, taps]; the windows' axis steps by the
        window's step times the columns' stride, overlapping when step < taps (v2.32.0 nki/deep-dives/nki-aps.rst:
        any [step, num] per free dimension, up to four of them)."""
        pairs, offset = self._ap(v)
        axes = window_axes(v, window, out)
        if axes is None or pairs[-1][0] != 1:
            raise InternalError(f"window {window} of {v.buf.name} {v.shape()} into {out}")
        steps = [p[0] for p in pairs[:-1]] + [window[0]]  # (window_shape's axes but the taps)
        pattern = [[steps[w], n] if w is not None else [1, 1] for w, n in zip(axes, out)] + [[1, window[1]]]
        return f"{self.names(v.buf.name)}.ap(pattern={pattern}, offset={' + '.join(offset) or 0})"

    def _ap(self, v: View) -> tuple[list[list[int]], list[str]]:
        """A view's `.ap()` over its buffer's row-major storage: a [step, count] pair per sliced axis, in the
        buffer's order, and the terms of its first element's offset."""
        strides = _strides(v.buf.shape)
        pairs = [[st * i.step, i.size] for i, st in zip(v.idx, strides) if isinstance(i, Sl)]
        offset = []
        for i, st in zip(v.idx, strides):
            start = i.start if isinstance(i, Sl) else i
            if start.terms or start.const:
                text = self.aff(start)
                offset.append(text if st == 1 else f"{text} * {st}" if len(start.terms) + bool(start.const) == 1
                              else f"({text}) * {st}")
        return pairs, offset

    def view(self, v: View, dst: bool = False) -> str:
        return super().view(v, False)  # a destination is an argument here, not an assignment target: no [...]


def _strides(shape: tuple[int, ...]) -> list[int]:
    """Row-major element strides of a buffer's axes."""
    strides: list[int] = []
    n = 1
    for d in reversed(shape):
        strides.insert(0, n)
        n *= d
    return strides


def _shape(v: View) -> tuple[int, ...]:
    return tuple(i.size for i in v.idx if isinstance(i, Sl))
