"""Software pipelining of a chunked row chain: a 16-bit chain whose whole-row tiles do not fit SBUF twice (rows12).

pair_tiles.skew_row_tiles overlaps one row tile's steps (stage B) with the next tile's statistics (stage A) when the
chain fits SBUF twice. A 16-bit layernorm over rows of 16384 or 32768 does not. Here the chain is built for it
(rowchain_chain `_Chain(long=True)`), chunked (chunk_cols.py: the rows read in several phases stay whole, the rest
goes chunk by chunk) and skewed by one row tile (pair_tiles: stage B is the phase holding the steps and the stores,
the rows it reads (X) alternate between two buffers by row-tile parity):

    A(0); for pt: A(2pt+1) B(2pt) A(2pt+2) B(2pt+1); A(last) B(last-1) B(last)
    A(i)  for cc: load X chunk; ScalarE: copy with row sum (mean partial)           stage A: ScalarE only
          ScalarE: fold the partials, round mu; for cc: ScalarE: square(X - mu) with row sum (variance partial)
          ScalarE: fold, round v, r = rsqrt(v + eps)
    B(i)  TensorE: r turned into a row; for cc: d = X - mu (VectorE, 16-bit), for each PSUM bank: r x g on
          TensorE, d * (r x g) on VectorE; + b over the chunk on GpSimdE; store the chunk

ScalarE's two passes then cover groups of up to PASS_CHUNKS chunks per activation (TILE_PASS columns; the loads stay
chunk by chunk), their discarded output one tile allocated before the loops (`grouped_passes`), except the first
tile's mean pass, which stays chunk by chunk so that ScalarE starts after the first chunk's load.

What makes the stages overlap is that no engine has work in both (each engine runs in program order: a VectorE
instruction of stage A of tile i + 1 would hold up VectorE's steps on tile i behind ScalarE's passes on tile i + 1):
  * the squares' sum reads X with bias -mu (the value of d before its rounding to 16 bits: rowchain_base
    `unrounded`), so d is made only where the steps read it, in stage B, chunk by chunk (`sunk`), and only X
    crosses from A to B (bf16 at rows of 16384: 2 x 32 KiB);
  * the partial sums are folded by ScalarE (`folded_on_scalar`), not by a VectorE tensor_reduce;
  * a row held whole for the steps (b) is evicted from PSUM by VectorE before the loop (rowchain_base `evicted`).
GpSimdE's `+ b` reads SBUF only, so it is one instruction per TILE_C columns (`merged_gpsimd_steps`: fewer static
overheads). In the epilogue ScalarE and VectorE have no next tile's work, so the last tile's stage B shares its
work with them (`last_tile_shared`; `last_banks_shared` does the same for a chain pipelined whole).

Numerics: the variance sums (X - mu)^2 in fp32 where the program squares d rounded to 16 bits. Each term differs
by at most 2 units of d's dtype relatively (d's rounding, squared), so v, rounded to that dtype, may be its
neighbour: the tolerance policy's "intermediate rounded to f16/bf16 whose float32 value differs" (tolerance.py), as
softmax's sum of its fp32 exp values (rows10). Checked against NumPy in tests/compiler/test_chunk_pipe.py.
"""
from __future__ import annotations

import dataclasses

from tilec.compiler import ir
from tilec.compiler.chunk_cols import chunk_columns, chunked_at
from tilec.compiler.ir import DTYPE_BYTES, Aff, Binary, Buf, Loop, Sl, Stmt, Term, View
from tilec.compiler.ops import Op, ReduceOp
from tilec.compiler.passes import peak_usage
from tilec.target import compiled

Built = tuple[list[tuple[str, int]], list[Stmt]]
# bytes per partition of a chunk of X at most: the pipeline's chunk tiles are allocated once per parity, and under
# the model's "fit" rule the larger ones lose their second rotation buffer (bf16 layernorm over rows of 16384:
# 1.95x the floor with chunks of 4096 columns, 1.52x with 2048, 1.69x with 1024; 1.50 / 1.52 / - under "free")
PIPE_CHUNK_BYTES = 4096
# chunks of X one ScalarE pass instruction (a copy or a square with its row sum) covers at most, in stage A: each
# activation pays ScalarE's fixed cost once (static overhead and the row sum's 64 cycles: ~0.14 us), and a
# partial sum fewer is folded (`grouped_passes`); bf16 layernorm over rows of 16384 on the model: 1 chunk (2048
# columns) 1.52x the floor, 2 chunks 1.485x, 4 chunks 1.48x, the whole row (8) 1.50x (the first pass then waits
# for the whole row tile's loads)
PASS_CHUNKS = 4


