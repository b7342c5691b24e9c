"""A lower bound on a candidate's model latency, computed from its schedule without compiling or running it.

Running a candidate on the interpreter costs seconds to minutes (full numerics of every matmul), and a schedule with
small tiles issues many more instructions than a good one. Every conv-like op issues at least

    N * (K / tile_k) * (C / tile_c) * R * S * (Ho / rows) * (Wo / tile_x)   matmuls of rows * tile_x moving columns

(the loop nest of `tilec/compiler/build_conv.py`), all on the one TensorE, after the kernel's start-up. The cost of
one such matmul is asked of the performance model itself (`tilec.perf.api.estimate` on a two-instruction trace minus
a one-instruction trace), so the bound follows the model's parameters and target. A candidate whose bound is above
the best latency found so far cannot win: the tuner records it as pruned instead of evaluating it.
"""
from __future__ import annotations

import functools
from typing import Callable

from tilec.lang.api import DTYPES
from tilec.target import invariant
from tilec.trace import Access, Instr, Trace

Bound = Callable[[dict], float]  # named knob values -> lower bound in µs of the op's TensorE busy time


def _matmul(seq: int, k: int, m: int, free: int, dtype: str) -> Instr:
    # each instruction reads and writes its own buffers: no dependency the model could add latency for
    stat = Access(3 * seq + 1, f"w{seq}", "sbuf", 0, k, 0, m * 4)
    mov = Access(3 * seq + 2, f"x{seq}", "sbuf", 0, k, 0, free * 4)
    acc = Access(3 * seq + 3, f"acc{seq}", "psum", 0, m, 0, free * 4)
    return Instr(seq, "tensor", "nc_matmul", m, free, (dtype, dtype), "float32", (stat, mov), (acc,), k=k, m=m)


@functools.lru_cache(maxsize=None)
def model_costs(k: int, m: int, free: int, dtype: str, target: str) -> tuple[float, float]:
    """(start-up plus one matmul, each further matmul) in µs, as the performance model prices them."""
    from tilec.perf.api import estimate  # glue through the public API, imported late
    one = estimate(Trace("bound", [_matmul(0, k, m, free, dtype)], target=target), target).total_us
    two = estimate(Trace("bound", [_matmul(0, k, m, free, dtype), _matmul(1, k, m, free, dtype)],
                         target=target), target).total_us
    return one, max(0.0, two - one)


def startup_us(target: str) -> float:
    """The model's fixed latency of a kernel: one tiny matmul's total minus its busy time (a lower bound)."""
    one, each = model_costs(1, 1, 1, "float16", target)
    return max(0.0, one - each)


def x_tile(op, named: dict) -> int:
    """The columns per matmul of a conv-like op at a point: its `tile x` knob, or, with no directive (a matrix-vector
    product's default), the whole output row up to one matmul's moving size."""
    return named[f"tile {op.ref('x')}"] or min(op.dims["Wo"], invariant("moving_fmax"))


def conv_bound(op, dtype: str, target: str) -> Bound:
    """TensorE busy time of the matmuls of a conv-like op (see the module docstring), from its knob values."""
    d = op.dims

    def bound(named: dict) -> float:
        tk, tc, tx = named[f"tile {op.ref('k')}"], named[f"tile {op.ref('c')}"], x_tile(op, named)
        pmax = invariant("pmax")  # None: the ragged default (128-channel tiles and a remainder tile)
        tk, tc = tk or min(d["K"], pmax), tc or min(d["C"], pmax)
        rows = named.get(f"tile {op.ref('y')}", 1)
        count = d.get("N", 1) * -(-d["K"] // tk) * -(-d["C"] // tc) * d.get("R", 1) * d.get("S", 1) \
            * (d["Ho"] // rows) * (d["Wo"] // tx)
        _, each = model_costs(tc, tk, rows * tx, DTYPES.get(dtype, "float32"), target)
        return count * each

    return bound


def total_bound(bounds: tuple[Bound, ...], named: dict, target: str) -> float:
    """Start-up plus the TensorE busy time of every op (they share the one TensorE, so the times add up)."""
    return startup_us(target) + sum(b(named) for b in bounds) if bounds else 0.0
