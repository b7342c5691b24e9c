"""Cost of one instruction in isolation: engine busy time of a compute instruction, engine occupancy of a DMA.

Compute instructions follow the cost table of nki-spec §2.4 (cycles, N = elements per partition), converted with the
engine's clock, plus a fixed per-instruction overhead:

    TensorE  nc_matmul     (max(min(64, N_stat), N_mov) + mm_fixed) * (fp32 factor if an input is fp32)
             nc_transpose  (max(P_in, min(64, F_in)) + mm_fixed) * (fp32 factor / transpose-mode speed-up)
             (an nc_matmul with is_transpose=True is a transpose: ARCH3 transpose mode, 2x for fp32 on NC-v3;
             one with is_stationary_onezero / is_moving_onezero: 2x for fp32, ISA1/ISA6 "could lead to 2x")
    VectorE  tensor_tensor max(64, 2N), max(64, N) with a PSUM input or all 16-bit (v3 perf mode)
             tensor_scalar / tensor_copy  max(64, N / perf)  perf = 4 (16-bit, SBUF only), 2 (16-bit, PSUM side)
             tensor_reduce N_in (N_in / 2 for bf16 -> bf16 add / max)
             memset max(64, N/2) for a 16-bit zero else max(64, N)
    ScalarE  activation    max(64, N) (+64 with a reduce result)
    GpSimdE  iota / affine_select 150 + N
    the less common VectorE instructions (tensor_copy_predicated, scalar_tensor_tensor, tensor_tensor_scan,
    bn_stats, bn_aggr) follow their NISA docstrings, see `_EXTRA_CYCLES`
    every compute instruction also pays the engine's static overhead (ARCH2: ~100 cycles, fitted)

SBUF stride penalty (spec §2.2, ARCH2, documented for v2, applied to v3 as well [inferred]): an instruction with an
SBUF operand (read or written) whose innermost free stride exceeds 16 bytes (`Access.stride_bytes`, filled by the
interpreter) streams at half the interface bandwidth: its N (N_in for reductions) counts twice before the MIN_II
maximum, the static overhead does not. PSUM operands are not penalized (the row is about SBUF). On TensorE only the
moving operand streams through the interface per instruction (the stationary one loads in the background): a matmul
or transpose whose moving operand is strided pays it on its streamed columns [inferred for TensorE]. The same stride
decides v3 performance mode (ARCH3): a 16-bit VectorE copy/tensor_scalar gets 4x only when contiguous, else 2x.

A DMA transfer is split over ceil(P/8) of the 16 DMA engines (the engines of the partitions it touches); on each
engine it occupies `hypot(fixed + descriptors * per_descriptor, bytes / 23 B/ns)`: the descriptor part dominates
small transfers, the byte part large ones. The fixed part is 0 on trn2: the DMAINTRO efficiency-vs-bytes curve of
spec §2.5 (1.8 % of 23 B/ns at 32 B per partition, 21 % at 512 B) describes one transfer at a time, latency
included; the public conv behind calibration rows 9-12 keeps many in flight and moves 448 B rows far faster, so the
latency is modelled as such (schedule.py), not as engine time.
"""
from __future__ import annotations

import math

from tilec.perf.params import Params
from tilec.trace import Access, Instr

DTYPE_BYTES = {"float32": 4, "float32r": 4, "int32": 4, "uint32": 4, "float16": 2, "bfloat16": 2, "int16": 2,
               "uint16": 2, "int8": 1, "uint8": 1, "float8_e4m3": 1, "float8_e5m2": 1, "float8_e3m4": 1, "bool": 1,
               "float64": 8, "int64": 8}
HALF = frozenset(("float16", "bfloat16"))
FP32 = frozenset(("float32",))


