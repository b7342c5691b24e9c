"""NeuronCore generations as data: one frozen `Target` per generation, with the instruction table tilec emits.

    Target = name, memories (partitions, SBUF, PSUM banks), TensorE limits, engine clocks, DMA figures, instructions
    Instr  = one NKI instruction: its meaning as a tiny loop statement, the engine, the memories it reads and writes,
             and its size limits (named after the loop variables of the meaning)

Every figure cites its source: a section and key of the NKI fact sheet (`docs/nki-spec.md` in the shared docs, keys
in its bibliography: ARCH2 = trn1 architecture guide, ARCH3 = trn2 architecture guide, ALLOC = NKI allocation
guide, NISA = nki.isa reference, DMAINTRO/DMABW = DMA guides). The compiler, its IR verifier, the tuner, the
interpreter's rules (`tilec.nki.rules`), `nl.tile_size` and the performance model read these records; `--target`
picks one. trn3 (NeuronCore-v4) is not listed: the public docs give only its DMA bandwidth (spec §2.5), not its
memories or engine limits.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator

from tilec.errors import TilecError


@dataclass(frozen=True)
class Instr:
    """One NKI instruction tilec emits. `meaning` uses loop variables p (partition), f (free), k (contraction),
    m, n; `limits` bounds them (or names a sized quantity) per the cited docs."""

    name: str  # the nisa.* spelling
    meaning: str
    engine: str  # pe | act (ScalarE) | dve (VectorE) | pool (GpSimdE) | dma
    reads: tuple[str, ...]  # memories the operands may live in
    writes: tuple[str, ...]  # memories the result may be written to
    limits: tuple[tuple[str, int], ...] = ()
    source: str = ""
    # the engines its `engine=` argument may name on this generation (NKI spelling: vector | scalar | gpsimd), the
    # first the default; () = it takes no engine= (it runs on `engine` only)
    engines: tuple[str, ...] = ()
    engine_ops: tuple[tuple[str, tuple[str, ...]], ...] = ()  # an engine that runs only these ALU ops of it

    def ops_on(self, engine: str) -> tuple[str, ...] | None:
        """The only ALU ops this instruction runs on `engine` (None: all of them)."""
        return dict(self.engine_ops).get(engine)

    def limit(self, var: str) -> int:
        return dict(self.limits)[var]


def _instructions(pmax: int, stationary: int, moving: int, vector_sbuf: int, vector_psum: int,
                  v3: bool = True) -> tuple[Instr, ...]:
    """`v3`: NeuronCore-v3 and later, whose ScalarE also runs tensor_copy and the (multiply, add) tensor_scalar."""
    onchip = ("sbuf", "psum")
    act = ("scalar",) if v3 else ()
    return (
        Instr("nc_matmul", "acc[m, n] += stat[k, m] * mov[k, n]", "pe", ("sbuf",), ("psum",),
              (("k", pmax), ("m", stationary), ("n", moving)), "§1.8 NISA gemm_*_fmax; acc fp32, one PSUM bank"),
        Instr("nc_transpose", "dst[f, p] = src[p, f]", "pe", ("sbuf",), ("psum",), (("p", pmax), ("f", pmax)),
              "§2.4 NISA nc_transpose (TensorE: an identity matmul)"),
        Instr("dma_transpose", "dst[f, p] = src[p, f]", "dma", ("hbm", "sbuf"), ("sbuf",), (("p", pmax), ("f", pmax)),
              "§1.10.12 NISA dma_transpose (HBM -> SBUF or SBUF -> SBUF); §2.5 ARCH3 (DMA engines, <= 90% of copy "
              "throughput from HBM, <= 50% SBUF -> SBUF: perf params dma_transpose_factor, _sbuf_factor)"),
        Instr("activation", "dst[p, f] = FN(src[p, f] * scale + bias[p])", "act", onchip, ("sbuf",),
              (("p", pmax), ("f", vector_sbuf)), "§2.4 NISA activation; FN from tilec.lang.functions"),
        Instr("tensor_tensor", "dst[p, f] = OP(a[p, f], b[p, f])", "dve", onchip, ("sbuf",),
              (("p", pmax), ("f", vector_sbuf)), "§2.4 NISA tensor_tensor; at most one operand in PSUM; §1.10.4 "
              "engine= VectorE or GpSimdE (which cannot touch PSUM)", ("vector", "gpsimd")),
        Instr("tensor_scalar", "dst[p, f] = OP(src[p, f], c | col[p])", "dve", onchip, ("sbuf",),
              (("p", pmax), ("f", vector_sbuf)), "§2.4 NISA tensor_scalar; §1.10.5 engine= VectorE, ScalarE "
              "(v3: multiply/add only), GpSimdE (rsqrt only)", ("vector", *act, "gpsimd"),
              (("scalar", ("multiply", "add")), ("gpsimd", ("rsqrt",)))),
        Instr("scalar_tensor_tensor", "dst[p, f] = OP1(OP0(src[p, f], c | col[p]), b[p, f])", "dve", onchip,
              ("sbuf",), (("p", pmax), ("f", vector_sbuf)),
              "NISA scalar_tensor_tensor (a per-partition multiply-accumulate: one tap of a depthwise conv)"),
        Instr("tensor_reduce", "dst[p] OP= src[p, f]", "dve", onchip, ("sbuf",),
              (("p", pmax), ("f", vector_sbuf)), "§2.4 NISA tensor_reduce (trailing free axes)"),
        Instr("bn_stats", "dst[p, 0:6] = (count, mean, var * count) of src[p, even f], then of src[p, odd f]", "dve",
              onchip, ("sbuf",), (("p", pmax), ("f", 512)), "NISA bn_stats (nl.tile_size.bn_stats_fmax = 512; fp32)"),
        Instr("bn_aggr", "dst[p, 0:2] = (mean, variance) of the (count, mean, var * count) triples src[p, 3k]",
              "dve", onchip, ("sbuf",), (("p", pmax),), "NISA bn_aggr (fp32; one per row of bn_stats outputs)"),
        Instr("tensor_copy", "dst[p, f] = cast(src[p, f])", "dve", onchip, ("sbuf",),
              (("p", pmax), ("f", vector_psum)), "§2.4 NISA tensor_copy (PSUM eviction); §1.10.7 engine= VectorE, "
              "GpSimdE (SBUF only), ScalarE from v3", ("vector", *act, "gpsimd")),
        Instr("dma_copy", "dst = src", "dma", ("hbm", "sbuf"), ("hbm", "sbuf"), (("p", pmax),),
              "§2.5 DMAINTRO (never PSUM)"),
    )


@dataclass(frozen=True)
class Exclusion:
    """Two compute engines that do not access one on-chip memory at the same time: an instruction of one touching
    `memory` never runs beside an instruction of the other touching it (with `per_bank`, only when both touch the
    same PSUM bank). Not a kernel error: the documents say the Neuron compiler serialises such instructions itself
    (or, per bank on NC-v3, that full bandwidth holds only apart), so the performance model orders them and the
    interpreter accepts them."""

    engines: tuple[str, str]  # NKI spelling: vector | scalar | gpsimd
    memory: str  # sbuf | psum
    per_bank: bool
    source: str


# NeuronCore-v2 (ARCH2, v2.32.0 nki/guides/architecture/trainium_inferentia2_arch.rst l. 596-601, "Memory
# hierarchy"; the same text in v2.26.1 nki/arch/trainium_inferentia2_arch.rst l. 594-599): "VectorE and GpSimdE cannot
# access SBUF in parallel. VectorE and ScalarE cannot access PSUM in parallel. Therefore, VectorE and GpSimdE
# instructions that access SBUF must be serialized, similarly for VectorE and ScalarE instructions that access PSUM.
# This is enforced by Neuron Compiler during NKI kernel compilation"; repeated at l. 764-767 ("Concurrent SBUF/PSUM
# accesses by engines").
_V2_ARCH = "ARCH2 v2.32.0 guides/architecture/trainium_inferentia2_arch.rst l. 596-601, 764-767 (compiler-serialised)"
NC_V2_EXCLUSIONS = (
    Exclusion(("vector", "gpsimd"), "sbuf", False, _V2_ARCH + ": VectorE and GpSimdE cannot access SBUF in parallel"),
    Exclusion(("vector", "scalar"), "psum", False, _V2_ARCH + ": VectorE and ScalarE cannot access PSUM in parallel"),
)
# NeuronCore-v3 (ARCH3, v2.32.0 nki/guides/architecture/trainium2_arch.rst l. 266-273, "Data Movement Updates"; the
# v2.26.1 trainium2_arch.rst is a stub without it): both NC-v2 restrictions are lifted, "Both VectorE and ScalarE can
# access PSUM at full bandwidth in parallel, as long as their accesses do not collide on the same PSUM bank". What a
# collision costs is not given: [inferred] it serialises the two, NC-v2's PSUM rule narrowed to one bank. (The
# VectorE/GpSimdE shared bus of 1b is the model's separate what-if, tilec/perf/params.SHARED_BUS.)
NC_V3_EXCLUSIONS = (
    Exclusion(("vector", "scalar"), "psum", True,
              "ARCH3 v2.32.0 guides/architecture/trainium2_arch.rst l. 271-273: VectorE and ScalarE access PSUM in "
              "parallel only while they do not collide on the same PSUM bank [inferred: a collision serialises]"),
)


@dataclass(frozen=True)
class Target:
    name: str
    core: str  # NeuronCore generation
    # memories, per NeuronCore
    pmax: int  # SBUF/PSUM partitions
    sbuf_bytes: int  # SBUF bytes per partition (hardware)
    sbuf_reserved: int  # bytes per partition the NKI compiler keeps for itself, where documented
    psum_banks: int
    psum_bank_bytes: int  # per partition
    # TensorE (a matmul: stationary k x m, moving k x n)
    stationary_fmax: int
    moving_fmax: int
    # VectorE/ScalarE free size of one instruction, in elements
    vector_sbuf_fmax: int
    vector_psum_fmax: int
    # engine clocks [GHz]
    tensor_ghz: float
    vector_ghz: float
    scalar_ghz: float
    gpsimd_ghz: float
    # DMA
    dma_engines: int
    dma_engine_bw: float  # achievable bytes per ns per engine
    # HBM bytes per ns one NeuronCore reads and writes together: the chip's HBM bandwidth over its cores. A DMA
    # between HBM and SBUF crosses HBM once per byte, an HBM -> HBM one twice (a read and a write), so the latter
    # is capped by this, not by the engines (the performance model's DMA occupancy, the benchmarks' floor)
    hbm_bw: float
    instructions: tuple[Instr, ...]
    sources: str = ""
    # TensorE transpose mode (NC-v3+): nc_transpose on TensorE and nc_matmul(is_transpose=True) move the data
    # bit-exactly (NaN/Inf kept), 16-bit input stays 16-bit in PSUM, fp32 runs 2x faster than an fp32 matmul [ARCH3]
    transpose_mode: bool = False
    # free dimensions of one engine operand's access pattern per partition, after merging contiguous ones: "up to
    # four-dimensional arrays" (v2.32.0 nki/deep-dives/nki-aps.rst, "Hardware Capability"; nki-spec §1.6, ARCH2);
    # any signed stride, so windows may overlap (the NKI 0.1 max-pool example `in_tile[i_0, P*i_1 + i_2, P*i_3 +
    # i_4]`, v2.26.1 nki/examples/index-case-3.py)
    ap_free_dims: int = 4
    # elements in one free dimension of an SBUF/PSUM access pattern: "each F axis in the tensor can have a size
    # expressed in uint16 and a stride expressed in int16, measured in data elements" (ARCH2: v2.26.1
    # nki/arch/trainium_inferentia2_arch.rst l. 715-718, of an engine instruction's src/dst; nki-spec §1.6); the NKI
    # library's F_MAX is the same 65535 (v2.32.0 nki/library/api/cross-entropy.rst, chunk_size). Applied to the
    # on-chip side of DMAs too [inferred: no document gives a DMA figure].
    ap_dim_max: int = 65535
    # the step of a free dimension (of more than one element) of an SBUF/PSUM access pattern, an int16 in elements
    # (the same ARCH2 sentence); negative steps down to -ap_stride_max - 1
    ap_stride_max: int = 32767
    # pairs of engines whose accesses to one memory (or one PSUM bank) do not overlap in time (`Exclusion`)
    exclusions: tuple[Exclusion, ...] = ()
    # nisa.activation's bias: a compile-time scalar as well as a (P, 1) vector ("In NeuronCore-v2, the bias must be
    # a [N, 1] vector, but starting NeuronCore-v3, bias can either be a compile-time constant scalar or a [N, 1]
    # vector", ISA6 v2.32.0 nki/api/nki/isa/__init__.py, activation, Layout; the v2.26.1 0.1 docstring documents
    # the vector only), and a bias with op=nl.reciprocal ("nki.isa.activation(op=nl.reciprocal) doesn't support
    # setting bias on NeuronCore-v2", v2.32.0 and v2.26.1 nki/api/nki.api.shared.rst)
    activation_scalar_bias: bool = True
    activation_reciprocal_bias: bool = True
    # DMA descriptors generated by the hardware DGE (NKI 0.6 dge_mode=hwdge): "Hardware based DGE is only supported
    # for NeuronCore-v3 or newer" (ISA6 v2.32.0 nki/api/nki/isa/__init__.py, dma_copy, dge_mode)
    hwdge: bool = True
    # "each HWDGE DMA instruction takes about 600 ns to issue" on NeuronCore-v3 (nki-spec §2.5, ARCH3/DGE)
    hwdge_issue_ns: float = 600.0

    @property
    def sbuf_usable(self) -> int:
        """SBUF bytes per partition a kernel may allocate: the hardware less the documented compiler reserve."""
        return self.sbuf_bytes - self.sbuf_reserved

    @property
    def psum_bytes(self) -> int:
        return self.psum_banks * self.psum_bank_bytes

    @property
    def psum_fmax(self) -> int:
        """fp32 elements per partition of one PSUM bank (= nl.tile_size.psum_fmax)."""
        return self.psum_bank_bytes // 4

    def side_by_side(self, a: str, b: str, memory: str) -> bool:
        """Whether engines `a` and `b` (NKI spelling) may access `memory` at the same time: no whole-memory
        `Exclusion` names both (a per-bank one only keeps them off one PSUM bank)."""
        return not any(set(x.engines) == {a, b} and x.memory == memory and not x.per_bank for x in self.exclusions)

    @property
    def vector_gpsimd_split(self) -> bool:
        """Whether element-wise work cut between VectorE and GpSimdE can run faster than on one of them: only where
        the two may touch SBUF side by side (not on NC-v2, whose compiler serialises their SBUF accesses: the
        pieces' times add up, each paying its fixed cost)."""
        return self.side_by_side("vector", "gpsimd", "sbuf")

    def vector_part(self, vector_cycles: float = 2.0, gpsimd_cycles: float = 2.0) -> float:
        """VectorE's part of element-wise work over SBUF cut between VectorE and GpSimdE (GpSimdE takes the rest),
        given each engine's cycles per element (2 for an fp32 tensor_tensor on either, tilec/perf/costs.py): in
        proportion to their speeds where the two run side by side, so both finish together; where they do not
        (vector_gpsimd_split), all of it on the faster one (VectorE on a tie). The compiler's work splits read
        this instead of the clocks' ratio."""
        v, g = self.vector_ghz / vector_cycles, self.gpsimd_ghz / gpsimd_cycles
        if self.vector_gpsimd_split:
            return v / (v + g)
        return 1.0 if v >= g else 0.0

    def instr(self, name: str) -> Instr:
        for i in self.instructions:
            if i.name == name:
                return i
        raise KeyError(name)


TRN2 = Target(
    "trn2", "NeuronCore-v3",
    pmax=128, sbuf_bytes=224 * 1024, sbuf_reserved=0, psum_banks=8, psum_bank_bytes=2048,
    stationary_fmax=128, moving_fmax=512, vector_sbuf_fmax=65536, vector_psum_fmax=4096,
    tensor_ghz=2.4, vector_ghz=0.96, scalar_ghz=1.2, gpsimd_ghz=1.2,
    dma_engines=16, dma_engine_bw=23.0, hbm_bw=375.0,
    instructions=_instructions(128, 128, 512, 65536, 4096),
    sources="§2.2 ARCH3: 224 KiB SBUF per partition, all usable (no reserve documented for v3, and a course "
            "conv kernel with 215,572 bytes per partition live passed on Trn2 under SDK 2.21: "
            "fidelity-cases/sbuf_215k.py), PSUM 8 x 2 KiB [ARCH2]; "
            "§1.8/§2.3 TensorE 128x128, moving <= 512 [NISA, PM]; VectorE free <= 64K SBUF / 4K PSUM [ARCH2]; "
            "§2.3 ARCH3 clocks; §2.5 DMAINTRO/DMABW 16 engines x 23 B/ns; §2.1/§6 HBM 3 TB/s per chip (ARCH3, the "
            "12/2025 NKI Trn2 guide; the 2.26 pages say 2.9) over 8 cores = 375 B/ns per core; transpose mode: v2.32.0 "
            "trainium2_arch.rst (Built-in Transpose Support), ISA6 nc_matmul / nc_transpose",
    transpose_mode=True, exclusions=NC_V3_EXCLUSIONS)

TRN1 = Target(
    "trn1", "NeuronCore-v2",
    pmax=128, sbuf_bytes=192 * 1024, sbuf_reserved=16 * 1024, psum_banks=8, psum_bank_bytes=2048,
    stationary_fmax=128, moving_fmax=512, vector_sbuf_fmax=65536, vector_psum_fmax=4096,
    tensor_ghz=2.8, vector_ghz=1.12, scalar_ghz=1.4, gpsimd_ghz=1.4,
    dma_engines=16, dma_engine_bw=17.0, hbm_bw=410.0,
    instructions=_instructions(128, 128, 512, 65536, 4096, v3=False),
    sources="§2.2 ARCH2: 192 KiB SBUF per partition, usable 0..176 KiB [ALLOC]; PSUM 8 x 2 KiB; §2.3 ARCH2 clocks; "
            "§2.5 DMAINTRO 16 engines x 17 B/ns; §2.1 HBM 820 GB/s per chip (ARCH2) over 2 cores = 410 B/ns per core",
    exclusions=NC_V2_EXCLUSIONS, activation_scalar_bias=False, activation_reciprocal_bias=False,
    hwdge=False)

TARGETS: dict[str, Target] = {"trn2": TRN2, "trn1": TRN1}
DEFAULT = "trn2"


# The target a compilation is for (`compiling`, set by the pipeline), read by the builders that are not handed the
# Target: their budgets, clocks, the model's constants and work splits (docs/notes/trn22.md). `target(None)` is the
# default (trn2) for callers outside a compilation; no compiler module asks it (tests/nki/test_examples_trn1.py).
_COMPILING: ContextVar[Target | None] = ContextVar("tilec_compiling", default=None)


@contextmanager
def compiling(t: Target) -> Iterator[Target]:
    """Within this block `compiled()` is `t`."""
    token = _COMPILING.set(t)
    try:
        yield t
    finally:
        _COMPILING.reset(token)


def compiled() -> Target:
    """The target being compiled for (the default outside a compilation)."""
    return _COMPILING.get() or target()


def target(name: str | Target | None = None) -> Target:
    """A target by name (None: the default, trn2); a Target passes through."""
    if isinstance(name, Target):
        return name
    name = name or DEFAULT
    if name not in TARGETS:
        raise TilecError(f"unknown target {name!r}", hint=f"use one of {', '.join(TARGETS)}")
    return TARGETS[name]


def invariant(field: str) -> int:
    """A limit every known generation shares (partitions, matmul sizes, PSUM bank): the compiler's plans may use it
    as a constant. A future target that differs makes this fail loudly instead of planning wrong tiles."""
    values = {getattr(t, field) for t in TARGETS.values()}
    if len(values) != 1:
        raise AssertionError(f"{field} differs between targets ({values}): thread the Target through instead")
    return values.pop()
