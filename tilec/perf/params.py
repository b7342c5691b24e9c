"""The per-target parameter table of the performance model: every number with where it comes from.

A `Param` is a value plus its source: a section/key of `docs/nki-spec.md` ("§2.3 ARCH3"), a line of
`docs/calibration.md`, or "fitted to rows ..." when `benchmarks/calibrate.py` chose it (rows = calibration.md §1).
`target_params("trn2")` returns the table as a frozen `Params`; the model reads plain floats from it.

Units: clocks in GHz (cycles per ns), times in ns, bandwidth in bytes per ns (= GB/s), sizes in bytes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields

from tilec.errors import TilecError
from tilec.target import TRN1 as HW1, TRN2 as HW2, Exclusion  # clocks, array, DMA engines, memories, access rules


@dataclass(frozen=True)
class Param:
    value: float
    source: str


@dataclass(frozen=True)
class Params:
    """One NeuronCore generation. Field order is the order of the printed table."""

    # clocks [GHz]
    tensor_ghz: Param
    vector_ghz: Param
    scalar_ghz: Param
    gpsimd_ghz: Param
    base_ghz: Param  # profiler cycle counter
    # TensorE
    pe_rows: Param
    pe_cols: Param
    mm_min_cycles: Param  # MM_INIT_LATENCY: a matmul never streams fewer columns than this
    mm_fixed_cycles: Param  # per-instruction overhead beyond the streamed columns
    mm_fp32_factor: Param  # fp32 matmul cost multiplier (¼ rate)
    transpose_fp32_speedup: Param  # TensorE transpose mode: an fp32 transpose costs mm_fp32_factor / this
    onezero_fp32_speedup: Param  # an fp32 matmul with an operand marked ones/zeros only costs mm_fp32_factor / this
    throttle_start_fraction: Param  # TensorE utilization allowed when its warm-up throttle engages (1 = no throttle)
    throttle_ramp_ns: Param  # time from engagement to full speed
    throttle_window_ns: Param  # trailing window over which TensorE utilization is watched
    throttle_min_utilization: Param  # utilization in that window below which the throttle re-engages
    # VectorE / ScalarE / GpSimdE
    min_ii_cycles: Param  # MIN_II of one instruction
    vector_static_cycles: Param
    scalar_static_cycles: Param
    gpsimd_static_cycles: Param
    gpsimd_iota_cycles: Param
    perf_mode_copy: Param  # v3 VectorE 16-bit SBUF->SBUF copy / tensor_scalar speed-up
    perf_mode_half: Param  # v3 speed-up when one side is PSUM, and for 16-bit tensor_tensor
    sbuf_stride_limit_bytes: Param  # an SBUF access whose innermost free stride exceeds this streams slower
    sbuf_stride_factor: Param  # cost multiplier of the streaming part of such an instruction
    # DMA
    dma_engines: Param
    dma_partitions_per_engine: Param
    dma_engine_bw: Param  # bytes per ns per DMA engine
    dma_xfer_fixed_ns: Param  # fixed occupancy of each DMA engine per transfer
    dma_desc_ns: Param  # occupancy per descriptor (contiguous chunk) on one engine
    dma_latency_ns: Param  # semaphore-to-start latency, not occupying an engine
    dma_write_ack_ns: Param  # a DMA writing HBM completes this long after its last byte left the engines
    hwdge_issue_ns: Param  # a DMA whose trigger engine the kernel names (HWDGE): its sequencer's time to issue it
    dma_transpose_factor: Param  # dma_transpose throughput relative to a copy (HBM->SBUF)
    dma_transpose_sbuf_factor: Param  # the same, SBUF -> SBUF
    startup_ns: Param  # kernel start-up before the first instruction
    buffer_rotation: Param  # buffers per allocation site: the k-th reuses the memory of the (k-R)-th
    load_versions: Param  # copies of a buffer refilled whole by DMA loads (schedule.renamed)
    # memories
    sbuf_bytes_per_partition: Param
    sbuf_usable_bytes: Param  # per partition, what a kernel's buffers (and the renamed copies) may occupy
    psum_bytes_per_partition: Param
    psum_bank_bytes: Param  # per partition; a PSUM tile lies in one bank, every PSUM tensor starts a bank
    hbm_stack_bw: Param  # bytes per ns, denominator of MBU
    hbm_core_bw: Param  # bytes per ns of HBM reads plus writes one core's DMAs share (an HBM -> HBM byte counts twice)
    # engines that do not access one memory (or PSUM bank) at the same time: the Target's records, with their sources
    # (tilec.target.Exclusion; the schedule orders such instructions, tilec/perf/conflicts.py)
    exclusions: tuple[Exclusion, ...] = ()

    def table(self) -> list[tuple[str, float, str]]:
        """The numeric parameters (the access rules are records, not numbers: `exclusions`)."""
        return [(f.name, getattr(self, f.name).value, getattr(self, f.name).source) for f in fields(self)
                if isinstance(getattr(self, f.name), Param)]


# Rows of calibration.md §1 the free parameters were fitted to (benchmarks/calibrate.py prints the fit).
FIT_TINY_DMA = ("fitted to rows 1, 2, 4 (tiny-DMA loops, 1.5-1.9 us per iteration) and bounded by rows 10p, 12p "
                "(20 ns puts the public conv's VectorE DMA chain at +15 %)")
FIT_STARTUP = "fitted to rows 5, 6, 7 (calibration.md: ~14 us start-up before the first DMA)"

TRN2 = Params(
    tensor_ghz=Param(HW2.tensor_ghz, "§2.3 ARCH3 table"),
    vector_ghz=Param(HW2.vector_ghz, "§2.3 ARCH3 table"),
    scalar_ghz=Param(HW2.scalar_ghz, "§2.3 ARCH3 table"),
    gpsimd_ghz=Param(HW2.gpsimd_ghz, "§2.3 ARCH3 table"),
    base_ghz=Param(1.2, "§2.3 / §5 EXSCHEMA neuroncore_cycle_count"),
    pe_rows=Param(HW2.pmax, "§2.3 ARCH2 (128x128 PE array)"),
    pe_cols=Param(HW2.stationary_fmax, "§2.3 ARCH2"),
    mm_min_cycles=Param(64, "§2.4 NISA / §2.3 MM_INIT_LATENCY"),
    mm_fixed_cycles=Param(9, "fitted to rows 10, 12 with the public kernel behind them (xaviergonzalez/asst4-"
                              "trainium2 conv2d.py @ d155261: 7,992 matmuls plus a ~70 us weight prologue in 824 us; "
                              "spec cost 222 cycles = 92.5 ns)"),
    mm_fp32_factor=Param(4.7, "fitted to rows 9, 11 (spec §2.4 says x4; calibration.md §3 seed measured ~4.65x)"),
    transpose_fp32_speedup=Param(2, "§1.10.2 ARCH3 (v2.32.0 trainium2_arch.rst, Built-in Transpose Support): NC-v3 "
                                    "TensorE transpose mode, 2x speedup in FP32 transpose vs. no transpose mode; "
                                    "enabled by nc_matmul(is_transpose=True) or nc_transpose(engine=tensor)"),
    onezero_fp32_speedup=Param(2, "§1.10.2 NISA (ISA1/ISA6 nc_matmul docstrings, v2.21-v2.33): "
                                  "is_stationary_onezero / is_moving_onezero 'could lead to 2x better performance' "
                                  "if that operand is float32 (the documented upper bound; not calibrated)"),
    throttle_start_fraction=Param(0.5, "§2.3 Throttling (Trn2) EXSUM/EXGLOSS: about 50 % utilization after work "
                                       "begins"),
    throttle_ramp_ns=Param(3000.0, "§2.3 Throttling (Trn2): ramps to full over about 3 us [inferred shape: held to "
                                   "50 % of the first 3 us, then full; tilec/perf/throttle.py]"),
    throttle_window_ns=Param(3000.0, "§2.3 Throttling (Trn2): any ~3 us window"),
    throttle_min_utilization=Param(0.5, "§2.3 Throttling (Trn2): re-engages below 50 % utilization"),
    min_ii_cycles=Param(64, "§2.4 NISA MIN_II"),
    vector_static_cycles=Param(100, "§2.3 ARCH2 static overhead ~100 cycles"),
    scalar_static_cycles=Param(100, "§2.3 ARCH2 static overhead ~100 cycles (ScalarE II 264 for 1 element, PERF 5a)"),
    gpsimd_static_cycles=Param(100, "§2.3 ARCH2 static overhead ~100 cycles [inferred for GpSimdE]"),
    gpsimd_iota_cycles=Param(150, "§2.4 NISA iota/affine_select 150 + N"),
    perf_mode_copy=Param(4, "§2.3 ARCH3 performance mode 4x"),
    perf_mode_half=Param(2, "§2.3 ARCH3 performance mode 2x"),
    sbuf_stride_limit_bytes=Param(16, "§2.2 ARCH2 SBUF stride penalty: innermost free stride > 16 bytes"),
    sbuf_stride_factor=Param(2.0, "§2.2 ARCH2 SBUF stride penalty: halves the interface bandwidth (documented for "
                                  "v2) [inferred for v3]"),
    dma_engines=Param(HW2.dma_engines, "§2.5 ARCH3/DMAINTRO 16 DMA engines per core"),
    dma_partitions_per_engine=Param(8, "§2.5 DMAINTRO (128 partitions / 16 engines)"),
    dma_engine_bw=Param(HW2.dma_engine_bw, "§2.5 DMAINTRO/DMABW 23 B/ns per engine"),
    dma_xfer_fixed_ns=Param(0.0, "fitted to rows 10, 12 (public kernel): its 2,664 row loads of 128 x 448 B and 888 "
                                  "other DMAs run beside 811 us of matmuls, which leaves no fixed engine time per "
                                  "transfer (450 ns, fitted to rows 1, 2, 4 alone, put it at 2,210 us)"),
    dma_desc_ns=Param(14.0, FIT_TINY_DMA + "; not nki-spec's ~105 ns per row (a fit to DMAINTRO's efficiency "
                            "figure, whose set-up is not given): 105 ns puts rows 2, 4, 8 at +107 %, +113 %, +60 % and "
                            "rows 2, 4 alone bound it below ~78 ns (3 DMAs of 8 rows per engine in 1.9 us); "
                            "benchmarks/trn2_dma_desc.py measures it (docs/notes/fid14.md)"),
    dma_latency_ns=Param(1150.0, "fitted to rows 1, 2, 4 (tiny-DMA loops: one store latency + load + compute per "
                                "iteration on the in-order trigger stream; 1050 ns: row 2 -14 %) and bounded by rows "
                                "10p, 12p (1250 ns: +13 %); between §2.5's HWDGE ~600 ns + fixed cost and the generic "
                                "DMABW 1300 ns semaphore-to-start"),
    hwdge_issue_ns=Param(HW2.hwdge_issue_ns, "§2.5 ARCH3/DGE: each HWDGE DMA instruction takes about 600 ns to "
                                             "issue on v3; the triggers a kernel puts on one engine (dge_mode=hwdge, "
                                             "engine=sync) are spaced by it [inferred: one issue at a time]"),
    dma_write_ack_ns=Param(650.0, "fitted to row 8 (1024x1024 transpose, 86 us: 1.14 us per tile = one round trip "
                                  "copy -> store -> acknowledged per 2 tiles); the other rows move by <= 4.3 % with it "
                                  "[inferred: a write to HBM completes one HBM round trip after its last byte, a load "
                                  "when its bytes are in SBUF]"),
    dma_transpose_factor=Param(0.9, "§2.5 ARCH3 (<= 90% of copy throughput HBM->SBUF; 50% SBUF->SBUF; 2- and "
                                    "4-byte dtypes; the 16 engines write [128, 16] blocks together, so the recorder "
                                    "counts the source's contiguous runs as descriptors, as for a copy: "
                                    "isa._emit_dma)"),
    dma_transpose_sbuf_factor=Param(0.5, "§2.5 ARCH3 (<= 50% of copy throughput SBUF->SBUF; nki-spec 1.10.12)"),
    startup_ns=Param(13000.0, FIT_STARTUP),
    buffer_rotation=Param(2, "fitted to rows 8-12 (1 buffer: rows 8, 10 +83 %, +64 %; 3: row 8 -27 %) [inferred: the "
                             "allocator rotates loop tiles through a few buffers; its policy is not documented]"),
    load_versions=Param(16, "fitted to rows 10p, 12p (public kernel: 4 copies leave TensorE waiting on row loads, "
                            "+48 %; 8 and 16 give the same) [inferred: the allocator renames a buffer refilled whole "
                            "by DMA]"),
    sbuf_bytes_per_partition=Param(HW2.sbuf_bytes, "§2.2 ARCH3 224 KiB"),
    sbuf_usable_bytes=Param(HW2.sbuf_usable, "§2.2 ARCH3 224 KiB, no compiler reserve documented for NC-v3 "
                                             "(tilec.target TRN2.sbuf_usable; bounds load_versions)"),
    psum_bytes_per_partition=Param(HW2.psum_bytes, "§2.2 ARCH2 16 KiB"),
    psum_bank_bytes=Param(HW2.psum_bank_bytes, "§2.2 ARCH2 8 banks of 2 KiB per partition; ALLOC Known Limitations 3 "
                                               "(a PSUM tile cannot cross bank boundaries); MIG v2.32.0 (PSUM "
                                               "tensors must start at the beginning of a bank): schedule.psum_plan"),
    hbm_stack_bw=Param(2 * HW2.hbm_bw, "§2.1 one stack shared by 2 cores: twice tilec.target TRN2.hbm_bw (MBU "
                                        "denominator = one stack)"),
    hbm_core_bw=Param(HW2.hbm_bw, "§2.1/§6 HBM cap per core: 3 TB/s (ARCH3, 12/2025 NKI guide) / 8 cores "
                                  "(tilec.target TRN2.hbm_bw); each engine gets 1/16 of it"),
    exclusions=HW2.exclusions,
)

TRN1 = Params(
    **{**{f.name: getattr(TRN2, f.name) for f in fields(TRN2)},
       "tensor_ghz": Param(HW1.tensor_ghz, "§2.3 ARCH2 table"),
       "vector_ghz": Param(HW1.vector_ghz, "§2.3 ARCH2 table"),
       "scalar_ghz": Param(HW1.scalar_ghz, "§2.3 ARCH2 table"),
       "gpsimd_ghz": Param(HW1.gpsimd_ghz, "§2.3 ARCH2 table"),
       "base_ghz": Param(1.4, "§5 EXSCHEMA"),
       "mm_fp32_factor": Param(4.0, "§2.4 NISA fp32 x4 (not calibrated on trn1)"),
       "transpose_fp32_speedup": Param(1, "§1.10.2 NEWISA/NISA: NC-v2 has no native transpose mode "
                                          "(is_transpose=True is a profiler hint there)"),
       "throttle_start_fraction": Param(1.0, "§2.3 throttling is documented for Trn2 only (1 = off on NC-v2)"),
       "perf_mode_copy": Param(1, "§2.3 no performance mode on NC-v2"),
       "perf_mode_half": Param(1, "§2.3 no performance mode on NC-v2"),
       "sbuf_stride_factor": Param(2.0, "§2.2 ARCH2 SBUF stride penalty: halves the interface bandwidth (v2)"),
       "dma_engine_bw": Param(HW1.dma_engine_bw, "§2.5 DMAINTRO 17 B/ns per engine (TRN1)"),
       "sbuf_bytes_per_partition": Param(HW1.sbuf_bytes, "§2.2 ARCH2 192 KiB"),
       "sbuf_usable_bytes": Param(HW1.sbuf_usable, "§2.2 ALLOC 0..176 KiB usable (tilec.target TRN1.sbuf_usable)"),
       "hbm_stack_bw": Param(HW1.hbm_bw, "§2.1 derived 820 GB/s / 2 stacks, one core each"),
       "hbm_core_bw": Param(HW1.hbm_bw, "§2.1 derived 820 GB/s / 2 cores (tilec.target TRN1.hbm_bw)"),
       "exclusions": HW1.exclusions})

TARGETS = {"trn2": TRN2, "trn1": TRN1}


def target_params(target: str) -> Params:
    if target not in TARGETS:
        raise TilecError(f"unknown performance-model target {target!r}", hint=f"use one of {', '.join(TARGETS)}")
    return TARGETS[target]


@dataclass(frozen=True)
class WhatIf:
    """A rule of the model that the docs leave open, with the readings it allows: an estimate names one, else the
    environment variable `env` does (read at each estimate), else `default` holds. `what` names it in errors."""
    what: str
    env: str
    choices: tuple[str, ...]
    default: str

    def pick(self, rule: str | None = None) -> str:
        """The reading to use: `rule`, else $env, else the default; an unknown one is an error naming the variable."""
        rule = os.environ.get(self.env, self.default) if rule is None else rule
        if rule not in self.choices:
            raise TilecError(f"unknown {self.what} {rule!r} ({self.env})", hint=f"use one of {', '.join(self.choices)}")
        return rule


# VectorE's NC-v3 performance mode and GpSimdE share an SBUF bus (ARCH3, v2.32.0 trainium2_arch.rst, Data Movement
# Updates 1b: "VectorE's performance mode leverages a shared memory bus between the VectorE and GpsimdE engines ...
# The hardware automatically coordinates access between engines to optimize bus utilization, including arbitrating
# between GpsimdE and relevant VectorE instructions"). What the arbitration costs is not documented, so the model's
# default is "off" (the engines overlap freely, as NC-v3 allows VectorE and GpSimdE to access SBUF in parallel);
# "exclusive" is the pessimistic reading: a VectorE instruction in performance mode (16-bit tensor_copy /
# tensor_scalar, 16-bit tensor_tensor from SBUF) and a GpSimdE instruction never run at the same time.
# benchmarks/trn2_shared_bus.py is the Trn2 measurement that decides it; docs/notes/fid11.md the what-if numbers.
SHARED_BUS = WhatIf("VectorE/GpSimdE bus rule", "TILEC_MODEL_SHARED_BUS", ("off", "exclusive"), "off")
shared_bus = SHARED_BUS.pick


# Engines that must not touch one memory at the same time (Target.exclusions, each with its source): on NeuronCore-v2
# VectorE and GpSimdE never access SBUF together, nor VectorE and ScalarE PSUM, which the Neuron compiler enforces by
# serialising their instructions (ARCH2); on NeuronCore-v3 only VectorE and ScalarE on the same PSUM bank collide
# (ARCH3: full bandwidth in parallel "as long as their accesses do not collide on the same PSUM bank"; that a collision
# serialises them is inferred). "serial" (the default since fid20) orders such instructions (tilec/perf/conflicts.py);
# "off" (the model before fid20) lets them overlap, as a what-if (docs/notes/fid20.md lists what it moves).
ENGINE_ACCESS = WhatIf("engine access rule", "TILEC_MODEL_ENGINE_ACCESS", ("serial", "off"), "serial")
engine_access = ENGINE_ACCESS.pick


# Loop tiles rotate through `buffer_rotation` buffers per allocation site (schedule.rotation_predecessors), an
# inference fitted to calibration rows 8-12. "fit" (the default) grants the further buffers only while they fit beside
# every site's first (schedule.sbuf_plan): the compiler plans one copy of each tile, and where sites' second buffers do
# not fit, the hardware compiler's allocator cannot give them (its multi-buffering policy is not documented: ALLOC
# v2.26.1 describes placement). The row chains choose tiles whose rotation buffers fit (docs/notes/rows13.md).
# "free" (every site rotates whether its buffers fit or not, the default before rows13) stays as a what-if
# (docs/notes/fid12.md lists the kernels it moves).
SBUF_ROTATION = WhatIf("SBUF rotation rule", "TILEC_MODEL_SBUF_ROTATION", ("free", "fit"), "fit")
sbuf_rotation = SBUF_ROTATION.pick


# PSUM tiles rotate like SBUF ones (`buffer_rotation` per allocation site), but PSUM is 8 banks of 2 KiB per partition
# and every PSUM tensor takes a bank of its own (a tile cannot cross a bank, ALLOC v2.26.1 Known Limitations 3; "The
# allocation for PSUM tensors must start at the beginning of each bank", MIG v2.32.0 nki/migration/index.rst; "with 8
# PSUM banks per partition, TensorE can have up to eight outstanding matmul accumulation groups", v2.32.0
# trainium_inferentia2_arch.rst). "fit" (the default) places every PSUM tile in one of the banks in program order
# (schedule.psum_plan): a site's rotation buffer only where a bank is free, and a tile placed in a bank another tile
# used waits until that tile's last instruction ended. "free" (the model before fid14) gives every site its
# rotation buffers and never makes one site's tile wait for another's bank: up to 2 banks per site, unchecked
# against the 8 (docs/notes/fid14.md lists the kernels that needed more).
PSUM_ROTATION = WhatIf("PSUM rotation rule", "TILEC_MODEL_PSUM_ROTATION", ("free", "fit"), "fit")
psum_rotation = PSUM_ROTATION.pick


# The order in which DMA transfers issue (schedule.py). What the documents say: a DMA is triggered by a control
# instruction in an engine sequencer's own instruction stream, issued in program order after its semaphore waits
# (v2.32.0 guides/architecture/trainium_inferentia2_arch.rst, "Each compute engine has its own sequencer ...
# triggering DMA transfers"; the Sync engine "is most commonly used to trigger DMA transfers"); a transfer is
# submitted to one queue ID across the 16 DMA engines, "DMA transfers within a queue on the same DMA engine are
# executed in order" and different queues are served round robin (v2.32.0 nki/get-started/about/nki-dma-overview.rst,
# DMA Triggers / DMA Queues; rings switched at packet boundaries, v2.32.0 neuron-runtime/explore/
# compute-comm-overlap.rst); each DMA engine processes one transfer at a time and all engines process different
# transfers in parallel (v2.26.1 nki/arch/trainium_inferentia2_arch.rst, Data movement between HBM and SBUF).
# "engine" (the default since fid15) follows that: the triggers of one stream issue in order (a trigger waits for
# its own dependences and for the trigger before it, not for that transfer to start), and each DMA engine runs its
# part of a queue's transfers in order, so a transfer on engines 8-15 does not wait for one still queued on engines
# 0-7. "stream" (the model before fid15) starts a transfer no earlier than the previous transfer of its stream
# started on any engine, which orders the engines behind each other (docs/notes/fid15.md).
DMA_QUEUE = WhatIf("DMA queue rule", "TILEC_MODEL_DMA_QUEUE", ("stream", "engine"), "engine")
dma_queue = DMA_QUEUE.pick
