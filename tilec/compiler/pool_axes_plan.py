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
from tilec.target import compiled

TILE_BYTES = 24 * 1024  # per partition, a tile of input rows (two rotate; the passes' tiles are smaller)
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
    if fit and ri * ci * K * xb > TILE_BYTES:
        return None
    G, XB = Ho // k, Wo // wb
    pmax = t.pmax
    if G <= pmax:
        xs = max(1, min(XB, pmax // G))
        images = max(1, min(O, pmax // (xs * G)))
        rows, parts = G, xs * images * G
        tiles = -(-XB // xs) * -(-O // images)
    else:
        xs, images, rows = 1, 1, -(-G // -(-G // pmax))
        parts, tiles = rows, XB * O * -(-G // rows)
    # DMA: every tile's loads (one run of ci * K per partition and slot) and its store
    engines = min(c.n_dma, -(-parts // c.ppe))
    load = c.dma_transfer_ns(parts * ri, parts * ri * ci * K * xb, engines)
    store = c.dma_transfer_ns(parts, parts * k * wb * K * DTYPE_BYTES[yd], engines)
    # passes: tensor_tensor at 2 cycles an element in fp32, 1 when all 16-bit (costs.py), split between VectorE
    # and GpSimdE by their clocks
    per = 1 if xd in ("f16", "bf16") and op.pool.op != "add" else 2
    elems = ((wy - 1) * k * ci + (wx - 1) * k * wb) * K * per
    share = c.engine_ns["gpsimd"] / (c.engine_ns["vector"] + c.engine_ns["gpsimd"])
    instrs = wy - 1 + wx - 1
    passes = (elems * share + instrs * c.static["vector"]) * c.engine_ns["vector"]
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
