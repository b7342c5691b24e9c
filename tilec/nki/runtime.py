"""The state of one kernel execution: buffers, loop frames, on-chip capacity accounting, the trace being recorded.

One `Run` is active while a kernel executes (`current()`); every NKI API call finds it there. Loops opened with
`nl.affine_range`/`sequential_range`/`static_range` push a `Frame`; a buffer allocated inside a loop body dies at
the end of that iteration (its PSUM bank and SBUF bytes are freed, later use is an out-of-scope error). A buffer
also dies when Python drops the last reference to it, which models rebinding a name inside a plain `range` loop.
"""
from __future__ import annotations

import itertools
import math
import os
import sys
import weakref
from dataclasses import dataclass, field

import numpy as np

from tilec.nki import rules
from tilec.trace import Alloc, Instr, Trace

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_RUN: "Run | None" = None
_loop_ids = itertools.count(1)


def current() -> "Run":
    if _RUN is None:
        raise rules.NkiError("NKI API called outside of an NKI kernel", "err_nki_api_outside_of_nki_kernel",
                             callsite(), hint="call it from a function decorated with @nki.jit")
    return _RUN


def active() -> "Run | None":
    return _RUN


def callsite() -> tuple[str, int]:
    """file:line of the innermost frame outside tilec.nki: the kernel line that made the API call."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
        f = f.f_back
    if f is None:
        return ("<unknown>", 0)
    return (f.f_code.co_filename, f.f_lineno)


class Buffer:
    """One allocation: storage in its dtype plus a mask of which elements were ever written."""

    __slots__ = ("id", "name", "memory", "shape", "dtype", "data", "written", "pstride", "itemsize", "alive",
                 "all_written", "write_count", "f32", "mask", "scope", "temp", "raw", "instr", "bpp", "run", "where",
                 "direct", "result_of", "__weakref__")

    def __init__(self, run: "Run", name: str, memory: str, data: np.ndarray, written: bool,
                 where: tuple[str, int]) -> None:
        self.id = run.new_id()
        self.run, self.name, self.memory, self.where = run, name, memory, where
        self.data, self.shape, self.dtype = data, data.shape, data.dtype
        self.itemsize = data.dtype.itemsize
        # which elements were ever written, consulted only while all_written is False (it never turns back): a
        # buffer born written (an argument, a fresh result) needs no mask; np.zeros maps pages only when touched
        self.written = None if written else np.zeros(data.size, dtype=bool)
        self.all_written = written
        self.write_count = 0  # elements written so far, counting repeats: when it reaches the size, re-check
        self.mask = None  # elements a masked instruction computed (the rest stay unwritten)
        self.f32 = None  # fp32 shadow of a low-precision on-chip buffer (core.f32)
        self.pstride = math.prod(data.shape[1:]) if memory != "hbm" else data.size
        self.bpp = self.pstride * self.itemsize  # bytes per partition (HBM: total bytes)
        self.alive = True
        self.scope = run.affine_ids()  # affine loops enclosing the allocation: its accesses are private to them
        self.temp = False  # an instruction's fresh result, not yet bound to a name
        self.raw = None  # fp32 engine result of a fresh temp, so a later `dst[...] = temp` rounds only once
        self.instr = -1  # index of the instruction that produced a temp
        self.direct = False  # placed by the kernel (nki.compiler.sbuf/psum allocation), not by the compiler
        self.result_of = ""  # the instruction whose result tile this is, where the compiler placed it

    @property
    def partitions(self) -> int:
        return self.shape[0] if self.memory != "hbm" else 1

    def __del__(self) -> None:
        run = self.run
        if self.alive and run is not None and run.running:
            run.release(self)


@dataclass(eq=False)  # compared by identity: `frame in run.frames` ran the field-wise __eq__ on every loop exit
class Frame:
    kind: str  # "affine" | "sequential" | "static"
    id: int
    trip: int
    where: tuple[str, int]
    iteration: int = -1
    allocs: list = field(default_factory=list)  # weakrefs of buffers allocated in the current iteration
    log: object = None  # races.AccessLog for affine loops


@dataclass
class BufInfo:
    id: int
    name: str
    memory: str
    partitions: int
    bpp: int
    first_seq: int
    where: tuple[str, int]
    last_seq: int = -1
    committed: bool = True


class Run:
    """One kernel execution."""

    def __init__(self, kernel: str, target: str, skip_middle_end: bool, numerics: bool = True) -> None:
        self.target = rules.target(target)
        self.numerics = numerics  # False: a trace-only run, arithmetic skipped (core.compute)
        self.strict = False  # True under an API newer than 0.1: what later releases forbid is an error, not a warning
        self.simulation = False  # run as AWS's 0.1 simulator would (mode="simulation", nki.simulate_kernel)
        self.warned: set = set()  # (kernel line, rule) already warned about in this run (rules.later_release)
        self.trace = Trace(kernel=kernel, target=target, skip_middle_end=skip_middle_end)
        self.instrs: list[Instr] = self.trace.instrs
        self.infos: dict[int, BufInfo] = {}
        self.frames: list[Frame] = []
        self.pending: list[Buffer] = []  # fresh instruction results, not yet known to be kept
        self.psum_live: dict[int, str] = {}
        self.psum_bank_count: dict[int, int] = {}  # PSUM buffer -> banks it occupies, where more than one (blocks)
        self.sbuf_live: dict[int, int] = {}
        self.sbuf_used = 0
        self.running = True
        self.program_ids: tuple[int, ...] = ()
        self.grid: tuple[int, ...] = ()
        self.shared: list = []  # shared_hbm tensors in creation order, reused by every SPMD instance
        self.shared_next = 0
        # VectorE accumulator registers (select_reduce): whether a reset made their state defined (known in
        # trace-only runs too), and their values (a full run only)
        self.vector_acc_defined = False
        self.vector_acc: np.ndarray | None = None
        # buffers whose values a trace-only run knows: index arithmetic (an iota's tile) is computed in every run,
        # so an indirect DMA whose rows an iota names has the same trace with and without numerics
        self.known: set[int] = set()
        self._ids = itertools.count()

    def new_id(self) -> int:
        return next(self._ids)

    def affine_ids(self) -> tuple[int, ...]:
        return tuple(f.id for f in self.frames if f.kind == "affine")

    # ---- allocation and capacity ----
    def allocate(self, buf: Buffer, temp: bool = False) -> None:
        """Register a new buffer; temps are committed (counted) only if the kernel keeps them."""
        self.flush()
        if self.frames:
            self.frames[-1].allocs.append(weakref.ref(buf))
        if temp:
            buf.temp = True
            self.pending.append(buf)
            self.infos[buf.id] = self._info(buf, committed=False)
            return
        self.infos[buf.id] = self._info(buf, committed=True)
        self._charge(buf)

    def _info(self, buf: Buffer, committed: bool) -> BufInfo:
        return BufInfo(buf.id, buf.name, buf.memory, buf.partitions, buf.bpp, len(self.instrs), buf.where,
                       committed=committed)

    def flush(self) -> None:
        """Commit fresh results that survived to the next API call: they now occupy memory."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        for buf in pending:
            if buf.alive and buf.temp:
                buf.temp = False
                buf.raw = None
                self.infos[buf.id].committed = True
                self._charge(buf)

    def discard(self, buf: Buffer) -> None:
        """A fresh result was written straight into its destination: it never existed on the device."""
        buf.alive = False
        buf.temp = False
        buf.raw = None
        self.infos.pop(buf.id, None)
        if buf in self.pending:
            self.pending.remove(buf)

    def _charge(self, buf: Buffer) -> None:
        from tilec.nki import checks  # checks imports runtime; keep the cycle out of module import

        if buf.memory == "psum":
            checks.psum_capacity(self, buf)
            self.psum_live[buf.id] = buf.name
        elif buf.memory == "sbuf":
            checks.sbuf_capacity(self, buf)
            self.sbuf_live[buf.id] = buf.bpp
            self.sbuf_used += buf.bpp

    def release(self, buf: Buffer) -> None:
        buf.alive = False
        self.psum_live.pop(buf.id, None)
        self.psum_bank_count.pop(buf.id, None)
        self.sbuf_used -= self.sbuf_live.pop(buf.id, 0)

    # ---- loops ----
    def enter_loop(self, kind: str, trip: int) -> Frame:
        from tilec.nki import races

        self.flush()
        frame = Frame(kind, next(_loop_ids), trip, callsite())
        if kind == "affine":
            frame.log = races.AccessLog(frame)
        self.frames.append(frame)
        return frame

    def begin_iteration(self, frame: Frame, i: int) -> None:
        frame.iteration = i
        if frame.log is not None:
            frame.log.iteration = i

    def end_iteration(self, frame: Frame) -> None:
        self.flush()
        allocs, frame.allocs = frame.allocs, []
        for ref in allocs:
            buf = ref()
            if buf is not None and buf.alive:
                self.release(buf)

    def exit_loop(self, frame: Frame, check: bool = True) -> None:
        from tilec.nki import races

        if frame.allocs:
            self.end_iteration(frame)
        if frame in self.frames:
            self.frames.remove(frame)
        if frame.log is not None and check and self.running:
            races.close(self, frame)

    def parent_log(self, frame: Frame):
        for f in reversed(self.frames):
            if f.kind == "affine" and f is not frame:
                return f.log
        return None

    def cur_log(self):
        for f in reversed(self.frames):
            if f.kind == "affine":
                return f.log
        return None

    # ---- finishing ----
    def finish(self) -> Trace:
        self.flush()
        self.running = False
        self.trace.allocs = [Alloc(i.id, i.name, i.memory, i.partitions, i.bpp, i.first_seq, i.last_seq,
                                   i.where[0], i.where[1]) for i in self.infos.values() if i.committed]
        return self.trace


def activate(run: "Run | None") -> "Run | None":
    global _RUN
    prev, _RUN = _RUN, run
    return prev


class _Loop:
    """Iterable returned by nl.affine_range & co.: yields plain ints, brackets each iteration."""

    def __init__(self, kind: str, args: tuple) -> None:
        self.kind = kind
        self.range = range(*[int(a) for a in args])

    def __len__(self) -> int:
        return len(self.range)

    def __iter__(self):
        run = current()
        frame = run.enter_loop(self.kind, len(self.range))
        try:
            for i in self.range:
                run.begin_iteration(frame, i)
                yield i
                run.end_iteration(frame)
        except GeneratorExit:  # `break`, or the body raised: no dependence check on a partial loop
            run.exit_loop(frame, check=False)
            raise
        run.exit_loop(frame)


def affine_range(*args: int, **kwargs: object) -> _Loop:
    return _Loop("affine", args)


def sequential_range(*args: int, **kwargs: object) -> _Loop:
    return _Loop("sequential", args)


def static_range(*args: int, **kwargs: object) -> _Loop:
    return _Loop("static", args)
