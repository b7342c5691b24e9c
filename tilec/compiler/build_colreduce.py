"""Loop-nest builder for the sums over leading or middle dimensions rules.colreduce does not schedule yet, and for
column max/min (`s[j] max= A[i, j]`, build_column_extreme).

The source is seen as [O, R, F]: O the kept indices before the reduced run, R the reduced ones, F the kept ones
after. The reduced rows go on the partitions and TensorE adds them up: per O and free tile of TILE_F,

    acc[K, TILE_F] (PSUM) += ones[TILE_P, K].T @ A[o, rt*TILE_P:+TILE_P, ft*TILE_F:+TILE_F]     over rt

then one eviction to SBUF, the constant factor and the initial value, one store of the rows of sums. The sums it
still writes: fp32 rows two to a partition when one o takes all R / 2 partitions (row_pairs with K = 1, wide loads)
and stacked o's (K > 1) of a nest with loops of extent 1; rules.colreduce schedules every other sum (grouped row
tiles, fp32 pairs, expressions, stacked o's and their expressions, wide loads, stacked fp32 row pairs), and a
grouped sum reaching this builder is a compiler bug.
"""
from __future__ import annotations

from tilec.compiler import ir
from tilec.compiler.build_colouter import build_column_outer, outer_layout
from tilec.compiler.build_conv import Fresh, hbm_view
from tilec.compiler.expr_instrs import ExprCompiler
from tilec.compiler.build_reduce import result_tile
from tilec.compiler.build_util import a, loop, sl, term
from tilec.compiler.exprs import fmt_expr
from tilec.compiler.ir import DTYPE_BYTES, Alloc, Binary, Buf, Dma, Matmul, Scalar, Stmt, View, full, whole
from tilec.compiler.ops import ColumnReduceOp
from tilec.compiler.schedule import MOVING_FMAX, PMAX, PSUM_BANK, ReducePlan, best_divisor
from tilec.errors import InternalError
from tilec.target import compiled

GROUP = 4  # row tiles loaded per step (rules.colreduce; column max/min: folded into the running tile)
STACK_ALIGN = 32  # partitions: an engine instruction starts at partition 0, 32, 64 or 96
WIDE = 4  # PSUM banks of sums per load when a step has one row tile (half of PSUM's 8)
ROW_PAIRS = "; two rows per partition, added on GpSimdE/VectorE first, a block-diagonal ones matrix per o"
Built = tuple[list[tuple[str, int]], list[Stmt]]


