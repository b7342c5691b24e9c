"""Where an intermediate tensor lives between the op that writes it and the ops that read it, and why.

`tilec explain` prints one line per tensor (HBM input/output, HBM scratch, or fused on chip); for an HBM scratch
tensor it says which op writes it, which reads it, and why it is not kept on chip. `place T, sbuf|hbm` on a conv
whose output feeds a second conv (conv -> relu -> conv) checks against the same facts (directives.apply_fusion).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tilec.compiler import conv_chain, pool_chain, stem_chain
from tilec.compiler.build_conv import is_convolution
from tilec.compiler.build_rowchain import reads_of
from tilec.compiler.ir import DTYPE_BYTES
from tilec.compiler import eviction_fusion
from tilec.compiler.ops import ConvOp, EltwiseOp, PoolOp, ReduceOp, TransposeOp
from tilec.compiler.schedule import PMAX, ConvPlan, PoolPlan  # an intermediate's channels spread over partitions (PMAX)
from tilec.errors import Span
from tilec.lang import syntax as sx


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


def chain_reason(producer: ConvOp, consumer: ConvOp, name: str, dtype: str, budget: int, why_not: str = "") -> str:
    """Why a conv's output goes through HBM to the conv that reads it (the same text for explain and the error).
    why_not: why the chain is not kept on chip (default: the second conv does not directly follow the first)."""
    why_not = why_not or "a conv's output stays on chip only for a conv that directly follows it (conv_chain.py)"
    d = dict(consumer.dims)
    r, s = d.get("R", 1), d.get("S", 1)
    need = on_chip_bytes(producer, dtype)
    fits = "would fit" if need <= budget // 2 else "would not fit"
    channels = (f"each channel reading its own channel of {name}" if consumer.w_layout == "dw"
                else f"across all {d['C']} channels of {name}")
    window = (f"its {r}x{s} window reads {(r - 1) * consumer.dilation[0]} rows of {name} beyond each band of "
              f"output rows, {channels}" if r > 1 else f"a 1x1 window, {channels}")
    return (f"{label(consumer)} reads {name} as its moving operand in row bands ({window}); {why_not}, so "
            f"{label(producer)} stores {name} and the second conv loads its bands back. Kept whole in SBUF, {name} "
            f"would take {need} bytes per partition "
            f"({d.get('N', 1)} x {math.ceil(d['C'] / PMAX)} channel tile(s) x {producer.dim('Ho')} x "
            f"{producer.dim('Wo')} {dtype}): it {fits} in half of the {budget // 1024} KiB SBUF budget")


def hbm_reason(ops: tuple, name: str, dtype: str, budget: int, unfused: tuple[str, ...] = ()) -> str:
    """Why an intermediate that is written to HBM and read back is not kept on chip. unfused: the convs whose pool
    the schedule separated (`place conv, hbm`, pipeline.Result.unfused)."""
    producer, consumer = writer(ops, name), chain_consumer(ops, name)
    if isinstance(producer, ConvOp) and consumer is not None:
        return (chain_reason(producer, consumer, name, dtype, budget) + f". `place {name}, hbm` states this "
                f"placement; `place {name}, sbuf` is an error here")
    by = f" by {label(producer)}" if producer is not None else ""
    users = [op for op in ops if name in reads(op)]
    to = f", read back by {', '.join(label(op) for op in users)}" if users else ""
    if name in unfused:
        return (f"written{by}{to}: the schedule places {name} in HBM (`place {name}, hbm` or `compute_at {name}, "
                f"root`); by default the pool runs on {name}'s PSUM eviction and {name} never reaches HBM")
    if isinstance(producer, ConvOp) and any(isinstance(op, PoolOp) and op.window is not None for op in users):
        return (f"written{by}{to}: the pool's windows overlap, leave gaps or reach into padding, so it is not "
                f"fused into the conv's eviction (only windows that tile the conv's rows are) and reads {name} back")
    if isinstance(producer, ConvOp) and users and not any(isinstance(op, ConvOp) for op in users):
        return f"written{by}{to}: " + eviction_fusion.unfused_reason(name, len(users), producer.w_layout == "dw")
    return f"written{by}{to}: each is built as its own loop nest that loads its operands from HBM"


# ---- conv -> conv chains kept on chip (conv_chain.py) --------------------------------------------------------------


@dataclass(frozen=True)
class ChainChoice:
    """Where the intermediate of a conv -> conv chain goes (ops[producer] writes it, ops[producer + 1] reads it)."""
    producer: int
    tensor: str
    on_chip: bool
    store: bool  # also stored to HBM (an output, or read by another op)
    forced: str  # "" (the compiler's choice) | "sbuf" | "hbm" (a `place` directive)
    why: str  # for explain
    span: Span | None = None  # the directive's, for errors
    phases: bool = False  # a conv -> pool chain kept in the conv's row phases (stem_chain.py)


def forced_placement(directives: tuple, name: str) -> tuple[str, Span | None]:
    """`place T, sbuf|hbm` (or `compute_at T, root`: hbm) among the directives: ("sbuf"|"hbm"|"", its span)."""
    for d in directives:
        if d.name in ("place", "compute_at") and len(d.args) == 2 and isinstance(d.args[0], sx.Ref) \
                and d.args[0].parts[0] == name and isinstance(d.args[1], sx.Ref):
            where = d.args[1].parts
            if where in (("sbuf",), ("hbm",)):
                return where[0], d.span
            if where == ("root",):
                return "hbm", d.span
    return "", None


def chain_choices(ops: tuple, plans: tuple, outputs: tuple[str, ...], directives: tuple, hbm: dict,
                  target: str, budget: int) -> dict[int, ChainChoice]:
    """For each conv whose output the next op reads as its moving operand (a conv): on chip or through HBM, and
    why. Forced `sbuf` is returned even when ineligible (why says so); pipeline raises it at the directive."""
    out: dict[int, ChainChoice] = {}
    for i, (op, plan) in enumerate(zip(ops, plans)):
        nxt = ops[i + 1] if i + 1 < len(ops) else None
        if isinstance(op, ConvOp) and isinstance(nxt, PoolOp) and nxt.window is not None and nxt.src == op.out \
                and isinstance(plan, ConvPlan) and is_convolution(op):
            out[i] = pool_choice(ops, plans, i, outputs, directives, hbm, target, budget)
            continue
        if not (isinstance(op, ConvOp) and isinstance(nxt, ConvOp) and isinstance(plan, ConvPlan)
                and isinstance(plans[i + 1], ConvPlan) and nxt.x == op.out and is_convolution(op)
                and is_convolution(nxt)):
            continue
        name = op.out
        forced, span = forced_placement(directives, op.name)
        store = name in outputs or nxt.residual == name or any(name in reads(o) for o in ops if o is not nxt)
        also = f" (and stored: {name} is also {'an output' if name in outputs else 'read by another op'})" \
            if store else ""
        reason = conv_chain.ineligible(op, nxt)
        if reason:
            why = chain_reason(op, nxt, name, hbm[name].dtype, budget, f"it cannot stay on chip: {reason}")
            out[i] = ChainChoice(i, name, False, store, forced, why, span)
            continue
        pair = (plan, plans[i + 1])
        hbm_ns, chip_ns = conv_chain.estimate(op, pair, nxt, conv_chain.chain_plans(op, plan, nxt, plans[i + 1], hbm),
                                              hbm, target)
        kind = conv_chain.chain_plans(op, plan, nxt, plans[i + 1], hbm)[2]
        how = {"paired": "both convs' row pairs kept", "folded": f"{name} written in the second conv's folded copies",
               "plain": "plain plans"}[kind]
        numbers = (f"the model's costs give {chip_ns / 1000:.1f} us on chip ({how}, halo zeroed per image) "
                   f"vs {hbm_ns / 1000:.1f} us through HBM (each conv's own plan, {name} stored and reloaded)")
        if forced == "hbm":
            out[i] = ChainChoice(i, name, False, store, forced, f"`place {name}, hbm`: stored by {label(op)} and "
                                 f"loaded back in bands by {label(nxt)} ({numbers})", span)
        elif forced == "sbuf" or chip_ns < hbm_ns:
            how = f"`place {name}, sbuf`" if forced else "on chip by default"
            out[i] = ChainChoice(i, name, True, store, forced, f"{how}: {label(op)} evicts each image of {name} "
                                 f"into an SBUF buffer laid out as {label(nxt)}'s input, which its matmuls read in "
                                 f"place{also}; {numbers}", span)
        else:
            out[i] = ChainChoice(i, name, False, store, forced, f"through HBM by default: {numbers}; `place {name}, "
                                 f"sbuf` forces the on-chip chain", span)
    return out


def pool_choice(ops: tuple, plans: tuple, i: int, outputs: tuple[str, ...], directives: tuple, hbm: dict,
                target: str, budget: int) -> ChainChoice:
    """A conv whose output the next op pools through overlapping / strided / padded windows (pool_chain.py): on
    chip (one image of it in SBUF, the pool's bands reading it in place) or through HBM, and why."""
    op, nxt, plan = ops[i], ops[i + 1], plans[i]
    name, dtype = op.out, hbm[op.out].dtype
    forced, span = forced_placement(directives, op.name)
    store = name in outputs or any(name in reads(o) for o in ops if o is not nxt)
    also = f" (and stored: {name} is also {'an output' if name in outputs else 'read by another op'})" if store else ""
    reason = pool_chain.ineligible(op, nxt, plan)
    own = [d for d in directives if d.args and isinstance(d.args[0], sx.Ref) and d.args[0].parts[0] in
           (nxt.name, nxt.out) and d.name not in ("place", "compute_at")]
    if own and forced != "sbuf" and not reason:  # (forced: the chain takes the pool's band, the conv's tiles)
        reason = (f"the pool has its own directives (`{own[0].name} {nxt.name}...`), which apply to its standalone "
                  f"form; `place {name}, sbuf` chains it with the conv's channel tiles and the pool's band")
    need = pool_chain.image_bytes(op, plan, dtype)
    where = (f"{label(nxt)} reads {name} in row bands whose windows overlap (each band also reads rows of the "
             f"band before: the halo)")
    if not reason and need > budget // 2:
        reason = (f"one image of {name} takes {need // 1024} KiB of SBUF per partition, more than half of the "
                  f"{budget // 1024} KiB budget (the rest holds the conv's input bands and weights)")
    if reason:
        return ChainChoice(i, name, False, store, forced, f"{where}; it cannot stay on chip: {reason}, so "
                           f"{label(op)} stores {name} and the pool loads its bands back", span)
    qplan = plans[i + 1] if isinstance(plans[i + 1], PoolPlan) else None
    trip = pool_chain.round_trip_ns(op, dtype, target, store)
    lost = pool_chain.lost(op, plan, nxt, qplan)
    saves = f"{name}'s {'reload' if store else 'store and reload'} ({trip / 1000:.1f} us of DMA on the model's " \
        f"constants)"
    size = f"{need // 1024} KiB" if need >= 1024 else f"{need} bytes"
    if forced == "hbm":
        return ChainChoice(i, name, False, store, forced, f"`place {name}, hbm`: {where}; stored by {label(op)} and "
                           f"loaded back (on chip would save {saves})", span)
    phased = phases_choice(i, op, plan, nxt, hbm, store, target, trip, forced, span)
    if phased is not None:
        return phased
    if forced == "sbuf" or not lost:
        how = f"`place {name}, sbuf`" if forced else "on chip by default"
        cost = f"; but on chip {lost}" if lost else ""
        return ChainChoice(i, name, True, store, forced, f"{how}: {label(op)} evicts each image of {name} into an "
                           f"SBUF buffer ({size} per partition) and {label(nxt)}'s bands read their "
                           f"rows and halo rows there{also}; this saves {saves}{cost}", span)
    return ChainChoice(i, name, False, store, forced, f"through HBM by default: {where}. On chip would save {saves}, "
                       f"but {lost} (the chain keeps to the conv's channel partitions, so by default it is kept only "
                       f"when it gives up nothing); `place {name}, sbuf` forces it", span)


def phases_choice(i: int, op, plan, nxt, hbm: dict, store: bool, target: str, trip: float, forced: str,
                  span: Span | None) -> ChainChoice | None:
    """The conv -> 3x3 s2 max pool chain in the conv's row phases (stem_chain.py), when it applies and saves more
    DMA time than its seam DMA adds (the model's constants); None: pool_choice's own rule decides."""
    if forced == "hbm" or stem_chain.ineligible(op, stem_chain.plan(plan), nxt, hbm, store):
        return None
    seam = stem_chain.seam_ns(op, hbm[op.out].dtype, target)
    if seam >= trip:
        return None
    name = op.out
    how = f"`place {name}, sbuf`" if forced else "on chip by default"
    return ChainChoice(i, name, True, store, forced, (
        f"{how}, in row phases: {label(op)} evicts the even output rows of each band onto the first "
        f"{op.dim('K')} partitions and the odd rows onto the next {op.dim('K')} (one image of {name} in SBUF, "
        f"{kib(stem_chain.image_bytes(op, hbm[name].dtype))} per partition), and {label(nxt)} takes its "
        f"pass along x on all {2 * op.dim('K')} partitions, moves the even rows' passes to the odd rows' "
        f"partitions with an SBUF -> SBUF DMA while it takes the odd rows' max in place, and takes the last "
        f"max there; this saves {name}'s store and reload ({trip / 1000:.1f} us of DMA on the model's constants) "
        f"for {seam / 1000:.1f} us of that DMA"), span, phases=True)


def kib(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} bytes"
