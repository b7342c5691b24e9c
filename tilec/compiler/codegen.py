"""NKI emission: the scheduled loop-nest IR -> a view-model of plain strings -> Jinja templates in `tilec/templates/`.

Python decides every identifier, index expression, dtype and comment here; the templates only lay them out, one
macro per IR statement kind, so a new program or schedule never needs a new template. DSL names are sanitised
(keywords, builtins and the module aliases nki/nl/nisa get a trailing underscore) and made unique. Output is
deterministic: same IR, same bytes.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import replace

import jinja2

from tilec.compiler.ir import (Act, Aff, Alloc, Binary, Block, Copy, Dma, Identity, Kernel, Loop, Matmul, Reduce,
                               Reshape, Scalar, Sl, Stmt, Transpose, View, window_axes)
from tilec.compiler.named import show
from tilec.compiler.names import sanitised, unique
from tilec.compiler.psum_scope import scoped_psum
from tilec.errors import InternalError
from tilec.lang.functions import ACTIVATIONS, FUNCTIONS
from tilec.compiler.wrap import wrap_text
from tilec.resources import resource_dir
from tilec.target import invariant

TEMPLATES = resource_dir("templates")
# the NKI API a kernel is written for: 0.6 (`import nki`, Neuron SDK 2.29+; today's SDK) or 0.1 (`neuronxcc.nki`,
# SDK <= 2.29 and the course environment); both are rendered from the same scheduled IR (codegen06.py, 0.6 form)
NKI_VERSIONS = ("0.6", "0.1")
DEFAULT_NKI = "0.6"
DTYPES = {"f32": "nl.float32", "f16": "nl.float16", "bf16": "nl.bfloat16"}
BUFFERS = {"sbuf": "nl.sbuf", "psum": "nl.psum", "hbm": "nl.hbm"}
RANGES = {"affine": "nl.affine_range", "sequential": "nl.sequential_range", "static": "nl.static_range"}
STATS_OPS = ("bn_stats", "bn_aggr")  # Reduce ops that are NISA's statistics instructions, not a tensor_reduce
ALU = {"add": "nl.add", "subtract": "nl.subtract", "multiply": "nl.multiply", "divide": "nl.divide",
       "maximum": "nl.maximum", "minimum": "nl.minimum", "power": "nl.power"}
# activation functions: copy (an eviction), square (x * x in a row chain) and every activation of the language's
# function table
FUNCS = {"copy": "nl.copy", "square": "nl.square", **{name: f"nl.{FUNCTIONS[name].nki}" for name in ACTIVATIONS}}


class Namer:
    """DSL/IR names -> unique, safe Python identifiers."""

    def __init__(self, taken: set[str]) -> None:
        self.map: dict[tuple[str, str], str] = {}
        self.used = set(taken)

    def __call__(self, name: str, kind: str = "buf") -> str:
        """`kind` keeps loop variables and buffers apart: a tensor named `t` never captures a loop's `t`."""
        key = (kind, name)
        if key not in self.map:
            base = re.sub(r"\W", "_", name) or "t"
            if base[0].isdigit():
                base = "t_" + base
            self.map[key] = unique(sanitised(base), self.used)
        return self.map[key]


@functools.lru_cache(maxsize=None)  # one Environment per version: it caches the compiled templates (compiling
def _env(nki: str = "0.1") -> jinja2.Environment:  # them took ~0.13 s of every emit)
    folder = TEMPLATES / "nki06" if nki == "0.6" else TEMPLATES
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def check_nki(nki: str | None) -> str:
    """The NKI version to emit (None: the default), or a TilecError naming the known ones."""
    from tilec.errors import TilecError

    nki = DEFAULT_NKI if nki is None else str(nki)
    if nki not in NKI_VERSIONS:
        raise TilecError(f"unknown NKI version {nki!r}; tilec emits NKI {' or '.join(NKI_VERSIONS)}", None,
                         "use 0.6 for Neuron SDK 2.29 and newer (`import nki`), 0.1 for SDK 2.29 and older "
                         "(`import neuronxcc.nki`, the course environment)")
    return nki