def build_column_reduce(op: ColumnReduceOp, plan: ReducePlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    if outer_op(op, hbm[op.src].dtype):
        return build_column_outer(op, hbm, fresh)
    if op.op != "add":
        return build_column_extreme(op, plan, hbm, fresh)
    TF = kept_tile(op.dim("O"), op.dim("R"), op.dim("F"), hbm[op.src].dtype, op.expr is None, isinstance(op.init, str))
    if TF is not None:
        return build_column_kept(op, TF, hbm, fresh)
    L = row_pairs(op, plan, hbm[op.src].dtype)
    if L > 1:  # L reduced rows per partition: the row tile holds R / L partitions
        plan = ReducePlan(plan.parts // L, plan.free)
    K = stacked(op.dim("O"), op.dim("R") // L, plan)
    if K > 1:  # K o's per step on K * R partitions: the plan's row tile is the stacked one
        plan = ReducePlan(K * plan.parts, plan.free)
    W = wide(op.dim("O"), op.dim("R") // L, op.dim("F"), plan, K, hbm[op.src].dtype)
    MF = plan.free  # the sums of one matmul (one PSUM bank)
    plan = ReducePlan(plan.parts, W * plan.free)
    line, ln, TP, TF = op.line, op.update_line, plan.parts, plan.free
    O, R, F = op.dim("O") // K, op.dim("R") // L * K, op.dim("F")
    views: dict[str, Buf] = {}
    stmts: list[Stmt] = []
    for name in op.inputs or (op.src,):
        views[name], st = hbm_view(hbm[name], (O, R, L, F) if L > 1 else (O, R, F), fresh(f"{name}_v"), line)
        stmts += st
    out_v, st = hbm_view(hbm[op.out], (O, K, F), fresh(f"{op.out}_v"), line)
    stmts += st
    dtype = hbm[op.src].dtype  # nc_matmul wants both operands fp32 or neither: ones in the source's dtype
    ones = Buf(fresh(f"ones_{dtype}"), "sbuf", dtype, (TP, K))
    stmts.append(Alloc(ones, zero=True, line=line))
    if K == 1:
        stmts.append(Scalar(whole(ones), whole(ones), "add", 1.0, line))
    else:  # block-diagonal: column k sums the rows of the k-th o (partitions k*R/K .. (k+1)*R/K)
        n = R // K
        stmts += [Scalar(v, v, "add", 1.0, line) for v in (View(ones, (sl(k * n, n), sl(k, 1))) for k in range(K))]
    acc = Buf(fresh(f"{op.out}_acc"), "psum", "f32", (K, MF))
    cols = sl(a(term("ft", TF, "TILE_F")), TF)
    red = ", ".join(v for role, v in op.vars if role.startswith("r"))
    body: list[Stmt] = [Alloc(acc, zero=True, line=ln)] if W == 1 else []
    if _group(R // TP) > 1:
        raise InternalError(f"build_column_reduce: {op.name} has grouped row tiles; rules.colreduce schedules those")
    if L > 1:  # one load of the rows, two to a partition, added on GpSimdE/VectorE into the tile TensorE sums
        rows = sl(a(term("rt", TP, "TILE_P")), TP)
        both = Buf(fresh(f"{op.src}_rows"), "sbuf", "f32", (TP, L, TF))
        tile = Buf(fresh(f"{op.out}_pair"), "sbuf", "f32", (TP, TF))
        vc = _vector_columns(TF, "f32")
        part = lambda k, lo, n: View(both, (full(TP), a(k), sl(lo, n)))  # noqa: E731
        into = lambda lo, n: View(tile, (full(TP), sl(lo, n)))  # noqa: E731
        step: list[Stmt] = [Alloc(both, line=ln), Dma(whole(both), View(views[op.src], (a("o"), rows, full(L), cols)),
                                                    ln), Alloc(tile, line=ln)]
        if vc < TF:  # GpSimdE's part first (see _fold)
            step.append(Binary(into(vc, TF - vc), part(0, vc, TF - vc), part(1, vc, TF - vc), "add", ln,
                               engine="gpsimd"))
        if vc:
            step.append(Binary(into(0, vc), part(0, 0, vc), part(1, 0, vc), "add", ln))
        if W == 1:
            step.append(Matmul(whole(acc), whole(ones), whole(tile), ln, ones=True))
        body += loop("rt", R // TP, step, note=f"for {red} (TILE_P partitions of {L} rows each, summed in PSUM)",
                     line=op.line_of("r0"))
    else:
        rows = sl(a(term("rt", TP, "TILE_P")), TP)
        tile, load = _load(op, plan, hbm, fresh, views, rows, cols)
        step = load + [Matmul(whole(acc), whole(ones), whole(tile), ln, ones=True)] if W == 1 else load
        body += loop("rt", R // TP, step, note=f"for {red} (tiles of TILE_P, summed in PSUM)", line=op.line_of("r0"))
    res = Buf(fresh(f"{op.out}_row"), "sbuf", hbm[op.out].dtype if _plain(op, hbm) else "f32", (K, TF))
    # ScalarE evicts, applying the constant factor on the way, when VectorE adds the pairs, or when a factor would
    # cost VectorE a second instruction per eviction and the matmuls do not bound the step anyway (16-bit sources,
    # or one row tile per eviction): a 64 x 64 x 4096 fp32 mean 826 -> 779 us, 16 x 256 x 4096 bf16 261 -> 174 us
    # on the model. Several fp32 row tiles per eviction are TensorE's (4.7x the 16-bit rate): VectorE stays.
    scaled = L > 1 or (op.scale != 1.0 and (hbm[op.src].dtype != "f32" or R // TP == 1))
    if W > 1:  # the wide tile's matmuls, each into a PSUM bank of its own, evicted into its part of the row
        body.append(Alloc(res, line=ln))
        for w in range(W):
            bank = Buf(fresh(f"{op.out}_acc"), "psum", "f32", (K, MF))
            cut = lambda b: View(b, (full(b.shape[0]), sl(w * MF, MF)))  # noqa: E731
            body += [Alloc(bank, zero=True, line=ln), Matmul(whole(bank), whole(ones), cut(tile), ln, ones=True),
                     ir.Act(cut(res), whole(bank), "copy", scale=op.scale, line=ln) if scaled else
                     ir.Copy(cut(res), whole(bank), ln)]
    elif scaled:
        body += [Alloc(res, line=ln), ir.Act(whole(res), whole(acc), "copy", scale=op.scale, line=ln)]
    else:
        body += [Alloc(res, line=ln), ir.Copy(whole(res), whole(acc), ln)]
    body += _finish(op, hbm, fresh, res, views, cols, K, scaled=scaled)
    result = result_tile(op, hbm, fresh, res, body)
    body.append(Dma(View(out_v, (a("o"), full(K), cols)), whole(result), ln))
    kept = ", ".join(v for role, v in op.vars if role.startswith("k"))
    nest = loop("ft", F // TF, body, note=f"for {kept} (tiles of TILE_F)", line=op.line_of("k0"))
    outer = ", ".join(v for role, v in op.vars if role.startswith("o"))
    note = (f"for {outer}" + (f" ({K} at a time, stacked on the partitions)" if K > 1 else "")) if outer else ""
    nest = loop("o", O, nest, note=note, line=op.line_of("o0") if outer else line)
    summed = op.src if op.expr is None else fmt_expr(op.expr)
    stack = "; a block-diagonal ones matrix sums each o's rows apart" if K > 1 else ""
    how = ROW_PAIRS if L > 1 else stack
    what = f"{op.out} = sum over {red} of {summed} (ones matmul{how})"
    return [("TILE_P", TP), ("TILE_F", TF)], stmts + [ir.Block(what, tuple(nest), line)]


def outer_op(op: ColumnReduceOp, dtype: str) -> bool:
    """Whether build_colouter builds the op (its outer_layout; a max/min only without a factor, which would have to
    apply to every term before the comparison when negative)."""
    n = len(op.inputs or (op.src,))
    return (op.op == "add" or op.scale == 1.0) and outer_layout(
        op.dim("O"), op.dim("R"), op.dim("F"), dtype, n, isinstance(op.init, str))


def _load(op: ColumnReduceOp, plan: ReducePlan, hbm, fresh: Fresh, views: dict[str, Buf], rows, cols,
          tag: str = "tile") -> tuple[Buf, list[Stmt]]:
    """The [TILE_P, TILE_F] tile that is summed: the source, or the expression of the loaded inputs."""
    out: list[Stmt] = []
    tiles = {}
    for name in op.inputs or (op.src,):
        t = Buf(fresh(f"{name}_{tag}"), "sbuf", hbm[name].dtype, (plan.parts, plan.free))
        out += [Alloc(t, line=op.update_line), Dma(whole(t), View(views[name], (a("o"), rows, cols)), op.update_line)]
        tiles[name] = whole(t)
    if op.expr is None:
        return tiles[op.src].buf, out
    name = f"{op.out}_terms" + ("" if tag == "tile" else f"_{tag}")
    value = Buf(fresh(name), "sbuf", hbm[op.src].dtype, (plan.parts, plan.free))
    out.append(Alloc(value, line=op.update_line))
    out += ExprCompiler(tiles, value.shape, op.update_line, fresh, set()).emit(op.expr, whole(value))
    return value, out


def _group(tiles: int) -> int:
    """Row tiles loaded per step: GROUP (or 2) tiles per step are that many loads in flight per buffer rotation,
    which hides the DMA latency (16-bit 4096x4096 column sum: 224 -> 99 us). fp32 tiles of a step are then added
    in pairs: VectorE adds a pair (2N cycles) while TensorE sums the previous one, so each engine does half the
    work of an fp32 ones-matmul per tile (4.7x the 16-bit rate); 16-bit tiles stream through TensorE faster than
    VectorE could add them, so each goes straight into its matmul."""
    return next((g for g in (GROUP, 2) if tiles % g == 0), 1)


def stacked(O: int, R: int, plan: ReducePlan) -> int:
    """How many o's one step sums (K): one row tile holds all R reduced rows of an o and leaves partitions idle, so
    K o's go on K * R partitions (a contiguous block of A) and a (K * R, K) block-diagonal ones matrix sums each
    o's rows into its own row of a (K, TILE_F) PSUM tile: K times fewer loads, each K times larger, and one store
    of K rows. Each block starts at a multiple of 32 partitions (where engine instructions may start)."""
    if plan.parts != R or R % STACK_ALIGN or 2 * R > PMAX:
        return 1
    return best_divisor(O, PMAX // R)


def wide(O: int, R: int, F: int, plan: ReducePlan, K: int, dtype: str) -> int:
    """Free tiles (PSUM banks of sums) per load when one row tile holds all the reduced rows of a step (no rows
    loop): WIDE banks' worth of columns per DMA, each summed by a matmul of its own and evicted into its part of
    the row (model: 64 x 64 x 4096 f32 mean, 2 o's stacked, 408.7 -> 300.7 us; bf16 350.2 -> 162.4; 16 x 128 x 4096
    f32 206.0 -> 154.2, bf16 167.7 -> 83.8; 128 x 8192 bf16 column mean 33.3 -> 25.1). Not for one fp32 o
    (64 x 4096 f32: 27.1 -> 27.6 us, its matmuls bound it)."""
    tiles = F // plan.free
    if R * K != plan.parts or plan.free != MOVING_FMAX or (dtype == "f32" and O == K):
        return 1
    return next((w for w in (WIDE, 2) if tiles % w == 0), 1)


def row_pairs(op: ColumnReduceOp, plan: ReducePlan, dtype: str) -> int:
    """Reduced rows per partition (L, 2 or 1): an fp32 step whose one row tile holds all R reduced rows of an o is
    TensorE's (an fp32 ones-matmul streams at 4.7x the 16-bit cost, and there is no second row tile to pair with),
    so rows 2q and 2q+1 go on one partition (a free reshape of contiguous rows: A[o, 2q + l, f] at [q, l, f]) and
    GpSimdE/VectorE add them first; TensorE then sums R / 2 partitions per o, and twice as many o's stack on the
    partitions (model: 64 x 64 x 4096 f32 mean 300.7 -> 249.1 us, 16 x 128 x 4096 154.2 -> 123.3, 128 x 64 x 512
    113.5 -> 74.4). Not for expressions (they are computed on the loaded tiles) nor 16-bit sources (TensorE streams
    them faster than the adds)."""
    return row_pairs_of(op.dim("R"), plan, dtype, op.expr is not None or bool(op.inputs))


def row_pairs_of(R: int, plan: ReducePlan, dtype: str, expr: bool) -> int:
    """row_pairs for R reduced rows of `dtype` (`expr`: a reduced expression)."""
    if dtype != "f32" or expr or plan.parts != R or R % (2 * STACK_ALIGN):
        return 1
    return 2


def _plain(op: ColumnReduceOp, hbm: dict[str, Buf]) -> bool:
    """No factor and no initial value: the eviction writes the output dtype directly."""
    return op.scale == 1.0 and op.init == 0.0


def _finish(op: ColumnReduceOp, hbm, fresh: Fresh, res: Buf, views: dict[str, Buf], cols, K: int = 1,
            scaled: bool = False) -> list[Stmt]:
    """The constant factor (unless the eviction `scaled` already) and the initial value, on the row of sums."""
    ln = op.update_line
    out: list[Stmt] = []
    if op.scale != 1.0 and not scaled:
        out.append(Scalar(whole(res), whole(res), "multiply", op.scale, ln))
    if isinstance(op.init, str):
        init_v, st = hbm_view(hbm[op.init], (op.dim("O") // K, K, op.dim("F")), fresh(f"{op.init}_v"), op.line)
        row = Buf(fresh(f"{op.init}_row"), "sbuf", hbm[op.init].dtype, res.shape)
        out += st + [Alloc(row, line=op.line), Dma(whole(row), View(init_v, (a("o"), full(K), cols)), op.line),
                     Binary(whole(res), whole(res), whole(row), "add", op.line)]
    elif op.init != 0.0:
        out.append(Scalar(whole(res), whole(res), "add", op.init, op.line))
    return out


# ---- max= / min= over leading or middle dimensions ------------------------------------------------------------------

def build_column_extreme(op: ColumnReduceOp, plan: ReducePlan, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    """`s[j] max= A[i, j]`, `s[o, f] min= A[o, r, f]`: TensorE only adds, so per o and free tile the row tiles
    are folded element-wise into one running tile first, then that tile is turned on its side and folded along
    its free axis:

        run[TILE_P, TILE_F] = max(A[o, 0:TILE_P, ft], A[o, TILE_P:2*TILE_P, ft]); run = max(run, A[o, rt, ft])...
            (GROUP_ROWS loaded per step; each fold split by columns between VectorE and GpSimdE)
        per BANK_CHUNKS chunks of COL_CHUNK columns: nc_transpose of each into one PSUM bank [COL_CHUNK, k, TILE_P],
            one tensor_reduce max along the last axis -> columns k of cols[COL_CHUNK, TILE_CHUNKS]
        nc_transpose(cols) -> back[TILE_CHUNKS, COL_CHUNK]: row c holds the maxima of columns c*COL_CHUNK.. (a
            contiguous run of the output), combined with the initial value on the way to SBUF, one store

    Every element is read once by a fold (behind the loads); the transposes and reduces touch one tile per (o,
    free tile), not one per row tile. One row (a unit reduced axis) needs no transposes: the row is the result.
    4096 x 4096 on the model: f32 193.5 us (floor 182.4), bf16 96.9 us (floor 91.2)."""
    O, R, F = op.dim("O"), op.dim("R"), op.dim("F")
    plan = ReducePlan(plan.parts, _extreme_free(F, plan))
    TP, TF = plan.parts, plan.free  # (no PSUM bank bounds the free tile here: WIDE banks' worth per load)
    CB = best_divisor(TF, PMAX) if TP > 1 else TF  # columns per transpose: at most 128 (its partitions)
    line = op.line
    views: dict[str, Buf] = {}
    stmts: list[Stmt] = []
    for name in op.inputs or (op.src,):
        views[name], st = hbm_view(hbm[name], (O, R, F), fresh(f"{name}_v"), line)
        stmts += st
    word = "max" if op.op == "maximum" else "min"
    red = ", ".join(v for role, v in op.vars if role.startswith("r"))
    tiles = R // TP
    group = _group(tiles)
    NC = TF // CB  # chunks of the free tile
    # two free tiles per step when there are more than two: the second one's loads and folds go before the first
    # one's transposes, so VectorE/GpSimdE fold one while TensorE turns the other (16 x 256 x 4096 f32 min model:
    # 502.1 -> 393.9 us); with two free tiles in all it only delays the first tail (4096 x 4096: 193.5 -> 198.5)
    pair = 2 if F // TF % 2 == 0 and TP > 1 and O * F // TF > 2 else 1
    out_v, st = hbm_view(hbm[op.out], (O, F // CB, CB), fresh(f"{op.out}_v"), line)
    stmts += st
    init_v = None
    if isinstance(op.init, str):
        init_v, st = hbm_view(hbm[op.init], (O, F // CB, CB), fresh(f"{op.init}_v"), line)
        stmts += st
    heads: list[Stmt] = []
    tails: list[Stmt] = []
    for j in range(pair):
        cols = sl(a(term("ft", pair * TF, "STEP_F" if pair > 1 else "TILE_F"), j * TF), TF, name="TILE_F")
        tag = f"{j}" if pair > 1 else ""  # the pair's buffers named apart (both are live at once)
        run, head = _fold_rows(op, plan, hbm, fresh, views, cols, tiles, group, word, red, tag)
        heads += head
        where = (a("o"), sl(a(term("ft", pair * NC, "STEP_CHUNKS" if pair > 1 else "TILE_CHUNKS"), j * NC), NC,
                             name="TILE_CHUNKS"), full(CB))
        tails += _tail(op, hbm, fresh, run, CB, NC, word, out_v, init_v, where, tag)
    body = heads + tails
    kept = ", ".join(v for role, v in op.vars if role.startswith("k"))
    nest = loop("ft", F // (pair * TF), body, note=f"for {kept} (" + (
        "two tiles of TILE_F per step, the second one's loads and folds before the first one's transposes)"
        if pair > 1 else "tiles of TILE_F)"), line=op.line_of("k0"))
    outer = ", ".join(v for role, v in op.vars if role.startswith("o"))
    nest = loop("o", O, nest, note=f"for {outer}" if outer else "", line=op.line_of("o0") if outer else line)
    folded = op.src if op.expr is None else fmt_expr(op.expr)
    what = (f"{op.out} = {word} over {red} of {folded} ({word} of the row tiles on VectorE/GpSimdE, then per chunk of "
            f"columns a TensorE transpose and a {word} along the free axis)")
    G = best_divisor(NC, max(1, PSUM_BANK // (TP * DTYPE_BYTES[hbm[op.src].dtype])))
    consts = [("TILE_P", TP), ("GROUP_ROWS", group * TP), ("TILE_F", TF), ("STEP_F", pair * TF), ("COL_CHUNK", CB),
              ("TILE_CHUNKS", NC), ("STEP_CHUNKS", pair * NC), ("BANK_CHUNKS", G), ("BANK_COLS", G * CB)]
    return consts, stmts + [ir.Block(what, tuple(nest), line)]


def _fold_rows(op: ColumnReduceOp, plan: ReducePlan, hbm, fresh: Fresh, views: dict[str, Buf], cols, tiles: int,
               group: int, word: str, red: str, tag: str = "") -> tuple[Buf, list[Stmt]]:
    """The loads of one free tile's row tiles and their element-wise folds into one running (TILE_P, TILE_F)
    tile (the first tile itself when there is one): `group` loads per step, each fold split by columns between
    VectorE and GpSimdE."""
    TP, TF, ln = plan.parts, plan.free, op.update_line
    peel = group if group > 1 else min(tiles, 2)  # the first step's tiles: the first fold writes the running tile
    cut = _vector_columns(TF, hbm[op.src].dtype, tiles - 1, TF * TP / best_divisor(TF, PMAX) if TP > 1 else 0)
    body: list[Stmt] = []
    first: list[Buf] = []
    for k in range(peel):
        t, load = _load(op, plan, hbm, fresh, views, sl(k * TP, TP, name="TILE_P"), cols, f"r{k}{tag}")
        first.append(t)
        body += load
    run = first[0]
    if peel > 1:
        run = Buf(fresh(f"{op.out}_run{tag}"), "sbuf", first[0].dtype, (TP, TF))
        body += [Alloc(run, line=ln)] + _fold(run, first[0], first[1], op.op, cut, ln)
        for t in first[2:]:
            body += _fold(run, run, t, op.op, cut, ln)
    if tiles > peel:
        step: list[Stmt] = []
        for k in range(group):
            rows = sl(a(term("rt", group * TP, "GROUP_ROWS"), (peel + k) * TP), TP, name="TILE_P")
            t, load = _load(op, plan, hbm, fresh, views, rows, cols, f"r{k}{tag}" if group > 1 else f"tile{tag}")
            step += load + _fold(run, run, t, op.op, cut, ln)
        how = f"groups of {group} TILE_P tiles" if group > 1 else "tiles of TILE_P"
        body += loop("rt", (tiles - peel) // group, step, note=f"for {red} (after the first {peel * TP} rows, "
                     f"{how}: {word} on VectorE and GpSimdE, each its part of the columns)", line=op.line_of("r0"))
    return run, body


def _tail(op: ColumnReduceOp, hbm, fresh: Fresh, run: Buf, CB: int, NC: int, word: str, out_v: Buf,
          init_v: Buf | None, where: tuple, tag: str = "") -> list[Stmt]:
    """One free tile's running tile folded across its partitions (_fold_columns), the initial value, one store."""
    ln, line, TP = op.update_line, op.line, run.shape[0]
    body: list[Stmt] = []
    if TP == 1:  # one row: the running tile is the result already, laid out as the output (CB = TF, NC = 1)
        back = run
    else:
        G = best_divisor(NC, max(1, PSUM_BANK // (TP * DTYPE_BYTES[run.dtype])))  # chunks transposed into one bank
        back = _fold_columns(op, run, CB, NC, G, body, fresh, word, tag)
    res = Buf(fresh(f"{op.out}_res{tag}"), "sbuf", hbm[op.out].dtype, (NC, CB))
    body.append(Alloc(res, line=ln))
    if init_v is not None:
        assert isinstance(op.init, str)
        start = Buf(fresh(f"{op.init}_row{tag}"), "sbuf", hbm[op.init].dtype, (NC, CB))
        body += [Alloc(start, line=line), Dma(whole(start), View(init_v, where), line),
                 Binary(whole(res), whole(back), whole(start), op.op, line)]
    elif not isinstance(op.init, str) and op.init != _IDENTITY[op.op]:
        body.append(Scalar(whole(res), whole(back), op.op, op.init, line))
    else:
        body.append(ir.Copy(whole(res), whole(back), ln))
    body.append(Dma(View(out_v, where), whole(res), ln))
    return body


def _fold_columns(op: ColumnReduceOp, run: Buf, CB: int, NC: int, G: int, body: list[Stmt], fresh: Fresh,
                  word: str, tag: str = "") -> Buf:
    """The running tile's columns folded across its partitions, appended to body: G chunks of CB columns at a time
    transposed into one PSUM bank and folded along the free axis by one tensor_reduce into column c of a (CB, NC)
    tile, which one more transpose turns back into a (NC, CB) PSUM tile whose row c holds columns c*CB .. c*CB+CB
    (a contiguous run of the output: one store of the free tile)."""
    ln, TP = op.update_line, run.shape[0]
    folded_cols = Buf(fresh(f"{op.out}_cols{tag}"), "sbuf", run.dtype, (CB, NC))  # column c*CB + p at [p, c]
    side = Buf(fresh(f"{op.out}_T{tag}"), "psum", run.dtype, (CB, G, TP))
    inner: list[Stmt] = [Alloc(side, line=ln)]
    for g in range(G):
        chunk = sl(a(term("ct", G * CB, "BANK_COLS"), g * CB), CB, name="COL_CHUNK")
        inner.append(ir.Transpose(View(side, (full(CB), a(g), full(TP))), View(run, (full(TP), chunk)), "pe", ln))
    inner.append(ir.Reduce(View(folded_cols, (full(CB), sl(a(term("ct", G, "BANK_CHUNKS")), G))), whole(side),
                           op.op, ln))
    body += [Alloc(folded_cols, line=ln)]
    body += loop("ct", NC // G, inner, note=f"chunks of COL_CHUNK columns, BANK_CHUNKS per PSUM bank: transposed, "
                 f"{word} along the free axis", line=ln)
    back = Buf(fresh(f"{op.out}_back{tag}"), "psum", run.dtype, (NC, CB))
    body += [Alloc(back, line=ln), ir.Transpose(whole(back), whole(folded_cols), "pe", ln)]
    return back


def _extreme_free(F: int, plan: ReducePlan) -> int:
    """A column max's free tile: WIDE of the plan's tiles per load, but at most PMAX chunks of COL_CHUNK columns
    (the transpose back puts the chunks on the partitions): a width whose largest divisor up to 128 is small
    (302 = 2 x 151: chunks of 2) takes the largest divisor of the plan's tile that keeps the chunks within PMAX."""
    TF = plan.free * next(w for w in (WIDE, 2, 1) if F // plan.free % w == 0)
    if TF // best_divisor(TF, PMAX) <= PMAX:
        return TF
    return max(d for d in range(1, plan.free + 1) if plan.free % d == 0 and d // best_divisor(d, PMAX) <= PMAX)


def extreme_note(op: ColumnReduceOp, plan: ReducePlan, dtype: str) -> list[str]:
    """What `tilec explain` says of a column max/min (build_column_extreme, for this plan and source dtype)."""
    F, R = op.dim("F"), op.dim("R")
    TP, TF = plan.parts, _extreme_free(F, plan)
    CB = best_divisor(TF, PMAX)
    word, group = ("max" if op.op == "maximum" else "min"), _group(R // TP)
    cut = _vector_columns(TF, dtype, R // TP - 1, TF * TP / CB if TP > 1 else 0)
    split = f"VectorE columns 0..{cut}, GpSimdE the other {TF - cut}" if cut < TF else "VectorE alone"
    tail = (f"#   then per free tile: chunks of {CB} columns transposed into PSUM (several per bank), tensor_reduce "
            f"{word} along the free axis, one transpose back, the initial value, one store of the row"
            if TP > 1 else "#   one row: the row is the result (the initial value, one store)")
    return [f"# {op.name}: build_colreduce.build_column_extreme (TensorE only adds, so no ones-matmul):",
            f"#   per o and free tile of {TF} columns: {word} of the {R // TP} row tiles of {TP} rows into one "
            f"running tile ({group} loads per step; {split})", tail]


_IDENTITY = {"maximum": float("-inf"), "minimum": float("inf")}
SHARE_MIN = 128  # columns: a narrower tile is folded on VectorE alone (a second instruction's fixed cost outweighs it)


def _vector_columns(cols: int, dtype: str, folds: int = 1, tail: float = 0.0) -> int:
    """The columns of a fold VectorE takes (GpSimdE the rest) so that both finish together over a free tile's
    `folds` folds, VectorE also running `tail` elements per partition of reduces (the transposed chunks):
    tensor_tensor streams 2 cycles per element on both engines, 1 on VectorE when every operand is 16-bit, a
    reduce 1 per element read (tilec/perf/costs.py), at the clocks of tilec/target.py. 16 x 256 x 4096 f32 min:
    VectorE 889 -> 320 of 2000 columns (see docs/notes/colmax10.md)."""
    if cols < SHARE_MIN or folds < 1:
        return cols
    t = compiled()
    v, g = t.vector_ghz, t.gpsimd_ghz
    rate = 1 if dtype in ("f16", "bf16") else 2  # VectorE cycles per element of a fold
    if not t.vector_gpsimd_split:  # all on the faster engine (Target.vector_part)
        return round(cols * t.vector_part(rate, 2))
    cut = (2 * folds * cols / g - tail / v) / (folds * rate / v + 2 * folds / g)
    return min(cols, max(0, round(cut)))


def _fold(dst: Buf, x: Buf, y: Buf, alu: str, cut: int, line: int) -> list[Stmt]:
    """dst = alu(x, y) element-wise: columns [0, cut) on VectorE, the rest on GpSimdE. GpSimdE's part comes first
    in program order, so it is the first reader of each loaded tile and the loads issue on GpSimdE's DMA stream,
    while the stores of results VectorE writes issue on VectorE's: an o's loads no longer queue behind the previous
    o's stores, which wait for its transposes and reduces (tilec/perf/schedule.py, DMA trigger streams; model:
    16 x 256 x 4096 f32 min from Y0 330.0 -> 217.6 us, 4096 x 4096 f32 max and bf16 max unchanged)."""
    rows, cols = dst.shape
    part = lambda b, lo, n: View(b, (full(rows), sl(lo, n)))  # noqa: E731
    out: list[Stmt] = []
    if cut < cols:
        rest = cols - cut
        out.append(Binary(part(dst, cut, rest), part(x, cut, rest), part(y, cut, rest), alu, line, engine="gpsimd"))
    if cut:
        out.append(Binary(part(dst, 0, cut), part(x, 0, cut), part(y, 0, cut), alu, line))
    return out


# ---- few reduced rows: the kept elements on the partitions ---------------------------------------------------------

KEPT_ROWS = 32  # reduced rows: at most this many on the partitions leave most of them (and their DMA queues) idle
KEPT_RUN = 128  # elements: each partition's run of kept elements per reduced row is at least this long
KEPT_TILE_BYTES = 32 * 1024  # per partition: the loaded (P, R, TILE_F) tile (two in flight stay well inside SBUF)
KEPT_FREE = 2048  # elements per partition of a free tile at most (larger tiles only lengthen the last step)


def kept_tile(O: int, R: int, F: int, dtype: str, plain_src: bool, init_tensor: bool) -> int | None:
    """TILE_F of a sum over leading or middle dimensions that few reduced rows make better with the kept elements on
    the partitions (build_column_kept), or None: the ones-matmul layout puts the R reduced rows on the partitions
    (R <= KEPT_ROWS of 128 busy, one single-partition store of sums per free tile; gaps15's mean_axis0_3d 16 x 256 x
    1024 at 15.8x the floor). Taken when R <= KEPT_ROWS, the F kept elements split over the P partitions in runs of
    at least KEPT_RUN, the source summed as it is (no expression of several tensors) and the initial value a
    constant; TILE_F is the largest divisor of F / P whose (P, R, TILE_F) tile fits KEPT_TILE_BYTES."""
    t = compiled()
    P = t.pmax
    if not plain_src or init_tensor or R < 2 or R > KEPT_ROWS or F % P or F // P < KEPT_RUN:
        return None
    G = F // P
    fits = [d for d in range(1, min(G, KEPT_FREE) + 1) if G % d == 0 and R * d * DTYPE_BYTES[dtype] <= KEPT_TILE_BYTES]
    return max(fits) if fits and max(fits) >= KEPT_RUN else None


def build_column_kept(op: ColumnReduceOp, TF: int, hbm: dict[str, Buf], fresh: Fresh) -> Built:
    """`s[o, f] = c; s[o, f] += A[o, r, f] * k` with few reduced rows r: the kept elements f on the partitions, as a
    split (f -> p, g; g -> ft, f_i), a reorder (o, ft, p, r, f_i) and a stage of A per free tile:

        A_v[o, r, p, g] = A (HBM view), s_v[o, p, g] = s
        for o, ft:
          A_tile[p, r, f_i] = A_v[o, r, p, ft*TILE_F + f_i]        one DMA, a run of TILE_F per partition and row
          acc[p, f_i] = A_tile[p, 0, f_i] + A_tile[p, 1, f_i]      then acc += A_tile[p, r, f_i] for r >= 2
          s_tile = acc * k (ScalarE) + c;  s_v[o, p, ft*TILE_F:+TILE_F] = s_tile

    Each add's columns are shared by VectorE and GpSimdE (_vector_columns), the factor rides on ScalarE's copy; every
    DMA moves 128 partitions of contiguous runs."""
    t = compiled()
    P = t.pmax
    O, R, F = op.dim("O"), op.dim("R"), op.dim("F")
    G = F // P
    line, ln = op.line, op.update_line
    dtype, out_dtype = hbm[op.src].dtype, hbm[op.out].dtype
    src_v, st = hbm_view(hbm[op.src], (O, R, P, G), fresh(f"{op.src}_v"), line)
    out_v, st2 = hbm_view(hbm[op.out], (O, P, G), fresh(f"{op.out}_v"), line)
    cols = sl(a(term("ft", TF, "TILE_F")), TF)
    tile = Buf(fresh(f"{op.src}_tile"), "sbuf", dtype, (P, R, TF))
    acc = Buf(fresh(f"{op.out}_acc"), "sbuf", "f32", (P, TF))
    row = lambda r: View(tile, (full(P), r if isinstance(r, ir.Aff) else a(r), full(TF)))  # noqa: E731
    vc = _vector_columns(TF, dtype, folds=R - 1)
    half = lambda v, lo, n: View(v.buf, (*v.idx[:-1], sl(lo, n)))  # noqa: E731
    body: list[Stmt] = [Alloc(tile, line=ln),
                        Dma(whole(tile), View(src_v, (a("o"), full(R), full(P), cols), perm=(1, 0, 2)), ln),
                        Alloc(acc, line=ln)]

    def add(x: View, y: View) -> list[Stmt]:  # acc = x + y, GpSimdE's columns first (see _fold)
        out: list[Stmt] = []
        if vc < TF:
            out.append(Binary(half(whole(acc), vc, TF - vc), half(x, vc, TF - vc), half(y, vc, TF - vc), "add", ln,
                              engine="gpsimd"))
        if vc:
            out.append(Binary(half(whole(acc), 0, vc), half(x, 0, vc), half(y, 0, vc), "add", ln))
        return out
    body += add(row(0), row(1))
    red = ", ".join(v for role, v in op.vars if role.startswith("r"))
    body += loop("r", R - 2, add(whole(acc), row(a("r", 2))), note=f"for {red}: the rows after the first two",
                 line=op.line_of("r0"))
    res = acc
    if op.scale != 1.0 or out_dtype != "f32":
        narrow = op.init == 0.0  # (a constant added first, in f32, then the cast: result_tile)
        res = Buf(fresh(f"{op.out}_tile" if narrow else f"{op.out}_sum"), "sbuf", out_dtype if narrow else "f32",
                  (P, TF))
        body += [Alloc(res, line=ln), ir.Act(whole(res), whole(acc), "copy", scale=op.scale, line=ln)]
    if op.init != 0.0:
        assert not isinstance(op.init, str)  # (kept_tile: a constant)
        body.append(Scalar(whole(res), whole(res), "add", op.init, line))
        res = result_tile(op, hbm, fresh, res, body)
    body.append(Dma(View(out_v, (a("o"), full(P), cols)), whole(res), ln))
    kept = ", ".join(v for role, v in op.vars if role.startswith("k"))
    nest = loop("ft", G // TF, body, note=f"for {kept} (TILE_P partitions x tiles of TILE_F)",
                line=op.line_of("k0"))
    outer = ", ".join(v for role, v in op.vars if role.startswith("o"))
    nest = loop("o", O, nest, note=f"for {outer}" if outer else "", line=op.line_of("o0") if outer else line)
    summed = op.src
    what = f"{op.out} = sum over {red} of {summed} (the kept elements on the partitions, the {R} rows added " \
           "on VectorE and GpSimdE)"
    return [("TILE_P", P), ("TILE_F", TF)], st + st2 + [ir.Block(what, tuple(nest), line)]
