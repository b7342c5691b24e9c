"""Row chains (build_rowchain.py): rewrites of a built chain's loop body over row tiles.

Run after the ops are built (rowchain_chain `_Chain.build`): an fp32 tile only rounded to f16/bf16 is written narrow
by its one writer (`_narrow_writes`, `_narrow_last_step`), a rounded column read only as activation data is read
narrow (`_narrow_read_as_data`), dead instructions and unused allocations go (`_unused_dropped`), and a
software-pipelined 16-bit chain moves work off ScalarE (`_offload`: the last step on GpSimdE, the stores in halves).
`_shifted` (a loop variable moved by a constant) is shared with chunk_pipe.py and pair_tiles.py.
"""
from __future__ import annotations

import dataclasses

from tilec.compiler import ir, mean_var
from tilec.compiler.ir import Act, Alloc, Binary, Block, Buf, Dma, Scalar, Sl, Stmt, View, whole
from tilec.compiler.engine_time import busiest
from tilec.compiler.rowchain_base import _HALF


def _narrow_writes(body: list[Stmt]) -> list[Stmt]:
    """An fp32 tile written by one instruction and read only by its conversion to f16/bf16 (the rounding of a narrow
    tensor, the cast before a store): the instruction writes the narrow tile itself (its output conversion rounds
    once, as the copy did) and the fp32 tile and the copy are gone."""
    out = list(body)
    # (a software-pipelined chain rounds its columns with ScalarE copies: activations without scale, bias or sums)
    for copy in [s for s in body if isinstance(s, ir.Copy) or isinstance(s, Act) and s.func == "copy"
                 and s.bias is None and s.total is None and isinstance(s.scale, float) and s.scale == 1.0]:
        narrow, tile = copy.dst.buf, copy.src.buf
        if copy.dst != whole(narrow) or copy.src != whole(tile) or tile.memory != "sbuf" or tile.dtype != "f32" \
                or narrow.dtype == "f32":
            continue
        touching = [s for s in out if any(v.buf == tile for x in ir.walk((s,)) for v in ir.views(x))]
        writers = [s for s in touching if s is not copy]
        if writers and isinstance(writers[-1], ir.Loop) and isinstance(copy, ir.Copy):
            out = _narrow_last_step(out, copy, writers[-1])
            continue
        if len(writers) != 1 or not isinstance(writers[0], (Act, Binary, Scalar)) or writers[0].dst != whole(tile):
            continue
        writer = writers[0]
        if sum(v.buf == tile for v in ir.views(writer)) != 1:  # an activation's row sums are of its fp32 values
            continue
        alloc_t = next(i for i, s in enumerate(out) if isinstance(s, Alloc) and s.buf == tile)
        alloc_n = next(s for s in out if isinstance(s, Alloc) and s.buf == narrow)
        out = [s for s in out if s is not copy and s is not alloc_n]
        out[alloc_t] = alloc_n
        out[out.index(writer)] = dataclasses.replace(writer, dst=whole(narrow))
    return out


def _narrow_read_as_data(body: list[Stmt]) -> list[Stmt]:
    """A rounded column copied back to fp32 (f16/bf16 -> fp32, exact) and read only as the data of activations
    (`rsqrt(v + eps)` reading the rounded variance): they read the narrow column itself (an activation's data may be
    f16/bf16; only its scale and bias columns must be fp32), and the copy is gone."""
    out = list(body)
    for copy in [s for s in body if isinstance(s, (ir.Copy, Act))]:
        back, narrow = copy.dst.buf, copy.src.buf
        if isinstance(copy, Act) and (copy.func != "copy" or copy.bias is not None or copy.total is not None
                                      or not isinstance(copy.scale, float) or copy.scale != 1.0):
            continue
        if back.dtype != "f32" or narrow.dtype not in _HALF or back.shape[1:] != (1,) or copy.dst != whole(back) \
                or copy.src != whole(narrow):
            continue
        readers = [s for s in out if s is not copy and any(v.buf == back for x in ir.walk((s,)) for v in ir.views(x))]
        if not readers or not all(isinstance(r, Act) and r.src == whole(back)
                                  and sum(v.buf == back for v in ir.views(r)) == 1 for r in readers):
            continue
        out = [_read_from(r, whole(narrow)) if any(r is x for x in readers) else r for r in out if r is not copy]
    return out


def _read_from(s: Stmt, src: View) -> Stmt:
    assert isinstance(s, Act)
    return dataclasses.replace(s, src=src)


def _unused_dropped(body: list[Stmt]) -> list[Stmt]:
    """The body without the instructions whose on-chip result nothing reads (a rounded column whose readers read
    its f16/bf16 copy instead) and the allocations of tiles no instruction touches (a steps' output tile whose last
    step writes the narrow tile the store reads instead)."""
    while True:
        read = {v.buf.name for s in ir.walk(tuple(body)) for v in _views_read(s)}
        dead = [s for s in body if isinstance(s, (Act, ir.Copy, Scalar, Binary)) and s.dst.buf.memory != "hbm"
                and s.dst.buf.name not in read and not (isinstance(s, Act) and s.total is not None)]
        if not dead:
            break
        body = [s for s in body if not any(s is d for d in dead)]
    return mean_var.unused_allocs_dropped(body)