def pipelined_chunks(ops: list[Op], hbm: dict[str, Buf], fresh_for, keep: set[str], budget: int) -> Built | None:
    """A 16-bit chain too big to fit whole, built for software pipelining, its columns chunked, then skewed by one row
    tile (see the module docstring); None when that does not apply or fit. The chunks are the largest (of at most
    PIPE_CHUNK_BYTES of X per partition) for which the skewed chain fits. Only for 16-bit chains with at least three
    phases (two dependent row sums, as layernorm's mean and variance): on the model bf16 layernorm over rows of
    16384 is 2.41x the floor shared and 1.50x this way (rows12, "free" rule), over rows of 32768 3.56x chunked and
    1.96x (b whole for 25 of its 32 chunks; 2.36x with b broadcast again for every chunk); f32 chains (layernorm
    over rows of 8192 1.22x -> 1.33x, of 16384 1.41x -> 2.00x: no 16-bit VectorE mode for the centring, four bytes a
    value in every chunk) and bf16 rmsnorm over rows of 32768 (two phases: 1.20x -> 1.32x) keep fit_long_rows (f32
    layernorm: build_rowchain.stats_pipelined)."""
    from tilec.compiler.build_reduce import short_rows
    from tilec.compiler.rowchain_base import _HALF
    from tilec.compiler.rowchain_chain import _Chain  # (rowchain_chain imports this module)
    from tilec.compiler.pair_tiles import skew_row_tiles

    if short_rows(ops) is not None or any(hbm[op.out].dtype not in _HALF for op in ops):
        return None
    chain = _Chain(ops, hbm, fresh_for, keep, skewed=True, long=True)
    consts, stmts = chain.build()
    stmts = getattr(chain, "views", []) + stmts
    free = next(op.dim("F") for op in ops if type(op) is ReduceOp)
    fresh = fresh_for(ops[-1])

    def skewed(chunked: Built | None) -> Built | None:
        if chunked is None or phases(chunked[1]) < 3:
            return None
        body = folded_on_scalar(merged_gpsimd_steps(chunked[1]), fresh)
        out = skew_row_tiles((chunked[0], body), budget, fresh)
        if out is None:
            return None
        out = (out[0], last_tile_shared(out[1], fresh, compiled()))
        return grouped_passes(out, budget, fresh) or out

    widest = PIPE_CHUNK_BYTES // max(DTYPE_BYTES[hbm[op.out].dtype] for op in ops)
    rebuilt: list[Built] = []
    for part in (1.0, 0.75, 0.6, 0.5):  # the largest chunks whose skewed chain fits
        chunked = chunk_columns(consts, stmts, free, int(budget * part), fresh, widest=widest)
        if chunked is not None and not _whole_row(chunked[1], free):
            rebuilt.append(chunked)  # a row broadcast again chunk by chunk: after the partial broadcasts below
            continue
        out = skewed(chunked)
        if out is not None:
            return out
    # the row broadcast to every partition (b) kept whole for the first chunks only, the others broadcast again
    # chunk by chunk (VectorE copies them out of PSUM: at rows of 32768 all of them would be 24 us per row tile)
    # (the most columns kept whole; then the largest chunks)
    best: tuple[int, int, Built] | None = None
    for size in [c for c in (4096, 2048, 1024) if c <= widest]:
        chunked = chunked_at(consts, stmts, free, size, fresh)
        for head in range(free // size - 1, 0, -1) if chunked is not None else ():
            assert chunked is not None
            out = skewed(partly_whole(chunked, head, fresh))
            if out is not None:
                if best is None or (head * size, size) > best[:2]:
                    best = (head * size, size, out)
                break
    if best is not None:
        return best[2]
    for chunked in rebuilt:
        out = skewed(chunked)
        if out is not None:
            return out
    return None


def _whole_row(stmts: list[Stmt], free: int) -> bool:
    from tilec.compiler.build_rowchain import _whole_broadcast
    return _whole_broadcast(stmts, free)


def partly_whole(chunked: Built, head: int, fresh) -> Built | None:
    """The chunked chain with its row broadcast to every partition before the loop (b_tile, (P, F)) kept for the
    first `head` chunks only ((P, head * TILE_C)); the loop over the chunks that read it splits in two, the second
    broadcasting each of its chunks again (TensorE into PSUM, VectorE out of it) where it reads it."""
    consts, stmts = chunked
    size = dict(consts)["TILE_C"]
    at = next((i for i, s in enumerate(stmts[:-1]) if isinstance(s, ir.Alloc) and s.buf.memory == "sbuf"
               and len(s.buf.shape) == 2 and s.buf.shape[0] > 1 and isinstance(stmts[i + 1], Loop)
               and s.buf.shape[1] == size * (s.buf.shape[1] // size) and s.buf.shape[1] > size), None)
    if at is None:
        return None
    alloc, made = stmts[at], stmts[at + 1]
    assert isinstance(alloc, ir.Alloc) and isinstance(made, Loop)
    full_buf = alloc.buf
    per = full_buf.shape[1] // made.extent
    head_buf = dataclasses.replace(full_buf, shape=(full_buf.shape[0], head * size))
    setup = [ir.Alloc(head_buf, line=alloc.line),
             _renamed(dataclasses.replace(made, extent=head * size // per), {full_buf.name: head_buf})]
    block = stmts[-1]
    if not (isinstance(block, ir.Block) and len(block.body) == 1 and isinstance(block.body[0], Loop)):
        return None
    outer = block.body[0]
    readers = [i for i, s in enumerate(outer.body) if isinstance(s, Loop) and s.var == "cc"
               and any(v.buf == full_buf for x in ir.walk((s,)) for v in ir.views(x))]
    if len(readers) != 1:
        return None
    loop = outer.body[readers[0]]
    assert isinstance(loop, Loop)
    # the second loop's chunk of the row: made again from the setup's loop, at the chunk's columns
    chunk_buf = Buf(fresh(f"{full_buf.name.removesuffix('_tile')}_chunk"), "sbuf", full_buf.dtype,
                    (full_buf.shape[0], size))
    names = {x.buf.name: dataclasses.replace(x.buf, name=fresh(x.buf.name)) for x in ir.walk(made.body)
             if isinstance(x, ir.Alloc)}
    remade = _renamed(dataclasses.replace(made, extent=size // per), {**names, full_buf.name: chunk_buf})
    remade = _at_chunk(remade, full_buf.name, chunk_buf.name, size)
    body = [ir.Alloc(chunk_buf, line=alloc.line), remade] + [_local(x, full_buf, chunk_buf) for x in loop.body]
    first = dataclasses.replace(loop, extent=head, body=tuple(_renamed(x, {full_buf.name: head_buf})
                                                              for x in loop.body))
    second = dataclasses.replace(loop, extent=loop.extent - head,
                                 body=tuple(_shifted_cc(x, head) for x in body))
    new_outer = dataclasses.replace(outer, body=outer.body[:readers[0]] + (first, second)
                                    + outer.body[readers[0] + 1:])
    out = stmts[:at] + setup + stmts[at + 2:-1] + [dataclasses.replace(block, body=(new_outer,))]
    return consts, out


def _renamed(s: Stmt, names: dict[str, Buf]) -> Stmt:
    """`s` with the buffers named in `names` replaced (allocations and views)."""
    if isinstance(s, (Loop, ir.Block)):
        return dataclasses.replace(s, body=tuple(_renamed(x, names) for x in s.body))
    changes: dict[str, object] = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if isinstance(v, View) and v.buf.name in names:
            changes[f.name] = View(names[v.buf.name], v.idx)
        elif isinstance(v, Buf) and v.name in names:
            changes[f.name] = names[v.name]
    return dataclasses.replace(s, **changes)  # type: ignore[arg-type]


def _at_chunk(s: Stmt, full: str, chunk: str, size: int) -> Stmt:
    """The setup's broadcast loop made at chunk cc: its HBM reads at the chunk's columns (+ cc * TILE_C)."""
    if isinstance(s, (Loop, ir.Block)):
        return dataclasses.replace(s, body=tuple(_at_chunk(x, full, chunk, size) for x in s.body))
    changes: dict[str, object] = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if isinstance(v, View) and v.buf.memory == "hbm":
            col = v.idx[-1]
            assert isinstance(col, Sl)
            start = Aff((ir.Term("cc", size, "TILE_C"),) + col.start.terms, col.start.const)
            changes[f.name] = View(v.buf, v.idx[:-1] + (dataclasses.replace(col, start=start),))
    return dataclasses.replace(s, **changes)  # type: ignore[arg-type]


def _local(s: Stmt, full: Buf, chunk: Buf) -> Stmt:
    """Reads of the whole row's tile at chunk cc (cc * TILE_C + x) as reads of the chunk's tile (x)."""
    if isinstance(s, (Loop, ir.Block)):
        return dataclasses.replace(s, body=tuple(_local(x, full, chunk) for x in s.body))
    changes: dict[str, object] = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if isinstance(v, View) and v.buf == full:
            col = v.idx[-1]
            assert isinstance(col, Sl)
            start = Aff(tuple(t for t in col.start.terms if t.var != "cc"), col.start.const)
            changes[f.name] = View(chunk, v.idx[:-1] + (dataclasses.replace(col, start=start),))
    return dataclasses.replace(s, **changes)  # type: ignore[arg-type]


def _shifted_cc(s: Stmt, by: int) -> Stmt:
    from tilec.compiler.rowchain_rewrites import _shifted
    return _shifted(s, "cc", by)


def last_tile_shared(stmts: list[Stmt], fresh, tgt) -> list[Stmt]:
    """The last row tile's stage B (in the skewed chain's epilogue) shared with the engines that have no next
    tile's work: its centring on ScalarE, and GpSimdE's `+ b` of its last k chunks on VectorE (each step's
    products stay in PSUM and VectorE adds b reading them there: one PSUM input, N cycles). k of the E chunks move
    so that both engines finish together: VectorE runs w instructions per PSUM bank of every chunk (the products,
    and a rebuilt b's copies) and one more per bank of the k chunks; GpSimdE starts after the first chunk and
    adds E - k chunks at rho times the cost of one instruction per bank (rho = 2 f_V / f_G, nki-spec 2.4: two
    inputs at 2N GpSimdE cycles): w E + k = w + rho (E - k). GpSimdE's chunks go step by step again (it starts
    after one bank's products). On the model: bf16 layernorm over rows of 16384 (w = 1, E = 4: k = 1) 1.53x ->
    1.50x, over rows of 32768 (w = 2, b rebuilt per chunk: k = 0, the centring only) 2.43x -> 2.36x."""
    rho = 2 * tgt.vector_ghz / tgt.gpsimd_ghz
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, ir.Block):
            s = dataclasses.replace(s, body=tuple(last_tile_shared(list(s.body), fresh, tgt)))
        elif isinstance(s, Loop) and s.var == "p1":
            body = list(s.body)
            at = max((i for i, x in enumerate(body) if isinstance(x, Loop) and x.var == "cc"), default=None)
            if at is not None:
                loop = body[at]
                assert isinstance(loop, Loop)
                loop = dataclasses.replace(loop, body=tuple(_centred_on_scalar(x) for x in loop.body))
                per_bank = _vector_steps(loop) / (loop.extent * _banks(loop))  # VectorE's work per TILE_F
                k = int((loop.extent * (rho - per_bank) + per_bank) / (1 + rho))
                split = _on_vector(loop, k, fresh) if 0 < k < loop.extent else None
                body[at:at + 1] = split or [loop]
                s = dataclasses.replace(s, body=tuple(body))
        out.append(s)
    return out


def last_banks_shared(stmts: list[Stmt], fresh, tgt) -> list[Stmt]:
    """The same for a chain pipelined whole (pair_tiles without chunks, build_rowchain.pipelined): in the last row
    tile's last loop of steps (over PSUM banks, TILE_F), the + b of its last k banks on VectorE from PSUM, with
    w = 1 (the products) and E the loop's banks: E + k = 1 + rho (E - k). On the model: bf16 layernorm over rows
    of 4096 1.48x -> 1.47x, of 8192 1.50x -> 1.49x (273.6 -> 271.7 us), f32 layernorm 4096 x 4096 1.04x ->
    1.03x; the examples' chains (one bank per half row) are unchanged."""
    rho = 2 * tgt.vector_ghz / tgt.gpsimd_ghz
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, ir.Block):
            s = dataclasses.replace(s, body=tuple(last_banks_shared(list(s.body), fresh, tgt)))
        elif isinstance(s, Loop) and s.var == "p1":
            body = list(s.body)
            at = max((i for i, x in enumerate(body) if isinstance(x, Loop) and x.var == "ct"), default=None)
            if at is not None:
                loop = body[at]
                assert isinstance(loop, Loop)
                k = int((loop.extent * (rho - 1) + 1) / (1 + rho))
                split = _banks_on_vector(loop, k, fresh) if 0 < k < loop.extent else None
                body[at:at + 1] = split or [loop]
                s = dataclasses.replace(s, body=tuple(body))
        out.append(s)
    return out


def _banks_on_vector(ct: Loop, k: int, fresh) -> list[Stmt] | None:
    """A loop of steps over PSUM banks whose last step (GpSimdE) adds to products in SBUF: two loops, its last k
    banks with the products kept in PSUM and the last step on VectorE."""
    from tilec.compiler.rowchain_rewrites import _shifted

    last, prod = (ct.body[-1], ct.body[-2]) if len(ct.body) >= 2 else (None, None)
    if not (isinstance(last, Binary) and last.engine == "gpsimd" and isinstance(prod, Binary)
            and prod.dst == last.a and prod.dst.buf.memory == "sbuf"):
        return None
    psum = Buf(fresh(prod.dst.buf.name.replace("_prod", "_psum")), "psum", prod.dst.buf.dtype,
               (prod.dst.buf.shape[0], prod.dst.shape()[-1]))
    vbody = ct.body[:-2] + (ir.Alloc(psum, line=prod.line), dataclasses.replace(prod, dst=ir.whole(psum)),
                            dataclasses.replace(last, a=ir.whole(psum), engine=""))
    first = dataclasses.replace(ct, extent=ct.extent - k)
    second = dataclasses.replace(ct, extent=k, body=tuple(_shifted(x, "ct", ct.extent - k) for x in vbody))
    return [first, second]


def _vector_steps(loop: Loop) -> int:
    """VectorE instructions run by a chunk loop (all its iterations), its centring not counted."""
    count = 0
    for s in ir.walk(loop.body):
        if isinstance(s, (Binary, ir.Copy)) and not s.engine:
            count += _trips(loop, s)
    return count


def _trips(loop: Loop, target: Stmt) -> int:
    """How many times `target` runs in `loop` (the product of the extents of the loops around it)."""
    def find(body: tuple[Stmt, ...], n: int) -> int:
        for s in body:
            if s is target:
                return n
            if isinstance(s, (Loop, ir.Block)):
                got = find(s.body, n * (s.extent if isinstance(s, Loop) else 1))
                if got:
                    return got
        return 0
    return find(loop.body, loop.extent)


def _banks(loop: Loop) -> int:
    """PSUM banks (TILE_F chunks) per chunk of the loop: its loop of steps' extent."""
    return next((s.extent for s in loop.body if isinstance(s, Loop) and s.var == "ct"), 1)


def _centred_on_scalar(s: Stmt) -> Stmt:
    """VectorE's centring (a 16-bit tile plus a per-partition bias) as a ScalarE copy with that bias: in the last
    row tile's stage B, ScalarE has no next tile's passes to run."""
    if isinstance(s, ir.Scalar) and s.op == "add" and isinstance(s.value, View) and not s.engine \
            and s.dst.buf.dtype == s.src.buf.dtype and s.src.buf.dtype in ("f16", "bf16"):
        return ir.Act(s.dst, s.src, "copy", bias=s.value, line=s.line)
    return s


def _on_vector(loop: Loop, k: int, fresh) -> list[Stmt] | None:
    """The chunk loop as two loops: its first chunks as they are, its last k with the GpSimdE step on VectorE."""
    from tilec.compiler.rowchain_rewrites import _shifted

    body = list(loop.body)
    adds = [i for i, x in enumerate(body) if isinstance(x, Binary) and x.engine == "gpsimd"]
    steps = [i for i, x in enumerate(body) if isinstance(x, Loop) and x.var == "ct"]
    if len(adds) != 1 or len(steps) != 1 or steps[0] > adds[0]:
        return None
    add, ct = body[adds[0]], body[steps[0]]
    assert isinstance(add, Binary) and isinstance(ct, Loop)
    last = ct.body[-1] if ct.body else None
    prods = add.a.buf
    if not (isinstance(last, Binary) and last.dst.buf == prods and add.a == ir.whole(prods)):
        return None
    tf = prods.shape[1] // ct.extent
    psum = Buf(fresh(prods.name.replace("_prod", "_psum")), "psum", prods.dtype, (prods.shape[0], tf))
    narrow = [_narrowed(v, ct.extent) for v in (add.dst, add.b)]
    if any(v is None for v in narrow):
        return None
    dst, b = narrow
    assert dst is not None and b is not None
    steps_v = dataclasses.replace(ct, body=ct.body[:-1] + (
        ir.Alloc(psum, line=last.line), dataclasses.replace(last, dst=ir.whole(psum)),
        dataclasses.replace(add, dst=dst, a=ir.whole(psum), b=b, engine="")))
    vbody = [x for i, x in enumerate(body) if i != adds[0] and not (isinstance(x, ir.Alloc) and x.buf == prods)]
    vbody[vbody.index(ct)] = steps_v
    # GpSimdE's chunks step by step again (TILE_F): it starts after the first step's products, not the chunk's
    gbody = [x for i, x in enumerate(body) if i != adds[0]]
    pa, pb = _narrowed(add.a, ct.extent), _narrowed(add.b, ct.extent)
    assert pa is not None and pb is not None
    gbody[gbody.index(ct)] = dataclasses.replace(ct, body=ct.body + (dataclasses.replace(add, dst=dst, a=pa, b=pb),))
    first = dataclasses.replace(loop, extent=loop.extent - k, body=tuple(gbody))
    second = dataclasses.replace(loop, extent=k, body=tuple(_shifted(x, "cc", loop.extent - k) for x in vbody))
    return [first, second]


def _narrowed(v: View, extent: int) -> View | None:
    """The inverse of _widened: a view over all `extent` TILE_F chunks as the view of chunk ct."""
    col = v.idx[-1]
    if not isinstance(col, Sl) or col.step != 1 or col.size % extent:
        return None
    size = col.size // extent
    start = Aff(col.start.terms + (ir.Term("ct", size, "TILE_F"),), col.start.const)
    return View(v.buf, v.idx[:-1] + (Sl(start, size, 1, "TILE_F"),))


def folded_on_scalar(stmts: list[Stmt], fresh) -> list[Stmt]:
    """A row sum's partials (one per chunk) folded into its column by ScalarE (a copy of the partials with its row
    sum, reduce_res) instead of a VectorE tensor_reduce: stage A then runs on ScalarE alone, and VectorE's steps on
    the previous row tile never wait behind a fold that waits for this tile's passes."""
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, (Loop, ir.Block)):
            s = dataclasses.replace(s, body=tuple(folded_on_scalar(list(s.body), fresh)))
        elif isinstance(s, ir.Reduce) and s.op == "add" and s.src == ir.whole(s.src.buf) \
                and s.src.buf.dtype == "f32" and s.src.buf.name.endswith("_parts"):
            spare = Buf(fresh(s.src.buf.name + "_copy"), "sbuf", "f32", s.src.buf.shape)
            out += [ir.Alloc(spare, line=s.line), ir.Act(ir.whole(spare), s.src, "copy", line=s.line, total=s.dst)]
            continue
        out.append(s)
    return out


def phases(stmts: list[Stmt]) -> int:
    """The chunk loops (chunk_cols' phases) of a chunked chain."""
    return sum(isinstance(s, Loop) and s.var == "cc" for s in ir.walk(tuple(stmts)))


def merged_gpsimd_steps(stmts: list[Stmt]) -> list[Stmt]:
    """In each chunk loop (cc) over TILE_C columns, a loop of steps (ct, over PSUM banks of TILE_F) whose last step
    runs on GpSimdE and reads SBUF only: that step taken out of the loop as one instruction over all its columns
    (GpSimdE's static overhead once per TILE_C columns, not per TILE_F)."""
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, (Loop, ir.Block)):
            body = merged_gpsimd_steps(list(s.body))
            if isinstance(s, Loop) and s.var == "cc":
                body = [x for s2 in body for x in _split_last(s2)]
            s = dataclasses.replace(s, body=tuple(body))
        out.append(s)
    return out


def _split_last(s: Stmt) -> list[Stmt]:
    if not (isinstance(s, Loop) and s.var == "ct" and s.body and isinstance(s.body[-1], Binary)
            and s.body[-1].engine == "gpsimd"):
        return [s]
    last = s.body[-1]
    assert isinstance(last, Binary)
    views = [_widened(v, s.extent) for v in (last.dst, last.a, last.b)]
    if any(v is None for v in views):
        return [s]
    dst, a, b = views
    assert dst is not None and a is not None and b is not None
    return [dataclasses.replace(s, body=s.body[:-1]), dataclasses.replace(last, dst=dst, a=a, b=b)]


def _widened(v: View, extent: int) -> View | None:
    """`v` indexed by ct (columns ct * TILE_F + TILE_F) as the view of all `extent` chunks; None if it is not."""
    col = v.idx[-1]
    if not isinstance(col, Sl) or col.step != 1 or any(x.var == "ct" for i in v.idx[:-1] if isinstance(i, Aff)
                                                         for x in i.terms):
        return None
    ct = [t for t in col.start.terms if t.var == "ct"]
    if len(ct) != 1 or ct[0].coef != col.size:
        return None
    start = Aff(tuple(t for t in col.start.terms if t.var != "ct"), col.start.const)
    return View(v.buf, v.idx[:-1] + (Sl(start, col.size * extent, 1, ""),))


def sunk(body: list[Stmt]) -> list[Stmt]:
    """A whole-row tile made by one instruction moved, with its allocation, to just before its first reader, when
    nothing in between writes what it reads: a rounded tile whose row sum reads the value before the rounding
    (bf16 layernorm's d, read by the steps only) is then made in stage B, chunk by chunk, instead of being held whole
    from stage A."""
    out = list(body)
    for made in list(out):
        if isinstance(made, (Loop, ir.Block, ir.Alloc)) or len(_written(made)) != 1:
            continue
        tiles = [v.buf for v in _written(made) if v.buf.memory == "sbuf" and len(v.buf.shape) == 2
                 and v.buf.shape[1] > 1]
        w = out.index(made)
        alloc = next((k for k, x in enumerate(out[:w]) if isinstance(x, ir.Alloc) and tiles and x.buf == tiles[0]),
                     None)
        if alloc is None or any(_touches(x, tiles[0]) for x in out[alloc + 1:w]):
            continue
        first = next((k for k in range(w + 1, len(out)) if _touches(out[k], tiles[0])), None)
        reads = {v.buf.name for v in ir.views(made)} - {tiles[0].name}
        if first is None or first == w + 1 or any(v.buf.name in reads for x in ir.walk(tuple(out[w + 1:first]))
                                                  for v in _written(x)):
            continue
        moved = [out[alloc], made]
        rest = [x for k, x in enumerate(out) if k not in (alloc, w)]
        at = rest.index(out[first])
        out = rest[:at] + moved + rest[at:]
    return out


def _touches(s: Stmt, buf: Buf) -> bool:
    return any(v.buf == buf for x in ir.walk((s,)) for v in ir.views(x))


def _written(s: Stmt) -> list[View]:
    dst = getattr(s, "acc", None) if isinstance(s, ir.Matmul) else getattr(s, "dst", None)
    total = getattr(s, "total", None)
    return [v for v in (dst, total) if isinstance(v, View)]



def grouped_passes(built: Built, budget: int, fresh) -> Built | None:
    """Stage A's ScalarE passes over X (the copy with the mean's partial row sum, the square with the variance's)
    as one activation per group of k chunks (k = PASS_CHUNKS, or fewer, dividing the chunk loops' trip count): the
    chunk loop `for cc: load X chunk; activation(chunk) -> parts[cc]` becomes `for cc: (for ck in range(k): load
    X chunk cc * k + ck); activation(group) -> parts[cc]` (TILE_PASS = k TILE_C columns), the partial sums k times
    fewer. The activations' discarded outputs are one tile allocated before the loops (every pass is ScalarE's,
    in order: no instruction reads it), so that it takes no rotation buffers from the chunk tiles (allocated in
    the loop, a wider discard made bf16 layernorm over rows of 16384 2.12x the floor: rows14). The first pass
    with loads (the first row tile's mean, in the pipeline's prologue) stays chunk by chunk (`_first_pass_apart`):
    nothing else runs then, and ScalarE starts after one chunk's load instead of k (rows18: bf16 layernorm over
    rows of 16384 282.95 -> 279.2 us). None when the chain has no such loop or the chain no longer fits `budget`."""
    consts, stmts = built
    size = dict(consts).get("TILE_C")
    if size is None:
        return None
    passes = [(s, p) for s in ir.walk(tuple(stmts)) if isinstance(s, Loop) and (p := _pass_loop(s, size))]
    head = next((s for s, (_, dmas) in passes if dmas), None)
    passes = [(s, p) for s, p in passes if s is not head]
    if not passes:
        return None
    found = {id(s): p for s, p in passes}  # each chunk loop's (activation, loads), found once
    extents = {s.extent for s, _ in passes}
    k = next((k for k in range(min(PASS_CHUNKS, min(extents)), 1, -1) if all(e % k == 0 for e in extents)), 1)
    if k == 1:
        return None
    discards = {act.dst.buf for _, (act, _) in passes}
    if len({d.dtype for d in discards}) != 1 or len({d.shape[0] for d in discards}) != 1:
        return None
    d0 = next(iter(discards))
    wide = Buf(fresh("pass_discarded"), "sbuf", d0.dtype, (d0.shape[0], k * size))
    parts: dict[str, Buf] = {}
    for _, (act, _) in passes:
        assert act.total is not None
        b = act.total.buf
        parts[b.name] = dataclasses.replace(b, shape=(b.shape[0], b.shape[1] // k))
    # the folds' spare outputs (folded_on_scalar: a copy of the partials with its row sum) narrow with them
    for s in ir.walk(tuple(stmts)):
        if isinstance(s, ir.Act) and s.src.buf.name in parts and s.src == ir.whole(s.src.buf) \
                and s.dst == ir.whole(s.dst.buf) and s.dst.buf.shape == s.src.buf.shape:
            parts[s.dst.buf.name] = dataclasses.replace(s.dst.buf, shape=parts[s.src.buf.name].shape)

    def rewrite(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        for s in body:
            if isinstance(s, Loop) and id(s) in found:
                act, dmas = found[id(s)]
                loads = Loop("ck", k, tuple(_grouped_cc(x, k, inner=True) for x in dmas), kind=s.kind, line=s.line,
                             note="for the chunks of one ScalarE pass (TILE_C columns each)")
                grouped = _grouped_cc(dataclasses.replace(act, dst=ir.whole(wide)), k, inner=False)
                out.append(dataclasses.replace(s, extent=s.extent // k, extent_name="", body=((loads,) if dmas else ())
                                               + (grouped,), note="for the columns (groups of TILE_PASS: one "
                                               "ScalarE pass each): the rows stay in SBUF"))
            elif isinstance(s, (Loop, ir.Block)):
                out.append(dataclasses.replace(s, body=rewrite(s.body)))
            elif isinstance(s, ir.Alloc) and s.buf in discards:
                continue
            else:
                out.append(s)
        return tuple(out)

    body = [_narrowed_parts(x, parts) for x in rewrite(_first_pass_apart(tuple(stmts), head, wide, fresh))]
    first = next(i for i, x in enumerate(body) if any(isinstance(y, Loop) and y.note.startswith("for the chunks of one")
                                                      or isinstance(y, ir.Act) and y.dst.buf == wide
                                                      for y in ir.walk((x,))))
    body.insert(first, ir.Alloc(wide, line=getattr(body[first], "line", 0)))
    if peak_usage(tuple(body))[0] > budget:
        return None
    return consts + [("TILE_PASS", k * size)], body


def _first_pass_apart(body: tuple[Stmt, ...], head: Loop | None, wide: Buf, fresh) -> tuple[Stmt, ...]:
    """`body` with the chunk loop `head` (the first pass with loads) kept chunk by chunk: its activation writes the
    first TILE_C columns of the shared discarded tile `wide` (no allocation of its own), and its partial sums and
    the fold reading them (the next activation of the same body reading the partials whole) get buffers of their
    own, which keep one column per chunk while the grouped passes' partials narrow (they share names)."""
    if head is None:
        return body
    size = _chunk_of(head)
    found = _pass_loop(head, size)
    assert found is not None and found[0].total is not None
    act, total = found[0], found[0].total
    old = total.buf
    new = dataclasses.replace(old, name=fresh(f"{old.name}_first"))
    done: list[bool] = []
    tag = [head.line]  # the .tl line of the partials' allocation

    def apart(stmts: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        here = any(s is head for s in stmts)  # the body of the first pass, its partials' allocation and fold
        for s in stmts:
            if here and not done and isinstance(s, ir.Alloc) and s.buf == old:
                tag[0] = s.line
                continue
            if s is head:
                cols = View(wide, (ir.full(wide.shape[0]), Sl(Aff(), size, 1, "TILE_C")))
                loop_body = [x for x in head.body if not (isinstance(x, ir.Alloc) and x.buf == act.dst.buf)]
                moved = [dataclasses.replace(act, dst=cols, total=View(new, total.idx)) if x is act else x
                         for x in loop_body]
                out += [ir.Alloc(new, line=tag[0]), dataclasses.replace(head, body=tuple(moved))]
                done.append(True)
            elif here and len(done) == 1 and isinstance(s, ir.Act) and s.src == ir.whole(old):
                spare = dataclasses.replace(s.dst.buf, name=fresh(f"{s.dst.buf.name}_first"))
                out += [ir.Alloc(spare, line=s.line), dataclasses.replace(s, src=ir.whole(new), dst=ir.whole(spare))]
                done.append(True)
            elif isinstance(s, (Loop, ir.Block)) and len(done) < 2:
                out.append(dataclasses.replace(s, body=apart(s.body)))
            else:
                out.append(s)
        return tuple(out)

    return apart(body)


def _chunk_of(loop: Loop) -> int:
    """TILE_C of a pass loop: the columns its activation reads."""
    act = next(s for s in loop.body if isinstance(s, ir.Act))
    last = act.src.idx[-1]
    assert isinstance(last, Sl)
    return last.size


def _narrowed_parts(s: Stmt, parts: dict[str, Buf]) -> Stmt:
    """`s` with the partial-sum tiles named in `parts` narrowed to their new shapes (whole views stay whole)."""
    if isinstance(s, (Loop, ir.Block)):
        return dataclasses.replace(s, body=tuple(_narrowed_parts(x, parts) for x in s.body))
    changes: dict[str, object] = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if isinstance(v, View) and v.buf.name in parts:
            new = parts[v.buf.name]
            changes[f.name] = ir.whole(new) if v == ir.whole(v.buf) else View(new, v.idx, v.perm)
        elif isinstance(v, Buf) and v.name in parts:
            changes[f.name] = parts[v.name]
    return dataclasses.replace(s, **changes)  # type: ignore[arg-type]


def _pass_loop(loop: Loop, size: int) -> tuple[ir.Act, list[ir.Dma]] | None:
    """A chunk loop of a ScalarE pass: allocations of its discarded output, loads, and one activation over the
    chunk (TILE_C columns at cc) whose row sum goes to column cc of its partials; (the activation, the loads)."""
    if loop.var != "cc":
        return None
    acts = [s for s in loop.body if isinstance(s, ir.Act)]
    dmas = [s for s in loop.body if isinstance(s, ir.Dma)]
    allocs = [s for s in loop.body if isinstance(s, ir.Alloc)]
    if len(acts) != 1 or len(acts) + len(dmas) + len(allocs) != len(loop.body):
        return None
    act = acts[0]
    if act.total is None or act.dst != ir.whole(act.dst.buf) or [a.buf for a in allocs] != [act.dst.buf]:
        return None
    col, tot = act.src.idx[-1], act.total.idx[-1]
    if not (isinstance(col, Sl) and col.size == size and col.step == 1 and isinstance(tot, Sl) and tot.size == 1
            and [(t.coef, t.name) for t in col.start.terms if t.var == "cc"] == [(size, "TILE_C")]
            and [t.coef for t in tot.start.terms if t.var == "cc"] == [1] and tot.start.const == 0
            and act.total.buf.shape[-1] == loop.extent):
        return None
    if any(v.buf == act.dst.buf for d in dmas for v in (d.dst, d.src)):
        return None
    return act, dmas


def _grouped_cc(s: Stmt, k: int, inner: bool) -> Stmt:
    """`s` of a chunk loop with cc counting groups of k chunks: a load's chunk cc is chunk ck of group cc (`inner`);
    the activation covers the group's k chunks (its row sum still goes to column cc)."""
    def aff(x: Aff, total: bool) -> Aff:
        terms: list[Term] = []
        for t in x.terms:
            if t.var != "cc" or total:
                terms.append(t)
                continue
            terms.append(Term("cc", k * t.coef, "TILE_PASS" if t.name == "TILE_C" else ""))
            if inner:
                terms.append(Term("ck", t.coef, t.name))
        return Aff(tuple(terms), x.const)

    def view(v: View, total: bool = False) -> View:
        idx = []
        for i in v.idx:
            if isinstance(i, Sl):
                start = aff(i.start, total)
                if not inner and not total and i is v.idx[-1]:
                    i = Sl(start, i.size * k, i.step, "TILE_PASS")
                else:
                    i = dataclasses.replace(i, start=start)
            else:
                i = aff(i, total)
            idx.append(i)
        return View(v.buf, tuple(idx), v.perm)

    changes: dict[str, object] = {}
    for f in dataclasses.fields(s):
        v = getattr(s, f.name)
        if isinstance(v, View):
            changes[f.name] = view(v, total=f.name in ("total", "bias", "scale") or (f.name == "dst" and not inner))
    return dataclasses.replace(s, **changes)  # type: ignore[arg-type]
