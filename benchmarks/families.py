"""Issue 13's program families at ResNet/MobileNet layer shapes: how far the default schedule is from the floor.

    python benchmarks/families.py                  # every family at batch 1 and 8
    python benchmarks/families.py --batch 1        # batch 1 only
    python benchmarks/families.py conv3x3same bmm  # some families
    python benchmarks/families.py --tiny           # small sizes (the smoke test: seconds, not minutes)
    python benchmarks/families.py --dtype f16      # the programs with f32 -> f16

The programs are benchmarks/families/*.tl (their `default` line is the batch-1 layer shape; batch 8 sets N = 8).
Columns (µs, estimated by tilec's performance model, never measured):
    floor   max(TensorE FLOP floor, DMA byte floor), start-up excluded, from the Target (tilec/target.py):
            FLOPs = 2 x the multiply-adds of every `+=` of a product of two or more tensor-reading factors (the
            contractions, counted from the program), at 2 * pmax * stationary_fmax FLOP per TensorE cycle (fp32
            at a quarter of that rate); DMA = the larger of two times: the bytes the DMA engines must move at
            dma_engines * dma_engine_bw (inputs plus outputs, or for a program of copies only, which may go
            HBM -> HBM with one engine pass per byte, the larger of the two) and the inputs and outputs crossing
            HBM once at hbm_bw (the core's share of HBM reads plus writes)
    bound   which of the two floors is larger
    engines max(floor, the engines' bound), the engines' bound from the Target only (never from the compiler): the
            multiply-adds of every contraction spread over the engines that can multiply-accumulate, each at its
            peak rate, as if they overlapped perfectly (`engines_us`):
              TensorE  tensor_ghz columns per ns (fp32 at a quarter: nki-spec §2.3 "FP32 is 1/4 rate"); a column
                       does `per_column` useful multiply-adds: pmax * stationary_fmax for a contraction without
                       groups (the floor's rate), and for a grouped one (an output index that both factors read:
                       depthwise c, grouped g) a block-diagonal stationary's non-zeros, at most pmax x the group's
                       stationary columns (1 for depthwise: the diagonal matmul, 4 for 32 groups of 4)
              VectorE, GpSimdE, ScalarE (since model14: two passes per multiply-add, what the instructions cost;
                       `vector_macs_per_ns`): a multiply-add by a per-partition weight is a product and an add of two
                       tensors. Fused, it is one scalar_tensor_tensor on VectorE or GpSimdE at 2N cycles (NISA
                       scalar_tensor_tensor: N only for bf16 subtract-then-multiply). Split, a product (ScalarE
                       activation with a per-partition scale, N cycles, written to PSUM: nki-spec §1.4 ScalarE
                       writes SBUF or PSUM) and a VectorE tensor_tensor add at N (§2.4: N with one PSUM input; 2N
                       with both in SBUF unless all are 16-bit). So VectorE adds what ScalarE multiplies, one each
                       per cycle; VectorE beyond ScalarE's rate and all of GpSimdE fuse at 2 cycles (GpSimdE cannot
                       read PSUM and has no documented fast add [inferred: the model charges it 2N]):
                       pmax x (min(V, S) + (V - S)+ / 2 + G / 2) per ns, in any dtype. ScalarE cannot accumulate:
                       its activation adds a per-partition bias, not a tensor.
            engines1 (the column "vs eng1", the bound before model14): VectorE and GpSimdE at one multiply-add per
                       lane per cycle, ScalarE left out: pmax x (vector_ghz + gpsimd_ghz). It undercounted the
                       vector work by the second pass (docs/notes/dw18.md 3a).
            Not counted: formulations where one matmul column holds several output positions of a group (a banded
            Toeplitz stationary, output-row phases); the bound is for one output position per column.
    tilec   model latency of the kernel compiled with the default schedule (a trace-only run on the interpreter),
            or "rejected: <first line of the error>" for a family the compiler does not compile yet
    run     tilec without the model's kernel start-up (the perf model's startup_ns), which the floor excludes too
    ratio   run / floor (the issue's goal: <= 1.5 for every row, start-up excluded)
    vs eng  run / engines: how far the kernel is from what its engines allow (rows whose work cannot use TensorE
            densely: depthwise, grouped; for the others engines = floor and vs eng = ratio)
    vs eng1 run / max(floor, engines1), the one-pass bound of earlier sessions, for comparison
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time
from dataclasses import KW_ONLY, dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tilec.errors import KernelError, TilecError  # noqa: E402
from tilec.lang import api as lang  # noqa: E402
from tilec.lang import syntax as sx  # noqa: E402
from tilec.lang.bounds import evaluate_size  # noqa: E402
from tilec.target import Target, target as get_target  # noqa: E402

FOLDER = ROOT / "benchmarks" / "families"
FP32_SLOWDOWN = 4  # TensorE runs fp32 at a quarter of its 16-bit rate (spec §2.3, as benchmarks/table.py)
BYTES = {"f32": 4, "f16": 2, "bf16": 2}


@dataclass(frozen=True)
class Family:
    program: str  # file name in benchmarks/families/
    what: str
    tiny: dict[str, int]  # sizes for --tiny (batch 1)


FAMILIES = (
    Family("maxpool3x3s2.tl", "ResNet max pool 3x3 s2 pad 1", dict(C=4, H=9, W=8)),
    Family("avgpool3x3s1.tl", "avg pool 3x3 s1 pad 1 (count pad)", dict(C=4, H=6, W=5)),
    Family("avgpool3x3s1_exclude.tl", "avg pool 3x3 s1 pad 1 (exclude pad)", dict(C=4, H=6, W=5)),
    Family("maxpool2x2s1.tl", "max pool 2x2 s1", dict(C=4, H=6, W=5)),
    Family("conv3x3same.tl", "conv 3x3 same", dict(C=8, K=8, H=6, W=5)),
    Family("stem7x7s2.tl", "stem conv 7x7 s2, C=3", dict(K=8, H=16, W=15)),
    Family("depthwise3x3.tl", "depthwise conv 3x3", dict(C=8, H=6, W=5)),
    Family("grouped3x3.tl", "grouped conv 3x3 (32 x 4)", dict(G=4, Cg=2, Kg=2, H=6, W=5)),
    Family("depthwise_mult3x3.tl", "depthwise conv 3x3, multiplier 2", dict(C=4, M=2, H=6, W=5)),
    Family("grouped_kg1.tl", "grouped conv 3x3 (128 x 4 -> 1)", dict(G=4, Cg=2, H=6, W=5)),
    Family("dilated3x3.tl", "dilated conv 3x3 (d=2)", dict(C=8, K=8, H=8, W=7)),
    Family("conv3x3s2.tl", "ResNet downsampling conv 3x3 s2 pad 1", dict(C=8, K=8, H=9, W=8)),
    Family("conv1x1s2.tl", "ResNet projection conv 1x1 s2", dict(C=8, K=8, H=9, W=8)),
    Family("depthwise3x3s2.tl", "depthwise conv 3x3 s2 pad 1", dict(C=8, H=9, W=8)),
    Family("conv_odd.tl", "conv 3x3 same, 67 -> 129 channels", dict(C=5, K=7, H=6, W=5)),
    Family("bmm.tl", "batched matmul", dict(M=8, K=16, P=8)),
    Family("bmm_at.tl", "batched matmul A^T B", dict(M=8, K=16, P=8)),
    Family("bmm_bt.tl", "batched matmul A B^T", dict(M=8, K=16, P=8)),
    Family("matvec.tl", "matrix-vector (1-D vector)", dict(M=8, K=16)),
    Family("shift.tl", "crop / shift", dict(C=4, H=6, W=5)),
    Family("shift_padded.tl", "zero-filled shift (F.pad + crop)", dict(C=4, H=6, W=5)),
    Family("pad1.tl", "padded copy 56x56 -> 58x58", dict(C=4, H=6, W=5)),
    Family("upsample2x.tl", "nearest upsample 2x", dict(C=4, H=3, W=4)),
    Family("upconv2x2.tl", "U-Net up-conv 2x2 s2 (transposed)", dict(C=8, K=4, H=3, W=4)),
    Family("dcgan_up4x4.tl", "DCGAN up-conv 4x4 s2 pad 1 (transposed)", dict(C=8, K=4, H=3, W=4)),
    Family("upconv3x3s2.tl", "up-conv 3x3 s2 pad 1 out-pad 1 (transposed)", dict(C=8, K=4, H=3, W=4)),
    Family("concat.tl", "channel concat", dict(C1=4, C2=2, H=3, W=4)),
    Family("heads_permute.tl", "permute [S, N, H, D] -> [N, H, S, D]", dict(S=6, H=3, D=5)),
    Family("global_avgpool.tl", "global average pool 7x7", dict(C=8)),
    Family("conv_c3.tl", "first layer conv 3x3, C=3", dict(K=8, H=8, W=7)),
    Family("conv_residual.tl", "conv 3x3 + residual add", dict(C=8, K=8, H=6, W=5)),
    Family("conv_relu_conv.tl", "conv 3x3 -> relu -> conv 3x3", dict(C=8, H=8, W=7)),
    Family("resnet_block.tl", "ResNet basic block (padded)", dict(C=8, H=6, W=5)),
    Family("mobilenet_block.tl", "MobileNetV2 block (expand, dw, project)", dict(C=4, E=8, H=6, W=5)),
    Family("maxpool5x5s1.tl", "max pool 5x5 s1 pad 2", dict(C=4, H=9, W=8)),
    Family("maxpool5x5s2.tl", "max pool 5x5 s2 pad 2", dict(C=4, H=9, W=8)),
    Family("avgpool5x5s1.tl", "avg pool 5x5 s1 pad 2 (count pad)", dict(C=4, H=9, W=8)),
    Family("avgpool5x5s2.tl", "avg pool 5x5 s2 pad 2 (count pad)", dict(C=4, H=9, W=8)),
    Family("stem_maxpool.tl", "stem conv 7x7 s2 pad 3 -> max pool 3x3 s2 pad 1", dict(K=8, H=16, W=15)),
    Family("maxpool3x3s2_nhwc.tl", "NHWC max pool 3x3 s2 pad 1", dict(C=4, H=9, W=8)),
    Family("maxpool2x2s2_nhwc.tl", "NHWC max pool 2x2 s2", dict(C=4, H=6, W=8)),
    Family("global_avgpool_nhwc.tl", "NHWC global average pool 7x7", dict(C=8)),
    Family("depthwise3x3_nhwc.tl", "NHWC depthwise conv 3x3", dict(C=8, H=6, W=5)),
)


@dataclass(frozen=True)
class Row:
    family: Family
    batch: int
    sizes: dict[str, int]
    floor_us: float
    bound: str
    _: KW_ONLY  # the rest by name: core.py builds rows too, and a new column must not shift its arguments
    engines_us: float  # max(floor, the engines' bound)
    tilec: float | str  # model latency in µs, or the rejection
    startup_us: float = 0.0  # the model's kernel start-up inside `tilec`
    engines1_us: float | None = None  # max(floor, the one-pass engines' bound), the definition before model14

    @property
    def run_us(self) -> float:
        assert not isinstance(self.tilec, str)
        return self.tilec - self.startup_us


def program_text(family: Family, dtype: str) -> str:
    text = (FOLDER / family.program).read_text()
    return text if dtype == "f32" else text.replace("f32[", f"{dtype}[")


def contraction_flops(kernel: sx.Kernel, sizes: dict[str, int]) -> int:
    """2 x the multiply-adds of every `+=` whose value is a product of tensor reads: what TensorE must compute."""
    def walk(stmts, trips: int) -> int:
        total = 0
        for st in stmts:
            if isinstance(st, sx.Loop):
                extent = max(0, evaluate_size(st.stop, sizes) - evaluate_size(st.start, sizes))
                total += walk(st.body, trips * extent)
            elif st.op == "+=" and _reads_in_product(st.value) >= 2:
                total += 2 * trips
        return total

    return walk(kernel.body, 1)


def _reads_in_product(e: sx.Expr) -> int:
    """How many factors of a product read a tensor (`relu(T[..] ?? 0) * W[..]` has two)."""
    if isinstance(e, sx.BinOp) and e.op == "*":
        return _reads_in_product(e.lhs) + _reads_in_product(e.rhs)
    return int(_reads(e))


def _reads(e: sx.Expr) -> bool:
    if isinstance(e, sx.Access):
        return True
    parts = {sx.Neg: lambda x: (x.x,), sx.BinOp: lambda x: (x.lhs, x.rhs), sx.Call: lambda x: x.args}
    return any(_reads(c) for c in parts.get(type(e), lambda x: ())(e))


@dataclass(frozen=True)
class Contraction:
    """One `+=` of a product of tensor reads: its multiply-adds and the most TensorE can make useful per column."""

    macs: int
    per_column: int  # useful multiply-adds per streamed TensorE column
    grouped: bool  # an output index both factors read (depthwise c, grouped g): no dense TensorE form


def contractions(kernel: sx.Kernel, sizes: dict[str, int], pmax: int, stationary: int) -> list[Contraction]:
    """Every contraction of the kernel (as `contraction_flops` counts them) with its TensorE rate per column.

    A factor is a product operand that reads tensors. Output loop variables (the `+=` target's indices) that both
    factors read are the groups; the loop variables the target does not read are the contraction (per output,
    `taps` multiply-adds). The stationary is the factor with the fewer output positions of its own (the weights):
    `cols` = the extent of the output variables only it reads. A block-diagonal stationary holds `blocks` groups of
    r contraction rows (r <= taps: the rest accumulates over further matmuls) by c columns (c <= cols):
    blocks = min(groups, pmax // r, stationary // c), so a column makes blocks * r * c useful multiply-adds. Without
    groups (or with more than two factors) the contraction is dense: pmax * stationary per column, the floor's rate.
    """
    found: list[Contraction] = []

    def walk(stmts, loops: list[tuple[str, int]]) -> None:
        for st in stmts:
            if isinstance(st, sx.Loop):
                extent = max(0, evaluate_size(st.stop, sizes) - evaluate_size(st.start, sizes))
                walk(st.body, loops + [(st.var, extent)])
            elif st.op == "+=" and _reads_in_product(st.value) >= 2:
                found.append(_contraction(st, loops, pmax, stationary))

    walk(kernel.body, [])
    return found


def _contraction(st: sx.Assign, loops: list[tuple[str, int]], pmax: int, stationary: int) -> Contraction:
    extent = dict(loops)
    macs = math.prod(extent.values())
    dense = Contraction(macs, pmax * stationary, False)
    factors = [f for f in _factors(st.value) if _reads(f)]
    if len(factors) != 2:
        return dense
    out = _names(st.target) & extent.keys()
    reads = [_names(f) & out for f in factors]
    groups = reads[0] & reads[1]
    if not groups:
        return dense
    own = [math.prod(extent[v] for v in r - groups) for r in reads]
    cols = min(own)  # the stationary: the factor with fewer output positions of its own (the weights)
    taps = math.prod(n for v, n in extent.items() if v not in out)
    count = math.prod(extent[v] for v in groups)
    best = max(min(count, pmax // r, stationary // c) * r * c
               for r in range(1, min(taps, pmax) + 1) for c in range(1, min(cols, stationary) + 1))
    return Contraction(macs, best, True)


def _factors(e: sx.Expr) -> list[sx.Expr]:
    if isinstance(e, sx.BinOp) and e.op == "*":
        return _factors(e.lhs) + _factors(e.rhs)
    return [e]


def _names(e) -> set[str]:
    """The loop variables (names) an expression or access reads, through every sub-expression."""
    if isinstance(e, sx.Name):
        return {e.id}
    if isinstance(e, sx.Access):
        return set().union(*(_names(i) for i in e.indices))
    parts = {sx.Neg: lambda x: (x.x,), sx.BinOp: lambda x: (x.lhs, x.rhs), sx.Call: lambda x: x.args}
    return set().union(*(_names(c) for c in parts.get(type(e), lambda x: ())(e)))


def vector_macs_per_ns(tgt: Target, passes: int = 2) -> float:
    """Multiply-adds per ns that VectorE, GpSimdE and ScalarE together can make at their peak (module docstring):
    `passes` 2 counts the product and the add each instruction pays, 1 the one-pass bound before model14."""
    v, g, s = tgt.vector_ghz, tgt.gpsimd_ghz, tgt.scalar_ghz
    if passes == 1:
        return tgt.pmax * (v + g)
    # VectorE adds (N, a PSUM input) what ScalarE multiplies (N); VectorE beyond ScalarE's rate and GpSimdE fuse (2N)
    return tgt.pmax * (min(v, s) + max(0.0, v - s) / 2 + g / 2)


def engines_us(program, tgt: Target, passes: int = 2) -> float:
    """The engines' bound in µs (see the module docstring): the least time T in which TensorE and the vector engines,
    each at its peak rate, finish every contraction's multiply-adds. TensorE takes the contractions with the most
    useful multiply-adds per column first (a fractional knapsack: the vector engines make the same number per ns
    whatever the contraction), the vector engines the rest."""
    fp32 = any(t.dtype == "f32" for t in program.inputs)
    columns_per_ns = tgt.tensor_ghz / (FP32_SLOWDOWN if fp32 else 1)
    vector_per_ns = vector_macs_per_ns(tgt, passes)
    work = sorted(contractions(program.kernel, program.sizes, tgt.pmax, tgt.stationary_fmax),
                  key=lambda c: -c.per_column)
    total = sum(c.macs for c in work)

    def done_by(t_ns: float) -> float:
        """Multiply-adds the engines finish in t_ns."""
        left, tensor = t_ns, 0.0
        for c in work:
            rate = c.per_column * columns_per_ns
            take = min(c.macs, left * rate)
            tensor, left = tensor + take, left - take / rate
        return tensor + vector_per_ns * t_ns

    lo, hi = 0.0, total / vector_per_ns if total else 0.0  # the vector engines alone finish by hi
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if done_by(mid) < total else (lo, mid)
    return hi / 1000


def floor_us(program, tgt: Target) -> tuple[float, str]:
    """max(TensorE FLOP floor, DMA byte floor) in µs, without start-up, and which one it is."""
    flops = contraction_flops(program.kernel, program.sizes)
    fp32 = any(t.dtype == "f32" for t in program.inputs)
    flop_per_ns = 2 * tgt.pmax * tgt.stationary_fmax * tgt.tensor_ghz / (FP32_SLOWDOWN if fp32 else 1)
    size = {kind: sum(math.prod(t.shape) * BYTES[t.dtype] for t in program.tensors.values() if t.kind == kind)
            for kind in ("input", "output")}
    moved = size["input"] + size["output"]  # every input read from HBM once, every output written once
    # what passes a DMA engine: all of it for a program that computes (its data must be on chip); a program of
    # copies only may go HBM -> HBM, where an engine moves each byte once (its read and its write)
    engines = max(size.values()) if copies_only(program.kernel) else moved
    dma = max(engines / (tgt.dma_engines * tgt.dma_engine_bw), moved / tgt.hbm_bw) / 1000
    compute = flops / flop_per_ns / 1000
    return (compute, "TensorE") if compute >= dma else (dma, "DMA")


def copies_only(kernel: sx.Kernel) -> bool:
    """Every statement assigns one tensor read, unchanged (a copy, a crop, a permute)."""
    def walk(stmts) -> bool:
        return all(walk(st.body) if isinstance(st, sx.Loop) else st.op == "=" and isinstance(st.value, sx.Access)
                   for st in stmts)

    return walk(kernel.body)


def model_us(path: pathlib.Path, sizes: dict[str, int], tgt: Target) -> tuple[float | str, float]:
    """Model latency of the default schedule's kernel (or why there is none) and the start-up it includes."""
    from tilec.compiler.api import compile_file
    from tilec.perf.api import estimate

    try:
        compiled = compile_file(str(path), sizes, target=tgt.name)
        _, trace = compiled.run_traced(numerics=False, **lang.random_inputs(compiled.program, seed=0))
    except TilecError as err:
        return f"rejected: {err.message.splitlines()[0]}", 0.0
    except KernelError as err:
        return f"kernel error: {str(err).splitlines()[0]}", 0.0
    est = estimate(trace, tgt.name)
    return est.total_us, est.params.startup_ns.value / 1000.0


def measure(family: Family, batch: int, tiny: bool, dtype: str, tgt: Target, folder: pathlib.Path) -> Row | None:
    path = folder / family.program
    path.write_text(program_text(family, dtype))
    program = lang.load(path)
    if batch != 1 and "N" not in program.facts.symbols:
        return None  # no batch dimension (the matrix-vector product)
    sizes = dict(family.tiny) if tiny else {}
    if "N" in program.facts.symbols:
        sizes["N"] = batch
    return row_at(family, batch, path, sizes, tgt, one_pass=True)


def row_at(family: Family, batch: int, path: pathlib.Path, sizes: dict[str, int], tgt: Target,
           one_pass: bool = False) -> Row:
    """The program at `path` with `sizes`: its floor, engines bound and model latency (core.py and the audit
    benchmarks build their rows here too); one_pass adds the one-pass engines bound ("vs eng1")."""
    program = lang.load(path, sizes)
    floor, bound = floor_us(program, tgt)
    engines1 = max(floor, engines_us(program, tgt, passes=1)) if one_pass else None
    latency, startup = model_us(path, sizes, tgt)
    return Row(family, batch, program.sizes, floor, bound, engines_us=max(floor, engines_us(program, tgt)),
               tilec=latency, startup_us=startup, engines1_us=engines1)


def describe(path: pathlib.Path) -> str:
    """A program's first comment line: what it is (its file stem without one)."""
    first = path.read_text().splitlines()[0]
    return first.lstrip("# ").strip() if first.startswith("#") else path.stem


def table(rows: list[Row]) -> str:
    names = [f"{r.family.program[:-3]}: {r.family.what}" for r in rows]
    width = max(map(len, names), default=6)
    both = any(r.engines1_us is not None for r in rows)  # families.py prints the one-pass bound too (core.py not)
    head = (f"{'family':<{width}} {'batch':>5} {'floor µs':>10} {'bound':>7} {'engines µs':>10} {'tilec µs':>10} "
            f"{'run µs':>9} {'ratio':>7} {'vs eng':>7}" + (f" {'vs eng1':>7}" if both else ""))
    lines = [head, "-" * len(head)]
    for name, r in zip(names, rows):
        lead = f"{name:<{width}} {r.batch:>5} {r.floor_us:>10.2f} {r.bound:>7} {r.engines_us:>10.2f}"
        if isinstance(r.tilec, str):
            lines.append(f"{lead}  {r.tilec}")
        else:
            one = f" {r.run_us / r.engines1_us:>6.2f}x" if r.engines1_us else ""
            lines.append(f"{lead} {r.tilec:>10.2f} {r.run_us:>9.2f} {r.run_us / r.floor_us:>6.2f}x "
                         f"{r.run_us / r.engines_us:>6.2f}x{one}")
    done = [r for r in rows if not isinstance(r.tilec, str)]
    near = [r for r in done if r.run_us <= 1.5 * r.floor_us]
    near_engines = [r for r in done if r.run_us <= 1.5 * r.engines_us]
    lines.append(f"{len(done)} of {len(rows)} rows compile; {len(near)} within 1.5x of the floor (start-up excluded)")
    if both:
        near_one = [r for r in done if r.engines1_us and r.run_us <= 1.5 * r.engines1_us]
        lines.append(f"{len(near_one)} of {len(done)} within 1.5x of max(floor, engines1), the one-pass bound before "
                     "model14 (start-up excluded)")
    lines.append(f"{len(near_engines)} of {len(done)} within 1.5x of max(floor, engines) (start-up excluded)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help="program names (default: all), e.g. conv3x3same")
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default: 1 and 8)")
    parser.add_argument("--tiny", action="store_true", help="small sizes, for a quick check that every row runs")
    parser.add_argument("--dtype", choices=sorted(BYTES), default="f32", help="dtype of every tensor (default f32)")
    parser.add_argument("--target", default="trn2", help="the modelled NeuronCore (tilec.target.TARGETS)")
    args = parser.parse_args(argv)
    chosen = [f for f in FAMILIES if not args.families or f.program[:-3] in args.families]
    unknown = set(args.families) - {f.program[:-3] for f in FAMILIES}
    if unknown:
        parser.error(f"unknown families {sorted(unknown)}; known: {', '.join(f.program[:-3] for f in FAMILIES)}")
    tgt = get_target(args.target)
    import tempfile

    rows: list[Row] = []
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="tilec-families-") as tmp:
        for family in chosen:
            for batch in args.batch or [1, 8]:
                row = measure(family, batch, args.tiny, args.dtype, tgt, pathlib.Path(tmp))
                if row is not None:
                    rows.append(row)
    print(f"issue-13 families on the {tgt.name} model, {args.dtype}{', tiny sizes' if args.tiny else ''} "
          f"({time.time() - start:.0f} s)")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
