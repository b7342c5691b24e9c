"""Where an intermediate tensor lives between the op that writes it and the ops that read it, and why.

`tilec explain` prints one line per tensor (HBM input/output, HBM scratch, or fused on chip); for an HBM scratch
tensor it says which op writes it, which reads it, and why it is not kept on chip. `place T, sbuf|hbm` on a conv
whose output feeds a second conv (conv -> relu -> conv) checks against the same facts (directives.apply_fusion).
"""
from __future__ import annotations

import math

from tilec.compiler.build_conv import is_convolution
from tilec.compiler.build_rowchain import reads_of
from tilec.compiler.ir import DTYPE_BYTES
from tilec.compiler.ops import ConvOp, EltwiseOp, PoolOp, ReduceOp, TransposeOp
from tilec.compiler.schedule import PMAX  # an intermediate's channels spread over the partitions in tiles of PMAX


def reads(op) -> list[str]:
    """The tensors an op reads (its operands; a conv's residual too)."""
    return reads_of(op) + ([op.residual] if isinstance(op, ConvOp) and op.residual else [])


def writer(ops: tuple, name: str):
    return next((op for op in ops if op.out == name), None)


def chain_consumer(ops: tuple, name: str) -> ConvOp | None:
    """The conv reading `name` as its moving operand (a conv -> [relu ->] conv chain), if any."""
    return next((op for op in ops if isinstance(op, ConvOp) and op.x == name and is_convolution(op)), None)


def kind(op) -> str:
    if isinstance(op, ConvOp):
        return "depthwise conv" if op.w_layout == "dw" else "conv" if is_convolution(op) else "matmul"
    return {PoolOp: "pool", TransposeOp: "transpose", EltwiseOp: "element-wise", ReduceOp: "reduction"}.get(
        type(op), type(op).__name__)


def label(op) -> str:
    return f"{kind(op)} {op.name} (tl:{op.line})"


def on_chip_bytes(op: ConvOp, dtype: str) -> int:
    """SBUF bytes per partition to hold a conv's whole output (every image, channel tiles of 128 partitions)."""
    d = dict(op.dims)
    return d.get("N", 1) * math.ceil(d["K"] / PMAX) * d["Ho"] * d["Wo"] * DTYPE_BYTES[dtype]


def chain_reason(producer: ConvOp, consumer: ConvOp, name: str, dtype: str, budget: int) -> str:
    """Why a conv's output goes through HBM to the conv that reads it (the same text for explain and the error)."""
    d = dict(consumer.dims)
    r, s = d.get("R", 1), d.get("S", 1)
    need = on_chip_bytes(producer, dtype)
    fits = "would fit" if need <= budget // 2 else "would not fit"
    channels = (f"each channel reading its own channel of {name}" if consumer.w_layout == "dw"
                else f"across all {d['C']} channels of {name}")
    window = (f"its {r}x{s} window reads {(r - 1) * consumer.dilation[0]} rows of {name} beyond each band of "
              f"output rows, {channels}" if r > 1 else f"a 1x1 window, {channels}")
    return (f"{label(consumer)} reads {name} as its moving operand in row bands ({window}); tilec does not yet keep "
            f"a conv's output on chip for a second conv, so {label(producer)} stores {name} and the second conv "
            f"loads its bands back. Kept whole in SBUF, {name} would take {need} bytes per partition "
            f"({d.get('N', 1)} x {math.ceil(d['C'] / PMAX)} channel tile(s) x {producer.dim('Ho')} x "
            f"{producer.dim('Wo')} {dtype}): it {fits} in half of the {budget // 1024} KiB SBUF budget")


def hbm_reason(ops: tuple, name: str, dtype: str, budget: int, unfused: tuple[str, ...] = ()) -> str:
    """Why an intermediate that is written to HBM and read back is not kept on chip. unfused: the convs whose pool
    the schedule separated (`place conv, hbm`, pipeline.Result.unfused)."""
    producer, consumer = writer(ops, name), chain_consumer(ops, name)
    if isinstance(producer, ConvOp) and consumer is not None:
        return (chain_reason(producer, consumer, name, dtype, budget) + f". `place {name}, hbm` states this "
                f"placement; `place {name}, sbuf` is an error until such a chain can stay on chip")
    by = f" by {label(producer)}" if producer is not None else ""
    users = [op for op in ops if name in reads(op)]
    to = f", read back by {', '.join(label(op) for op in users)}" if users else ""
    if name in unfused:
        return (f"written{by}{to}: the schedule places {name} in HBM (`place {name}, hbm` or `compute_at {name}, "
                f"root`); by default the pool runs on {name}'s PSUM eviction and {name} never reaches HBM")
    if isinstance(producer, ConvOp) and any(isinstance(op, PoolOp) and op.window is not None for op in users):
        return (f"written{by}{to}: the pool's windows overlap, leave gaps or reach into padding, so it is not "
                f"fused into the conv's eviction (only windows that tile the conv's rows are) and reads {name} back")
    return f"written{by}{to}: each is built as its own loop nest that loads its operands from HBM"
