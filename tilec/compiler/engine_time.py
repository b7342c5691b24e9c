"""How long each compute engine streams a list of instructions: the one estimate the builders place work by
(expr_instrs.balanced, rowchain_rewrites.products_on_gpsimd, build_rowchain.pipelined's choice between two builds).
nki-spec §2.4: one element per partition a cycle, two for a tensor_tensor unless all 16-bit (v3 perf mode), a
reduction its input's elements, at the engine's clock (Target). A comparison of placements, not a latency: the
performance model (tilec/perf/costs.py) adds the fixed costs, the 16-bit perf modes and the dependences."""
from __future__ import annotations

import math

from tilec.compiler import ir
from tilec.compiler.ir import Act, Binary, Block, Scalar, Stmt

_HALF = ("f16", "bf16")
ENGINES = ("scalar", "vector", "gpsimd")


def streamed(s: Stmt) -> float:
    """Cycles one instruction streams (0 for what is no compute instruction)."""
    if isinstance(s, ir.Reduce):
        return math.prod(s.src.shape()[1:])
    if not isinstance(s, (Binary, Scalar, ir.Copy, Act)):
        return 0
    n = math.prod(s.dst.shape()[1:])
    return 2 * n if isinstance(s, Binary) and s.dst.buf.dtype not in _HALF else n


def loads(stmts: list[Stmt], t, nested: bool = False) -> dict[str, float]:
    """Each engine's streaming time (ns) over `stmts`; with `nested`, the bodies of loops (times their trip counts)
    and blocks too."""
    ghz = {"vector": t.vector_ghz, "gpsimd": t.gpsimd_ghz, "scalar": t.scalar_ghz}
    busy = dict.fromkeys(ENGINES, 0.0)

    def walk(body, times: int) -> None:
        for s in body:
            if nested and isinstance(s, ir.Loop):
                walk(s.body, times * s.extent)
            elif nested and isinstance(s, Block):
                walk(s.body, times)
            elif ir.engine_of(s) in busy:
                busy[ir.engine_of(s)] += times * streamed(s) / ghz[ir.engine_of(s)]
    walk(stmts, 1)
    return busy


def busiest(stmts: list[Stmt], t, engines: tuple[str, ...] = ENGINES, nested: bool = False) -> float:
    busy = loads(stmts, t, nested)
    return max(busy[e] for e in engines)