def emit(k: Kernel, source: str, doc_lines: list[str], recompile: dict[str, str] | None = None,
         nki: str | None = None) -> str:
    """`recompile`: per input, the command that specialises the kernel to other shapes (quoted by the shape
    checks at the top of the kernel). `nki`: the API version to write the kernel for (NKI_VERSIONS)."""
    nki = check_nki(nki)
    recompile = recompile or {}
    consts = {name for name, _ in k.consts}
    names = Namer(consts)
    kernel_name = names(k.name, "kernel")
    model: type[_ViewModel] = _ViewModel
    if nki == "0.6":
        from tilec.compiler.codegen06 import ViewModel06
        model = ViewModel06
    else:  # (the 0.1 interpreter frees top-level tiles when the kernel returns: psum_scope.py)
        k = replace(k, body=scoped_psum(k.body, invariant("psum_banks")))
    vm = model(names, dict(k.consts))
    params = [names(p.name) for p in k.params]
    # the kernel is specialised to these shapes; other shapes would fail deep inside with out-of-bounds slices
    checks = [{"name": name, "shape": _shape(p.shape),
               "message": repr(f"{kernel_name} was compiled for {name} of shape {_shape(p.shape)}; "
                               f"recompile with {recompile.get(p.name, 'tilec compile -D NAME=VALUE')}")}
              for name, p in zip(params, k.params)]
    outputs = [{"name": names(o.name), "shape": _shape(o.shape), "dtype": DTYPES[o.dtype]} for o in k.outputs]
    body = [vm.stmt(s) for s in k.body]
    returns = ", ".join(o["name"] for o in outputs)
    text = _env(nki).get_template("kernel.py.jinja").render(
        doc_title=f"NKI kernel `{kernel_name}`", source=source, doc_lines=doc_lines, consts=k.consts,
        kernel=kernel_name, params=params, checks=checks, outputs=outputs, body=body, returns=returns)
    text = re.sub(r"\n\n\n+(?= )", "\n\n", wrap_text(text))
    return re.sub(r"\n\n\n\n+", "\n\n\n", text).rstrip() + "\n"  # a kernel without constants: still two blank lines


def _number(value: float) -> str:
    """A Python literal for a constant operand: `float("-inf")` for the start of a max reduction."""
    return f'float("{value}")' if math.isinf(value) else repr(float(value))


def _shape(shape: tuple[int, ...]) -> str:
    return f"({shape[0]},)" if len(shape) == 1 else f"({', '.join(map(str, shape))})"


def _named_shape(shape: tuple[int, ...]) -> str:
    """An on-chip allocation's shape with its dimensions by name where a builder knows them: (TILE_K, SIZE_M)."""
    dims = [show(d) for d in shape]
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


Compute = Copy | Act | Binary | Scalar | Reduce  # the statements that write a `dst` tile on an engine