def _views_read(s: Stmt) -> list[View]:
    """The views an instruction reads (its destination counts when a view of the same buffer is also read)."""
    if isinstance(s, (ir.Loop, Block, Alloc, ir.Reshape)):
        return []
    if isinstance(s, ir.Matmul):
        return [s.stationary, s.moving]
    written = {id(getattr(s, f, None)) for f in ("dst", "total")}
    return [getattr(s, f.name) for f in dataclasses.fields(s)
            if isinstance(getattr(s, f.name), View) and id(getattr(s, f.name)) not in written]


def _offload(body: list[Stmt], halves: bool = True) -> list[Stmt]:
    """Work of a software-pipelined 16-bit chain moved off ScalarE (halves=False for chunk_pipe's chains: the
    centring always moves, the stores are per chunk already):
    * a 16-bit tile's copy plus a per-partition bias into a 16-bit tile (bf16 layernorm's d = X - mu) is one
      VectorE tensor_scalar (16-bit performance mode: 4 elements a cycle, nki-spec 2.3), unless the scaling by a
      column rides on a row's broadcast (a column turned into a row: ScalarE then has room for it and VectorE none:
      on the model bf16 layernorm over rows of 4096 is 1.48x the floor with the centring on ScalarE, 1.69x on
      VectorE);
    * in a loop of VectorE steps over column chunks, a last step adding a broadcast row held in SBUF (b) runs on
      GpSimdE (idle), the step before it writing SBUF instead of PSUM (GpSimdE cannot read PSUM);
    * the row tile is stored in two halves, each after the steps over its columns (_halved_stores: on the model
      bf16 layernorm over rows of 8192 1.51x -> 1.50x, the last tile's store no longer all after its last step)."""
    out: list[Stmt] = []
    turned = halves and any(isinstance(s, ir.Transpose) for s in body)  # the scaling by r rides on g's broadcast
    for s in body:
        if not turned and isinstance(s, Act) and s.func == "copy" and s.total is None and s.scale == 1.0 \
                and s.bias is not None and s.dst.buf.dtype in _HALF and s.src.buf.dtype in _HALF \
                and s.dst.shape()[1:] != (1,):
            s = Scalar(s.dst, s.src, "add", s.bias, s.line)
        elif isinstance(s, ir.Loop) and s.var == "ct":
            out += _last_step_on_gpsimd(s)
            continue
        out.append(s)
    return _halved_stores(out) if halves else out


def _halved_stores(body: list[Stmt]) -> list[Stmt]:
    """A loop of steps over column chunks followed by the store of the tile it writes: two loops over the two
    halves of the columns, each followed by the store of its half (the first half leaves while the second is
    computed)."""
    out: list[Stmt] = []
    i = 0
    while i < len(body):
        s = body[i]
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(s, ir.Loop) and s.var == "ct" and s.extent % 2 == 0 and isinstance(nxt, Dma) \
                and nxt.src == whole(nxt.src.buf) and any(_writes_buf(x, nxt.src.buf) for x in ir.walk(s.body)):
            half, width = s.extent // 2, nxt.src.buf.shape[1] // 2
            first = dataclasses.replace(s, extent=half)
            second = dataclasses.replace(s, extent=half, body=tuple(_shifted(x, "ct", half) for x in s.body))
            for k, loop_ in enumerate((first, second)):
                cols = Sl(ir.Aff((), k * width), width)
                dst = View(nxt.dst.buf, nxt.dst.idx[:-1] + (cols,))
                out += [loop_, Dma(dst, View(nxt.src.buf, (nxt.src.idx[0], cols)), nxt.line)]
            i += 2
            continue
        out.append(s)
        i += 1
    return out


def _writes_buf(s: Stmt, buf: Buf) -> bool:
    dst = getattr(s, "acc", None) if isinstance(s, ir.Matmul) else getattr(s, "dst", None)
    return isinstance(dst, View) and dst.buf == buf


def _shifted(s: Stmt, var: str, by: int) -> Stmt:
    """`s` with loop variable `var` replaced by `var + by`."""
    if isinstance(s, (ir.Loop, Block)):
        return dataclasses.replace(s, body=tuple(_shifted(x, var, by) for x in s.body))

    def aff(x: ir.Aff) -> ir.Aff:
        return ir.Aff(x.terms, x.const + by * sum(t.coef for t in x.terms if t.var == var))

    changes: dict[str, object] = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if isinstance(v, View):
            changes[f.name] = View(v.buf, tuple(dataclasses.replace(i, start=aff(i.start)) if isinstance(i, Sl)
                                                else aff(i) for i in v.idx))
    return dataclasses.replace(s, **changes)  # type: ignore[arg-type]


