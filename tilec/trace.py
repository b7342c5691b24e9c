"""The instruction trace: the contract between the NKI interpreter (producer) and the performance model (consumer).

Neither side imports the other; both import this module. One `Instr` per executed ISA-level operation, in program
order. Memory regions are coarse bounding boxes, enough for true/anti/output dependence tracking:

    Access  = buffer id, buffer name, memory, partition range [p0, p1), byte range [lo, hi) within each partition
              (for HBM: byte range within the tensor's flat storage, p0 = 0, p1 = 1), and for SBUF/PSUM the
              innermost free stride in bytes (optional, 0 = unknown; the model's SBUF stride penalty reads it);
              for HBM optionally the exact access pattern (`pattern`)
    Instr   = seq, engine, op, shapes and dtypes, bytes moved, reads, writes, kernel file:line, attrs
    Alloc   = one on-chip or HBM buffer with its size per partition and the seq range during which it is live
    Trace   = kernel name, instrs, allocs, totals
"""
from __future__ import annotations

from dataclasses import dataclass, field

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")
MEMORIES = ("hbm", "sbuf", "psum")


@dataclass(frozen=True, slots=True)
class Access:
    buffer: int  # unique id of the allocation (stable within one trace)
    name: str  # the kernel's name for the buffer, for reports
    memory: str  # one of MEMORIES
    p0: int
    p1: int
    lo: int  # byte offsets within a partition (or within flat HBM storage)
    hi: int
    stride_bytes: int = 0  # SBUF/PSUM: innermost free-dimension stride of the access pattern in bytes (the last free
    #                        dimension with more than one element); 0 = unknown, broadcast, one element, or HBM
    pattern: tuple = ()  # HBM: the access pattern (itemsize, offset, shape, strides, storage dims) in elements, for
    #                      the model's optional per-pattern dependence rule (tilec/perf/deps.py); () = unknown


@dataclass(frozen=True, slots=True)
class Instr:
    seq: int
    engine: str  # one of ENGINES
    op: str  # e.g. "nc_matmul", "nc_transpose", "tensor_tensor", "tensor_scalar", "tensor_copy", "activation",
    #          "tensor_reduce", "memset", "iota", "affine_select", "dma_copy", "dma_transpose"
    partitions: int  # partitions touched by the output (DMA: partitions on the on-chip side, or rows for HBM->HBM)
    free: int  # elements per partition of the output (matmul: moving free size N)
    in_dtypes: tuple[str, ...]  # numpy dtype names of the inputs, e.g. ("float16", "float16")
    out_dtype: str
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    file: str = ""  # kernel source file and line of the call
    line: int = 0
    bytes: int = 0  # DMA: bytes moved; compute: 0
    dma_chunks: int = 0  # DMA: number of contiguous chunks (descriptor elements)
    dma_chunk_bytes: int = 0  # DMA: bytes of the typical (largest) contiguous chunk
    k: int = 0  # matmul: contraction partitions; transpose: input partitions
    m: int = 0  # matmul: stationary free size (output partitions)
    accumulate: bool = False  # matmul accumulating into PSUM (+=)
    attrs: tuple[tuple[str, object], ...] = ()  # extra facts, e.g. (("is_transpose", True), ("alu", "add"))

    def attr(self, key: str, default: object = None) -> object:
        for k, v in self.attrs:
            if k == key:
                return v
        return default


@dataclass(frozen=True, slots=True)
class Alloc:
    buffer: int
    name: str
    memory: str
    partitions: int
    bytes_per_partition: int  # HBM: total bytes
    first_seq: int  # seq of the first instruction issued after allocation
    last_seq: int  # seq of the last instruction that touches it (-1 if never touched)
    file: str = ""
    line: int = 0


@dataclass
class Trace:
    kernel: str
    instrs: list[Instr] = field(default_factory=list)
    allocs: list[Alloc] = field(default_factory=list)
    target: str = "trn2"
    skip_middle_end: bool = False  # kernel decorated with nki.compiler.skip_middle_end_transformations
