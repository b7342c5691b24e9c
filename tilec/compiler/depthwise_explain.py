"""`tilec explain`'s account of the depthwise kernel's plan (build_depthwise.describe): partitions, loops, DMAs,
chunks, each engine's taps, TensorE's matrices and the eviction, in the program's terms."""
from __future__ import annotations

from tilec.compiler.depthwise_kernel import DepthwiseBuilder
from tilec.compiler.ops import ConvOp
from tilec.compiler.schedule import PMAX


def explain(op: ConvOp, b: DepthwiseBuilder, pe: bool) -> list[str]:
    """The lines describing the kernel builder `b` builds (`pe`: TensorE takes taps)."""
    lay = b.lay
    k = b.names["k"]
    images = min(lay.k, b.N)
    parts = images * lay.nb * lay.cg
    rest = f" + a last group of {b.CR}" if b.CR else ""
    last = f" + a last tile of {plural(b.NR, 'image')}" if b.NR else ""
    blocks = f" x {lay.nb} row blocks of {lay.rb} output rows" if lay.nb > 1 else ""
    chunks = sorted({min(lay.rc, lay.rb - y0) for y0 in range(0, lay.rb, lay.rc)}, reverse=True)
    out = [f"# {op.name}: the depthwise kernel (build_depthwise), its plan:",
           f"#   partitions: ({'image' if lay.nb == 1 else 'row block'}, {k}) pairs, {parts} of {PMAX}: "
           f"{lay.cg} {k} channels per group x {plural(images, 'image')} per tile{blocks}",
           f"#   loops: {plural(b.G, 'group')}{rest} x {plural(b.NT, 'tile')} of {plural(lay.k, 'image')}{last}; "
           + ("a load DMA per (m, band slot) and piece of rows, a store per output channel" if b.HY else
            "one load and one store DMA per slot")
           + ("; halo rows copied from a zero tile" if b.has_halo() else "")
           + ("; taps skip the column halo" if b.clip else ""),
           f"#   PSUM chunks of {lay.rc} output rows ({lay.rc * b.Wo} fp32 per partition), pipelined {b.depth} deep"]
    if b.M > 1:
        out.append(f"#   channel multiplier {b.M}: each partition computes its {k} channel's {b.M} output channels, "
                   "one after another, from one band")
    if b.HY:
        out.append(f"#   grouped conv, {b.HY} -> {b.HY} channels per group: partition (m, group) computes output "
                   f"channel group*{b.HY} + m from its group's {b.HY} input channels, rotated by m in the band; "
                   "TensorE takes whole positions (r, s) as block-diagonal matmuls of band slot 0 (every input channel "
                   "once)")
    elif b.CI > 1:
        out.append(f"#   fan-in {b.CI}: each partition sums its group's {b.CI} input channels (taps over (c, r, s))")
    for rows in chunks:
        out.append(f"#   taps of a {rows}-row chunk ({b.R * b.S * b.CI}): {b.taps_note(rows)}")
    if pe and b.HY:
        out.append("#   TensorE's taps: block-diagonal matrices (a stacked identity scaled per partition) built once "
                   "per group before the main loop")
    elif pe:
        out.append(f"#   TensorE's taps: diag({op.w}[{k}, r, s]) matrices built once per group before the main loop")
    out.append(f"#   eviction from PSUM: {b.epilogue_note() or 'a copy'}, into the output band")
    out.append(f"#   the directives below are the general path's: a schedule that changes {op.name}'s plan takes that "
               "path")
    return out


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")
