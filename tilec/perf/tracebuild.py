"""A small builder of hand-made traces, for tests and for reasoning about the model without the interpreter.

    b = TraceBuilder("k")
    x = b.buffer("x", "hbm", 1, 4096)
    t = b.buffer("t", "sbuf", 128, 32)
    b.dma(dst=b.at(t), src=b.at(x), partitions=128, nbytes=4096, line=3)
    b.compute("vector", "tensor_scalar", reads=[b.at(t)], writes=[b.at(t)], partitions=128, free=8)
    trace = b.trace
"""
from __future__ import annotations

from tilec.trace import Access, Alloc, Instr, Trace


class TraceBuilder:
    def __init__(self, kernel: str, file: str = "kernel.py") -> None:
        self.trace = Trace(kernel)
        self.file = file
        self.sizes: dict[int, tuple[str, str, int, int]] = {}
        self.alloc_index: dict[int, int] = {}

    def buffer(self, name: str, memory: str, partitions: int, bytes_per_partition: int) -> int:
        buf = len(self.sizes) + 1
        self.sizes[buf] = (name, memory, partitions, bytes_per_partition)
        seq = len(self.trace.instrs)
        self.alloc_index[buf] = len(self.trace.allocs)
        self.trace.allocs.append(Alloc(buf, name, memory, partitions, bytes_per_partition, seq, -1))
        return buf

    def at(self, buf: int, p0: int = 0, p1: int | None = None, lo: int = 0, hi: int | None = None,
           stride_bytes: int = 0) -> Access:
        name, memory, partitions, bpp = self.sizes[buf]
        if memory == "hbm":
            return Access(buf, name, memory, 0, 1, lo, bpp if hi is None else hi)
        return Access(buf, name, memory, p0, partitions if p1 is None else p1, lo, bpp if hi is None else hi,
                      stride_bytes)

    def _add(self, **kw) -> Instr:
        ins = Instr(seq=len(self.trace.instrs), file=self.file, **kw)
        self.trace.instrs.append(ins)
        for acc in ins.reads + ins.writes:
            self._touch(acc.buffer, ins.seq)
        return ins

    def _touch(self, buf: int, seq: int) -> None:
        i = self.alloc_index[buf]
        a = self.trace.allocs[i]
        self.trace.allocs[i] = Alloc(a.buffer, a.name, a.memory, a.partitions, a.bytes_per_partition, a.first_seq, seq)

    def dma(self, dst: Access, src: Access, partitions: int, nbytes: int, line: int, chunks: int = 0,
            dtype: str = "float32", op: str = "dma_copy", attrs: tuple = ()) -> Instr:
        return self._add(engine="dma", op=op, partitions=partitions, free=0, in_dtypes=(dtype,), out_dtype=dtype,
                         reads=(src,), writes=(dst,), line=line, bytes=nbytes, dma_chunks=chunks or partitions,
                         dma_chunk_bytes=nbytes // max(1, chunks or partitions), attrs=attrs)

    def compute(self, engine: str, op: str, reads: list[Access], writes: list[Access], partitions: int, free: int,
                line: int = 0, dtypes: tuple[str, ...] = ("float32",), out_dtype: str = "float32", k: int = 0,
                m: int = 0, accumulate: bool = False, attrs: tuple = ()) -> Instr:
        return self._add(engine=engine, op=op, partitions=partitions, free=free, in_dtypes=dtypes,
                         out_dtype=out_dtype, reads=tuple(reads), writes=tuple(writes), line=line, k=k, m=m,
                         accumulate=accumulate, attrs=attrs)