class Costs:
    """Plain-float view of a `Params` table with the per-instruction cost functions (hot path: no lookups)."""

    def __init__(self, p: Params) -> None:
        self.p = p
        v = {name: value for name, value, _ in p.table()}
        self.t_ns = 1.0 / v["tensor_ghz"]
        self.engine_ns = {"tensor": self.t_ns, "vector": 1.0 / v["vector_ghz"], "scalar": 1.0 / v["scalar_ghz"],
                          "gpsimd": 1.0 / v["gpsimd_ghz"]}
        self.static = {"tensor": 0.0, "vector": v["vector_static_cycles"], "scalar": v["scalar_static_cycles"],
                       "gpsimd": v["gpsimd_static_cycles"]}
        self.mm_min = v["mm_min_cycles"]
        self.mm_fixed = v["mm_fixed_cycles"]
        self.fp32 = v["mm_fp32_factor"]
        self.fp32_transpose = v["mm_fp32_factor"] / v["transpose_fp32_speedup"]
        self.fp32_onezero = v["mm_fp32_factor"] / v["onezero_fp32_speedup"]
        self.min_ii = v["min_ii_cycles"]
        self.iota = v["gpsimd_iota_cycles"]
        self.pm_copy = v["perf_mode_copy"]
        self.pm_half = v["perf_mode_half"]
        self.stride_limit = v["sbuf_stride_limit_bytes"]
        self.stride_factor = v["sbuf_stride_factor"]
        self.throttle = (v["throttle_start_fraction"], v["throttle_ramp_ns"], v["throttle_window_ns"],
                         v["throttle_min_utilization"])
        self.n_dma = int(v["dma_engines"])
        self.ppe = int(v["dma_partitions_per_engine"])
        self.dma_bw = v["dma_engine_bw"]
        self.dma_fixed = v["dma_xfer_fixed_ns"]
        self.hbm_bw = v["hbm_core_bw"]
        self.load_versions = int(v["load_versions"])
        self.sbuf_usable = int(v["sbuf_usable_bytes"])
        self.psum_bank = int(v["psum_bank_bytes"])
        self.psum_banks = int(v["psum_bytes_per_partition"]) // self.psum_bank
        self.dma_desc = v["dma_desc_ns"]
        self.dma_latency = v["dma_latency_ns"]
        self.dma_write_ack = v["dma_write_ack_ns"]
        self.hwdge_issue = v["hwdge_issue_ns"]
        self.dma_transpose = v["dma_transpose_factor"]
        self.dma_transpose_sbuf = v["dma_transpose_sbuf_factor"]
        self.startup = v["startup_ns"]
        self.rotation = int(v["buffer_rotation"])

    # ---- compute engines -----------------------------------------------------------------------------------------

    def compute_ns(self, ins: Instr) -> float:
        """Busy time of a compute instruction on its engine."""
        engine = ins.engine
        if engine == "tensor":
            return self.tensor_cycles(ins) * self.t_ns
        cycles = self.engine_cycles(ins) + self.static.get(engine, 0.0)
        return cycles * self.engine_ns.get(engine, self.engine_ns["vector"])

    def tensor_cycles(self, ins: Instr) -> float:
        if ins.op == "nc_transpose":
            p_in = ins.k or ins.free
            stream = max(p_in, min(self.mm_min, ins.partitions))
        else:
            stream = max(min(self.mm_min, ins.m or ins.partitions), ins.free)
        mov = moving(ins)
        if mov is not None and mov.memory == "sbuf" and mov.stride_bytes > self.stride_limit:
            stream *= self.stride_factor  # ARCH2 stride penalty on the moving stream [inferred for TensorE]
        factor = 1.0
        if any(d in FP32 for d in ins.in_dtypes):
            # ARCH3: nc_transpose on TensorE and nc_matmul(is_transpose=True) run in transpose mode on NC-v3
            transpose = ins.op == "nc_transpose" or bool(ins.attr("is_transpose"))
            factor = self.fp32_transpose if transpose else self.fp32_onezero if ins.attr("onezero") else self.fp32
        return (stream + self.mm_fixed) * factor

    def engine_cycles(self, ins: Instr) -> float:
        op, mn = ins.op, self.min_ii
        half = all(d in HALF for d in ins.in_dtypes) and ins.out_dtype in HALF
        psum = any(a.memory == "psum" for a in ins.reads) or any(a.memory == "psum" for a in ins.writes)
        vector = ins.engine == "vector"
        stride = max_sbuf_stride(ins)
        slow = self.stride_factor if stride > self.stride_limit else 1.0  # ARCH2 stride penalty: streaming part
        n = ins.free * slow
        if op in ("iota", "affine_select") and ins.engine == "gpsimd":
            return self.iota + n
        if op == "tensor_tensor":  # spec §1.10.4: the 1x rate needs a PSUM *input*; writing PSUM does not count
            fast = vector and (any(a.memory == "psum" for a in ins.reads) or half)
            return max(mn, n if fast else 2 * n)
        if op in ("tensor_scalar", "tensor_copy"):
            perf = 1.0
            # the streamed data and the output decide (ARCH3); a (P, 1) operand is one value per partition, not a
            # stream, and fp32 by the API's rule [ISA6 tensor_scalar], so it does not turn the mode off
            half = bool(ins.in_dtypes) and ins.in_dtypes[0] in HALF and ins.out_dtype in HALF
            if vector and half:  # ARCH3: 4x needs SBUF on both sides and a contiguous innermost dim, else 2x
                contiguous = stride <= itemsize(ins.out_dtype)
                perf = self.pm_half if psum or not contiguous else self.pm_copy
            return max(mn, n / perf)
        if op == "tensor_reduce":  # nki-spec §2.4 [NISA tensor_reduce]: N/2 for bf16 -> bf16 add and max only
            n_in = in_free(ins) * slow
            fast = ins.in_dtypes[:1] == ("bfloat16",) and ins.out_dtype == "bfloat16" and \
                ins.attr("alu") in ("add", "max", "maximum")
            return n_in / 2 if fast else n_in
        if op == "tensor_scalar_reduce":
            return max(mn, n) + mn
        if op == "memset":  # nki-spec §2.4 [NISA memset]: the half rate is for a value of 0 in bf16/fp16 only
            return max(mn, n / 2) if half and ins.attr("value", 0.0) == 0 else max(mn, n)
        if op == "activation":
            return max(mn, n) + (mn if ins.attr("reduce") else 0)
        if op in _EXTRA_CYCLES:
            return _EXTRA_CYCLES[op](ins, n, in_free(ins) * slow, mn)
        if op == "nc_transpose":  # on VectorE: 32x32 blocks
            return max(mn, n)
        return max(mn, n)  # also tensor_partition_reduce on GpSimdE: NISA gives no cost for it

    def gpsimd_bus(self, ins: Instr) -> bool:
        """A VectorE instruction in NC-v3 performance mode, which borrows GpSimdE's SBUF bus (ARCH3): a 16-bit
        tensor_copy or tensor_scalar (4x, or 2x with a PSUM side or a strided innermost dim), a tensor_tensor whose
        inputs are in SBUF and whose data are all 16-bit (2x). Used by the "exclusive" bus rule (params.py)."""
        if ins.engine != "vector" or self.pm_copy <= 1:
            return False
        if ins.op in ("tensor_scalar", "tensor_copy"):
            return bool(ins.in_dtypes) and ins.in_dtypes[0] in HALF and ins.out_dtype in HALF
        if ins.op == "tensor_tensor":
            return all(d in HALF for d in ins.in_dtypes) and ins.out_dtype in HALF and \
                all(a.memory == "sbuf" for a in ins.reads)
        return False

    # ---- DMA -------------------------------------------------------------------------------------------------------

    def dma_engines(self, ins: Instr) -> tuple[int, int]:
        """[first, last) DMA engines: the engines serving the on-chip partitions (8 partitions each)."""
        for acc in ins.writes + ins.reads:
            if acc.memory != "hbm":
                e0 = min(acc.p0 // self.ppe, self.n_dma - 1)
                e1 = min(max((acc.p1 - 1) // self.ppe + 1, e0 + 1), self.n_dma)
                return e0, e1
        rows = max(1, ins.partitions)  # HBM -> HBM: rows spread from engine 0
        return 0, min(self.n_dma, -(-rows // self.ppe))

    def dma_transfer_ns(self, descriptors: int, nbytes: float, n_engines: int) -> float:
        """Time each of a transfer's `n_engines` DMA engines is busy with its share of `descriptors` and `nbytes`
        (the compiler's estimates call this too: build_conv.dma_engine_ns, rules_global's chunk costs)."""
        return math.hypot(self.dma_fixed + -(-descriptors // n_engines) * self.dma_desc,
                          nbytes / n_engines / self.dma_bw)

    def hbm_ns(self, ins: Instr) -> float:
        """The transfer's share of the core's HBM bandwidth, in ns at the whole of it: a byte crosses HBM once per
        HBM side (twice HBM -> HBM: a read and a write) [nki-spec §2.1/§6 HBM cap per core]. The schedule keeps
        the DMAs' HBM time on one lane, so concurrent transfers share the cap (schedule.schedule)."""
        sides = any(a.memory == "hbm" for a in ins.reads) + any(a.memory == "hbm" for a in ins.writes)
        return sides * ins.bytes / self.hbm_bw

    def dma_occupancy_ns(self, ins: Instr, n_engines: int) -> float:
        """Time each of the transfer's engines is busy with it."""
        t = self.dma_transfer_ns(max(ins.dma_chunks, ins.partitions, 1), ins.bytes, n_engines)
        if ins.op == "dma_transpose":  # ARCH3: a share of a copy's throughput, lower SBUF -> SBUF than from HBM
            on_chip = all(a.memory != "hbm" for a in ins.reads + ins.writes)
            t /= self.dma_transpose_sbuf if on_chip else self.dma_transpose
        return t


def moving(ins: Instr) -> Access | None:
    """The operand a TensorE instruction streams column by column: the moving one of a matmul (its second read),
    the input of a transpose."""
    reads = ins.reads
    if ins.op == "nc_matmul":
        return reads[1] if len(reads) > 1 else None
    return reads[0] if reads else None


def max_sbuf_stride(ins: Instr) -> int:
    """Largest innermost free stride in bytes among the instruction's SBUF operands (0: contiguous or unknown)."""
    stride = 0
    for a in ins.reads + ins.writes:
        if a.memory == "sbuf" and a.stride_bytes > stride:
            stride = a.stride_bytes
    return stride


def itemsize(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 4)


def in_free(ins: Instr) -> int:
    """Elements per partition of the first input (reductions cost by their input, not their output)."""
    n = ins.attr("in_free")
    if isinstance(n, int) and n > 0:
        return n
    for acc in ins.reads:
        if acc.memory != "hbm" and ins.in_dtypes:
            return max(1, (acc.hi - acc.lo) // itemsize(ins.in_dtypes[0]))
    return ins.free


# ---- the less common VectorE instructions: (instr, N streamed, N_in streamed, MIN_II) -> cycles [NISA v2.26.1] ----
def _copy_predicated(ins: Instr, n: float, n_in: float, mn: float) -> float:
    """spec §2.4: max(64, N) when src or predicate comes from PSUM, max(64, 2N) when all are in SBUF."""
    return max(mn, n if any(a.memory == "psum" for a in ins.reads) else 2 * n)


def _scalar_tensor_tensor(ins: Instr, n: float, n_in: float, mn: float) -> float:
    """NISA: N when data and operand1 (first and last inputs) are bf16, op0 subtract, op1 multiply and N even;
    else 2N (the docstring gives no MIN_II floor)."""
    fast = ins.in_dtypes[0] == ins.in_dtypes[-1] == "bfloat16" and ins.attr("alu") == ("subtract", "multiply") \
        and ins.free % 2 == 0
    return n if fast else 2 * n


def _scan(ins: Instr, n: float, n_in: float, mn: float) -> float:
    """NISA tensor_tensor_scan: max(MIN_II, 2N)."""
    return max(mn, 2 * n)


def _bn_stats(ins: Instr, n: float, n_in: float, mn: float) -> float:
    """NISA bn_stats: max(MIN_II, N), N the input elements per partition (the output has 6)."""
    return max(mn, n_in)


def _bn_aggr(ins: Instr, n: float, n_in: float, mn: float) -> float:
    """NISA bn_aggr: max(MIN_II, 13 * (N / 3)), N the input elements per partition (3 per aggregated group)."""
    return max(mn, 13 * n_in / 3)


_EXTRA_CYCLES = {"tensor_copy_predicated": _copy_predicated, "scalar_tensor_tensor": _scalar_tensor_tensor,
                 "tensor_tensor_scan": _scan, "bn_stats": _bn_stats, "bn_aggr": _bn_aggr}