class _ViewModel:
    def __init__(self, names: Namer, consts: dict[str, int]) -> None:
        self.names, self.consts = names, consts

    def stmt(self, s: Stmt) -> dict:
        tag = f"  # tl:{s.line}" if getattr(s, "line", 0) else ""
        if isinstance(s, Loop):
            note = f"  {s.note}" if s.note else ""
            return {"kind": "loop", "var": self.names(s.var, "var"), "range": RANGES[s.kind],
                    "extent": s.extent_name or show(s.extent), "tag": (tag + note) if tag else "", "body":
                    [self.stmt(x) for x in s.body]}
        if isinstance(s, Block):
            return {"kind": "block", "label": s.label, "tag": "", "body": [self.stmt(x) for x in s.body]}
        if isinstance(s, Alloc):
            return {"kind": "alloc", "name": self.names(s.buf.name), "shape": _named_shape(s.buf.shape),
                    "dtype": DTYPES[s.buf.dtype], "buffer": BUFFERS[s.buf.memory], "zero": s.zero, "tag": tag}
        if isinstance(s, Reshape):
            return {"kind": "reshape", "name": self.names(s.buf.name), "base": self.names(s.base.name),
                    "shape": _named_shape(s.buf.shape), "tag": tag}
        if isinstance(s, Dma):
            pre: list[str] = []  # lines the DMA needs first (the index grid of a permuted view)
            dst, src = self.dma_view(s.dst, pre), self.dma_view(s.src, pre)
            return {"kind": "dma", "dst": dst, "src": src, "pre": pre, "tag": tag, "trigger": s.trigger}
        if isinstance(s, Matmul):
            return {"kind": "matmul", "acc": self.view(s.acc, s.start), "start": s.start,
                    "stationary": self.view(s.stationary),
                    "moving": self.view(s.moving), "hint": ", is_stationary_onezero=True" if s.ones else "",
                    "tag": tag}
        if isinstance(s, Identity):  # ir.Identity: memset to one, then keep the diagonal (p - f == 0)
            return {"kind": "identity", "dst": self.view(s.dst, True), "read": self.view(s.dst), "n": s.dst.shape()[0],
                    "dtype": DTYPES[s.dst.buf.dtype], "tag": tag}
        if isinstance(s, Transpose):
            return {"kind": f"transpose_{s.engine}", "dst": self.view(s.dst, True), "src": self.view(s.src),
                    "tag": tag}
        return self.compute(s, tag)

    def compute(self, s: Compute, tag: str) -> dict:
        base = {"dst": self.view(s.dst, True), "dtype": DTYPES[s.dst.buf.dtype], "tag": tag}
        if isinstance(s, Copy):
            return {**base, "kind": "copy", "src": self.view(s.src), "extra": self.engine(s.engine)}
        if isinstance(s, Act):
            extra = f", bias={self.view(s.bias)}" if s.bias is not None else ""
            extra += f", scale={self.view(s.scale)}" if isinstance(s.scale, View) else \
                f", scale={s.scale!r}" if s.scale != 1.0 else ""
            extra += f", reduce_op=nl.add, reduce_res={self.view(s.total)}" if s.total is not None else ""
            return {**base, "kind": "act", "func": FUNCS[s.func], "src": self.view(s.src), "extra": extra}
        if isinstance(s, Binary) and s.scale0 != 1.0:  # (a * scale0) op b: VectorE's scalar_tensor_tensor
            return {**base, "kind": "stt", "a": self.view(s.a), "b": self.view(s.b), "op": ALU[s.op],
                    "value": _number(s.scale0)}
        if isinstance(s, Binary):
            return {**base, "kind": "binary", "a": self.view(s.a), "b": self.view(s.b), "op": ALU[s.op],
                    "extra": self.engine(s.engine)}
        if isinstance(s, Scalar):
            value = self.operand(s.value)
            return {**base, "kind": "scalar", "src": self.view(s.src), "op": ALU[s.op], "value": value,
                    "extra": (", reverse0=True" if s.reverse else "")
                    + (f", op1={ALU[s.op1]}, operand1={self.operand(s.value1)}" if s.op1 else "")
                    + self.engine(s.engine)}
        if isinstance(s, Reduce) and s.op in STATS_OPS:  # VectorE's mean / variance pair (mean_var.py)
            return {**base, "kind": s.op, "src": self.view(s.src)}
        if isinstance(s, Reduce) and s.window:  # the windows' axis, the last of the window access pattern
            pre: list[str] = []
            src = self.window_view(s.src, s.window, s.dst.shape(), pre)
            return {**base, "kind": "reduce", "src": src, "op": ALU[s.op], "pre": pre,
                    "axis": str(len(s.dst.shape())), "keepdims": "False"}
        if isinstance(s, Reduce):  # the free axes of a 2-D tile (keepdims leaves the (P, 1) column), or the last
            last = len(s.dst.shape()) == len(s.src.shape()) - 1  # axis of a (P, G, F) tile into (P, G)
            return {**base, "kind": "reduce", "src": self.view(s.src), "op": ALU[s.op], "pre": [],
                    "axis": "2" if last else "1", "keepdims": str(not last)}
        raise TypeError(type(s).__name__)

    def operand(self, value: "float | View") -> str:
        """A tensor_scalar operand: a (P, 1) column view or a constant."""
        return self.view(value) if isinstance(value, View) else _number(value)

    def engine(self, name: str) -> str:
        """The engine= argument of an instruction the IR puts on a named engine ("" = the instruction's default)."""
        return f", engine=nisa.{name}_engine" if name else ""

    # ---- index expressions ---------------------------------------------------------------------------------------

    def aff(self, x: Aff) -> str:
        parts = []
        for t in x.terms:
            if t.coef < 0 and not t.name:
                continue
            var = self.names(t.var, "var")
            coef = t.name or (str(t.coef) if t.coef != 1 else "")
            parts.append(f"{var} * {coef}" if coef else var)
        if x.const or not parts:
            parts.append(str(x.const))
        for t in x.terms:  # a term going down (a reversed read's tile start): `299 - pt * 100`, after the constant
            if t.coef < 0 and not t.name:
                var = self.names(t.var, "var")
                parts.append(f"-{var}" + (f" * {-t.coef}" if t.coef != -1 else ""))
        return " + ".join(parts).replace("+ -", "- ")

    def idx(self, i, dim: int) -> str:
        if isinstance(i, Aff):
            return self.aff(i)
        unit = 1 if i.size == 1 else i.step  # a step over one element changes nothing: print the plain slice
        if not i.start.terms and i.start.const == 0 and unit == 1 and i.size == dim:
            return ":"
        span = i.size if unit == 1 else (i.size - 1) * unit + 1
        step = "" if unit == 1 else f":{unit}"
        if not i.start.terms:  # constant bounds print as numbers
            return f"{i.start.const}:{i.start.const + span}{step}"
        start = self.aff(i.start)
        size = self._size(i) if unit == 1 else str(span)
        return f"{start}:{start} + {size}{step}"

    def _size(self, i: Sl) -> str:
        if i.name:
            return i.name
        for t in i.start.terms:
            if t.name and t.coef == i.size:
                return t.name
        return str(i.size)

    def reversed_view(self, v: View) -> str:
        """A view read backwards along a free axis (a flip, `A[i, M - 1 - j]` loaded forward): NKI 0.1 has no
        negative slice step, so each sliced axis is an affine index of nl.arange (spec §1.6), the reversed one with
        coefficient -1 from its last element: `A_tile[nl.arange(128)[:, None], 511 - nl.arange(512)[None, :]]`."""
        name = self.names(v.buf.name)
        axes = sum(isinstance(i, Sl) for i in v.idx)
        idx, a = [], 0
        for i in v.idx:
            if isinstance(i, Aff):
                idx.append(self.aff(i))
                continue
            shape = ", ".join(":" if b == a else "None" for b in range(axes))
            walk = f"nl.arange({i.size})[{shape}]"
            start = "" if not i.start.terms and i.start.const == 0 else self.aff(i.start)
            if i.step == 1:
                idx.append(f"{start} + {walk}" if start else walk)
            elif i.step == -1:
                idx.append(f"{start or 0} - {walk}")
            else:
                idx.append(f"{start} + {i.step} * {walk}" if start else f"{i.step} * {walk}")
            a += 1
        return f"{name}[{', '.join(idx)}]"

    def gathered_rows(self, v: View, pre: list[str]) -> str:
        """An HBM view whose rows (its first sliced axis, the tile's partitions) run backwards (a flip on the
        partition axis): an indirect DMA, each partition's row chosen by an int32 index tile that nisa.iota fills
        with the descending row numbers (spec §1.6 indirect indexing, §1.10 iota). Not a negative-stride access
        pattern: runtimes before Neuron Runtime 2.33 computed those addresses with an unsigned step."""
        sliced = [n for n, i in enumerate(v.idx) if isinstance(i, Sl)]
        first = v.idx[sliced[0]]
        assert isinstance(first, Sl)
        if first.step != -1 or any(isinstance(v.idx[n], Sl) and v.idx[n].step < 0  # type: ignore[union-attr]
                                   for n in sliced[1:]):
            raise InternalError(f"a DMA view of {v.buf.name} reversed along an axis other than its rows: {v}")
        rows = self.names(f"{v.buf.name}_rows", "view")
        start = self.aff(first.start)
        pre.append(f"{rows} = nisa.iota({start} - nl.arange({first.size})[:, None], dtype=nl.int32)")
        idx = []
        free = len(sliced) - 1
        for n, i in enumerate(v.idx):
            if n == sliced[0]:
                idx.append(rows)
            elif isinstance(i, Aff):
                idx.append(self.aff(i))
            else:
                a = sliced.index(n)
                walk = f"nl.arange({i.size})[{', '.join(':' if b == a else 'None' for b in range(free + 1))}]"
                idx.append(walk if not i.start.terms and i.start.const == 0 else f"{self.aff(i.start)} + {walk}")
        return f"{self.names(v.buf.name)}[{', '.join(idx)}]"

    def window_view(self, v: View, window: tuple[int, ...], out: tuple[int, ...], pre: list[str]) -> str:
        """The access pattern of a window Reduce (ir.window_shape) as an advanced index over an nl.mgrid (NKI 0.1
        spec §1.6; the max-pool example of v2.26.1 nki/examples/index-case-3.py): a grid axis per axis of the
        result `out` plus one for the taps, each sliced axis walked by its grid axis, the last by two,
        `start + step * i_o + i_k`, so windows overlap when step < taps: X_band[i0, 1 + i1, 2 * i2 + i3] over
        `i0, i1, i2, i3 = nl.mgrid[0:128, 0:9, 0:55, 0:3]`."""
        slices = [n for n, i in enumerate(v.idx) if isinstance(i, Sl)]
        axes = window_axes(v, window, out)
        if axes is None or any(v.idx[n].step != 1 for n in slices):  # type: ignore[union-attr]
            raise InternalError(f"window {window} of {v.buf.name} {v.shape()} into {out}")
        grid = [self.names(f"i{a}", "grid") for a in range(len(out) + 1)]
        pre.append(f"{', '.join(grid)} = nl.mgrid[{', '.join(f'0:{n}' for n in (*out, window[1]))}]")
        walks = {w: grid[d] for d, w in enumerate(axes) if w is not None}  # window axis -> its grid axis
        idx = []
        for n, i in enumerate(v.idx):
            if isinstance(i, Aff):
                idx.append(self.aff(i))
                continue
            a = slices.index(n)
            terms = [walks[a]] if a in walks else []
            if n == slices[-1]:
                terms = [f"{window[0]} * {t}" if window[0] != 1 else t for t in terms] + [grid[-1]]
            if i.start.terms or i.start.const:
                terms.insert(0, self.aff(i.start))
            idx.append(" + ".join(terms) or "0")
        return f"{self.names(v.buf.name)}[{', '.join(idx)}]"

    def dma_view(self, v: View, pre: list[str]) -> str:
        """A DMA operand; a permuted HBM view (ir.View.perm) is an advanced index over an nl.mgrid of the view's
        shape (NKI 0.1 spec §1.6): grid axis a walks the view's axis a, i.e. the region's slice perm[a], so
        `Y_v[n, i0, y_b, i2, i1, i3]` over `i0, i1, i2, i3 = nl.mgrid[0:64, 0:2, 0:7, 0:56]` is the region
        [n, :, y_b, :, :, :] with its two middle axes swapped."""
        if not v.perm and v.buf.memory == "hbm" and any(isinstance(i, Sl) and i.step < 0 and i.size > 1
                                                        for i in v.idx):
            return self.gathered_rows(v, pre)
        if not v.perm and not v.blocks:
            return self.view(v)
        slices = [i for i in v.idx if isinstance(i, Sl)]
        perm = v.perm or tuple(range(len(slices)))
        nb = len(v.blocks)  # ir.View.blocks: leading grid axes, each shifting its buffer axis by its step
        grid = [self.names(f"i{a}", "grid") for a in range(nb + len(perm))]
        sizes = [count for _, count, _ in v.blocks] + [slices[q].size for q in perm]
        pre.append(f"{', '.join(grid)} = nl.mgrid[{', '.join(f'0:{n}' for n in sizes)}]")
        axis_of = {q: nb + a for a, q in enumerate(perm)}  # slice q of the region is walked by grid axis axis_of[q]
        idx, q = [], 0
        for dim, i in enumerate(v.idx):
            shifts = [f"{step} * {grid[b]}" if step != 1 else grid[b]
                      for b, (axis, _, step) in enumerate(v.blocks) if axis == dim]
            if isinstance(i, Aff):
                idx.append(" + ".join(([self.aff(i)] if i.terms or i.const else []) + shifts) or "0")
                continue
            g = grid[axis_of[q]]
            walk = g if i.step == 1 else f"{i.step} * {g}"
            idx.append(" + ".join(([self.aff(i.start)] if i.start.terms or i.start.const else []) + [walk] + shifts))
            q += 1
        return f"{self.names(v.buf.name)}[{', '.join(idx)}]"

    def view(self, v: View, dst: bool = False) -> str:
        if v.perm or v.blocks:
            raise InternalError(f"a permuted view of {v.buf.name} outside a DMA (or blocked: ir.View.blocks)")
        if any(isinstance(i, Sl) and i.step < 0 and i.size > 1 for i in v.idx):
            return self.reversed_view(v)
        name = self.names(v.buf.name)
        idx = [self.idx(i, n) for i, n in zip(v.idx, v.buf.shape)]
        if all(x == ":" for x in idx):
            return f"{name}[...]" if dst else name
        while len(idx) > 1 and idx[-1] == ":":
            idx.pop()
        return f"{name}[{', '.join(idx)}]"
