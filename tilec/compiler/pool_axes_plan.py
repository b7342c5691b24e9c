"""The layout of a pool over axes with dimensions after them (build_pool_axes.py), chosen from the model's costs.

Candidates: k output rows per partition group (k divides Ho: every group reads (k - 1) * sy + wy input rows, so a
larger k re-reads fewer of the rows its windows share, but leaves fewer groups for the partitions) and Wb output
columns per block (Wb divides Wo: blocks of one row group sit on other partitions, which small batches need to fill
the partitions, hence the DMA engines: one per 8 partitions). Each candidate is priced as its loads and stores on
the DMA engines it reaches (tilec/perf/costs.py's transfer formula), its passes on VectorE and GpSimdE (their
streaming rates and static cycles), overlapped, plus one tile's load and passes that nothing hides (fill and
drain); the cheapest whose tiles fit SBUF is taken.
"""
from __future__ import annotations

from dataclasses import dataclass

from tilec.compiler.ir import DTYPE_BYTES
from tilec.compiler.ops import PoolOp
from tilec.compiler.schedule import sbuf_budget
from tilec.target import compiled

SBUF_SHARE = 0.9  # of the SBUF budget per partition, for one buffer of each tile and the pads
MAX_K = 8  # output rows per group considered


@dataclass(frozen=True)
class AxesPlan:
    k: int  # output rows per partition group
    wb: int  # output columns per block
    xs: int  # column blocks side by side in a tile
    images: int  # whole images per tile (when an image's groups fit one tile)
    rows: int  # row groups per tile at most (an image's groups over several tiles beyond it)
    parts: int  # partitions of the largest tile
    vector_share: float  # VectorE's part of each pass's columns (GpSimdE the rest)
    estimate_ns: float = 0.0


def axes_plan(op: PoolOp, x_dtype: str, y_dtype: str) -> AxesPlan:
    best: AxesPlan | None = None
    w = op.window
    assert w is not None
    Ho, Wo = w.out
    for k in (d for d in range(1, min(Ho, MAX_K) + 1) if Ho % d == 0):
        for wb in (d for d in range(1, Wo + 1) if Wo % d == 0):
            plan = _candidate(op, k, wb, x_dtype, y_dtype)
            if plan is not None and (best is None or plan.estimate_ns < best.estimate_ns - 1e-6):
                best = plan
    if best is None:  # (the narrowest blocks of single rows always fit unless one column of K does not)
        best = _candidate(op, 1, 1, x_dtype, y_dtype, fit=False)
    assert best is not None
    return best


def _candidate(op: PoolOp, k: int, wb: int, xd: str, yd: str, fit: bool = True) -> AxesPlan | None:
    from tilec.perf.costs import Costs
    from tilec.perf.params import target_params
    t = compiled()
    c = Costs(target_params(t.name))
    w = op.window
    assert w is not None
    O, K = op.dim("B"), op.dim("K")
    (sy, sx), (Ho, Wo) = w.stride, w.out
    wy, wx = op.pool.wy, op.pool.wx
    ri, ci = (k - 1) * sy + wy, (wb - 1) * sx + wx
    xb = DTYPE_BYTES[xd]
    # a tile of each site (the model rotates two where they fit), the pads, the counts' tiles (at most)
    tiles_bytes = (ri * ci * xb + k * ci * 4 + 2 * k * wb * 4) * K + (ri + ci) * K * xb
    if w.count == "inside":
        tiles_bytes += (2 * ri * ci + k * ci + 2 * k * wb) * K * 4
    if fit and tiles_bytes > SBUF_SHARE * sbuf_budget(t):
        return None
    G, XB = Ho // k, Wo // wb
    pmax, straddle = t.pmax, 1.0
    if G <= pmax:
        xs = max(1, min(XB, pmax // G))
        images = max(1, min(O, pmax // (xs * G)))
        rows, parts = G, xs * images * G
        tiles = -(-XB // xs) * -(-O // images)
        if xs > 1 and images * G % c.ppe:
            # blocks whose partitions straddle a DMA engine's 8 share its in-order queue, each block's DMAs waiting
            # behind the other's there: measured (model, f32 NHWC 3x3 s2 pad 1, 8 x 112 x 112 x 64), 7 output rows
            # a group (16 partitions a block) 123.5 us, 8 rows (14) 214.8; 4 rows x 4 columns (28 a block) 154.1
            # against the estimate's 121.8 for both. Priced as one engine's more per block's engines
            straddle = 1 + c.ppe / (images * G)
    else:
        xs, images, rows = 1, 1, -(-G // -(-G // pmax))
        parts, tiles = rows, XB * O * -(-G // rows)
    # DMA: every tile's loads (one run of ci * K per partition and slot) and its store
    engines = min(c.n_dma, -(-parts // c.ppe))
    load = c.dma_transfer_ns(parts * ri, parts * ri * ci * K * xb, engines) * straddle
    store = c.dma_transfer_ns(parts, parts * k * wb * K * DTYPE_BYTES[yd], engines) * straddle
    # passes: tensor_tensor at 2 cycles an element in fp32 and on GpSimdE, 1 on VectorE when all 16-bit
    # (costs.py), the columns split so that both engines end together
    v_cyc = 1 if xd in ("f16", "bf16") and op.pool.op != "add" else 2
    v_rate, g_rate = 1 / (v_cyc * c.engine_ns["vector"]), 1 / (2 * c.engine_ns["gpsimd"])
    share = v_rate / (v_rate + g_rate)
    elems = ((wy - 1) * k * ci + (wx - 1) * k * wb) * K
    instrs = wy - 1 + wx - 1
    passes = elems * share / v_rate + instrs * c.static["vector"] * c.engine_ns["vector"]
    if op.pool.scale != 1.0 or op.pool.op == "add":  # ScalarE's factor or cast, after the passes
        passes += (k * wb * K + c.static["scalar"]) * c.engine_ns["scalar"]
    return AxesPlan(k, wb, xs, images, rows, parts, share, _pipeline(c, tiles, load, passes, store))


def _pipeline(c, tiles: int, load: float, passes: float, store: float) -> float:
    """The end of `tiles` tiles, each a load (the DMA engines one tile at a time), its passes (the vector engines
    one tile at a time) and its store, a tile's input buffer free again when the passes of the tile `rotation`
    before it are done (schedule.py's buffer rotation), every DMA starting a DMA latency after its trigger."""
    loads_free = 0.0
    done: list[float] = []
    engines_free = 0.0
    end = 0.0
    for t in range(tiles):
        start = max(loads_free, done[t - c.rotation] if t >= c.rotation else 0.0)
        loads_free = start + c.dma_latency + load
        engines_free = max(engines_free, loads_free) + passes
        done.append(engines_free)
        end = max(end, engines_free + c.dma_latency + store + c.dma_write_ack)
    return end