def _last_step_on_gpsimd(chunks: ir.Loop) -> list[Stmt]:
    """The chunk loop with its last step on GpSimdE; the step before it writes a whole-row SBUF tile (allocated
    before the loop, so VectorE runs ahead of GpSimdE instead of waiting for a chunk buffer to come free)."""
    body = list(chunks.body)
    last = body[-1] if body else None
    if not isinstance(last, Binary) or last.engine or any(v.buf.memory == "psum" for v in (last.dst, last.b)):
        return [chunks]
    prev = last.a.buf
    if prev.memory != "psum" or not any(isinstance(s, Alloc) and s.buf == prev for s in body) \
            or last.a != whole(prev):
        return [chunks]
    name = prev.name.replace("_psum", "_prod")  # no longer in PSUM: named for what it holds (the products)
    if any(v.buf.name == name for x in ir.walk((chunks,)) for v in ir.views(x)):
        name = prev.name
    moved = Buf(name, "sbuf", prev.dtype, last.dst.buf.shape)

    def swap(v: View) -> View:
        return View(moved, last.dst.idx) if v.buf == prev else v
    new: list[Stmt] = []
    for s in body:
        if isinstance(s, Alloc) and s.buf == prev:
            continue
        if isinstance(s, (Binary, Scalar)) and prev in (v.buf for v in ir.views(s)):
            fields = {f.name: swap(getattr(s, f.name)) for f in dataclasses.fields(s)
                      if isinstance(getattr(s, f.name), View)}
            s = dataclasses.replace(s, **fields)  # type: ignore[arg-type]
        new.append(s)
    new[-1] = dataclasses.replace(last, a=swap(last.a), engine="gpsimd")
    return [Alloc(moved, line=chunks.line), dataclasses.replace(chunks, body=tuple(new))]


def _narrow_last_step(out: list[Stmt], copy: ir.Copy, chunks: ir.Loop) -> list[Stmt]:
    """The conversion of a tile whose last writer is a loop of VectorE steps over its column chunks, each chunk read
    and written at one slice: the chunk's last step writes the narrow tile at that slice (one rounding, no copy)."""
    tile, narrow = copy.src.buf, copy.dst.buf
    body = list(chunks.body)
    at = [i for i, s in enumerate(body) if any(v.buf == tile for v in ir.views(s))]
    if not at or any(isinstance(s, (ir.Loop, Block)) for s in body):
        return out
    last = body[at[-1]]
    if not isinstance(last, (Binary, Scalar)) or last.dst.buf != tile:
        return out
    if any(v != last.dst for i in at for v in ir.views(body[i]) if v.buf == tile):
        return out  # a chunk reads another chunk's columns
    body[at[-1]] = dataclasses.replace(last, dst=View(narrow, last.dst.idx))
    alloc_n = next(s for s in out if isinstance(s, Alloc) and s.buf == narrow)
    out = [s for s in out if s is not copy and s is not alloc_n]
    i = out.index(chunks)
    return out[:i] + [alloc_n, dataclasses.replace(chunks, body=tuple(body))] + out[i + 1:]


def products_on_gpsimd(stmts: list[Stmt], t) -> list[Stmt]:
    """In each loop body, tensor_tensors of SBUF tiles whose results only reductions read (a product's terms before
    their row sum, `tg[i] += T[i, j] * X[i, j]` of a cross-entropy) moved to GpSimdE, one by one while that lowers
    the busier of VectorE and GpSimdE (streaming cycles, nki-spec §2.4: a fp32 tensor_tensor 2N on either engine [§1.10.4 engine=], a reduction N):
    a row chain with a maximum, a product and a sum per row tile has VectorE streaming 4N against ScalarE's N.
    Not where the Target says VectorE and GpSimdE do not access SBUF in parallel (NC-v2): nothing to gain there."""
    if not t.vector_gpsimd_split:
        return stmts
    return _balanced_products(stmts, t)


def _terms_only(s: Binary, body: list[Stmt]) -> bool:
    """The tensor_tensor's result is read only by reductions (a row sum's terms): nothing else of the chain waits on
    GpSimdE for it (moving the residual sum `X + R` of a residual layernorm, which every later step reads, made
    it 1.13x -> 1.54x on the model)."""
    readers = [x for x in ir.walk(tuple(body)) if x is not s and any(v.buf == s.dst.buf for v in ir.views(x))
               and not (hasattr(x, "dst") and x.dst.buf == s.dst.buf)]
    return bool(readers) and all(isinstance(x, ir.Reduce) for x in readers)


def _balanced_products(body: list[Stmt], t) -> list[Stmt]:
    def busier(stmts: list[Stmt]) -> float:
        return busiest(stmts, t, ("vector", "gpsimd"))

    body = [dataclasses.replace(s, body=tuple(_balanced_products(list(s.body), t)))
            if isinstance(s, (ir.Loop, Block)) else s for s in body]
    for k, s in enumerate(body):
        if isinstance(s, Binary) and not s.engine and s.scale0 == 1.0 and _terms_only(s, body) and \
                all(v.buf.memory == "sbuf" for v in (s.dst, s.a, s.b)):
            trial = body[:k] + [dataclasses.replace(s, engine="gpsimd")] + body[k + 1:]
            if busier(trial) < busier(body):
                body = trial
    return body

