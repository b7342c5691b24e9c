"""The instruction machinery shared by nki.isa and nki.language: checked reads and writes, fresh results,
instruction records, assignment (`dst[...] = value`) and PSUM accumulation (`acc += nc_matmul(...)`).

Every API call goes: `begin()` (commit results the kernel kept) -> operand checks -> `read()` each operand (scope,
never-written memory, dependence log) -> `compute()` the values in fp32 with numpy -> `result()` (a fresh tile of a
declared shape, rounded to its dtype on store) -> `emit()` the trace record. A fresh result assigned or `+=`-ed
straight into a destination is written there instead (the instruction is retargeted, as the NKI compiler does), so
it costs no extra copy and no memory.

Trace-only runs (`Run.numerics` False, `simulate_traced(..., numerics=False)`): `compute()` is the one place that
decides; it skips the arithmetic step of every instruction and returns None, and the storing functions below treat
None as "no values to store". Everything else (checks, written-element tracking, dependence logs, capacity, the
trace) runs unchanged, so the trace and the errors are those of a full run; the values in tiles and outputs are
unspecified. What needs tensor values to decide addresses or control (indirect DMA) calls `needs_values()`, which
refuses to run trace-only.
"""
from __future__ import annotations

import dataclasses
import linecache
import re
from typing import Callable, TypeVar

import ml_dtypes
import numpy as np

from tilec.nki import checks, races, recorder, rules, runtime
from tilec.nki.runtime import Buffer, Run
from tilec.errors import InternalError
from tilec.nki.tensor import Tensor
from tilec.trace import Instr

T = TypeVar("T")

F32 = np.dtype(np.float32)
_LOW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3),
               np.dtype(ml_dtypes.float8_e5m2))
_DT_NAMES: dict[np.dtype, str] = {}
_NAME_RE = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=[^=]")
_names: dict[tuple[str, int], str] = {}


def dtype_name(dt: np.dtype) -> str:
    """numpy's dtype.name is slow (it is computed each time); the trace asks for it on every instruction."""
    name = _DT_NAMES.get(dt)
    if name is None:
        name = _DT_NAMES[dt] = dt.name
    return name


def begin() -> tuple[Run, tuple[str, int]]:
    run = runtime.current()
    run.flush()
    return run, runtime.callsite()


def target_name(where: tuple[str, int], default: str) -> str:
    """The variable a kernel line assigns to (`a_tile = nl.ndarray(...)` -> 'a_tile'): names buffers in reports."""
    name = _names.get(where)
    if name is None:
        m = _NAME_RE.match(linecache.getline(where[0], where[1]))
        name = _names[where] = m.group(1) if m else ""
    return name or default


# ---- the numerics switch ----
def compute(run: Run, step: Callable[[], T]) -> T | None:
    """Run an instruction's arithmetic step, or skip it in a trace-only run (None: values unspecified)."""
    return step() if run.numerics else None


def needs_values(run: Run, what: str, where: tuple[str, int]) -> None:
    """Tensor values decide addresses or control here: a trace-only run cannot know its trace, so it stops."""
    if not run.numerics:
        raise rules.NkiError(f"{what} depends on tensor values, which a trace-only run (numerics=False) does not "
                             "compute", "trace_only_needs_values", where,
                             hint="run this kernel with numerics=True (the default)")


# ---- reads and writes ----
def read(run: Run, t: Tensor, where: tuple[str, int], log_it: bool = True, mask: np.ndarray | None = None) -> None:
    """Check a read of `t` (scope, never-written elements) and log it for the dependence check. The values are
    fetched separately, inside an instruction's compute step, with `values()` or `f32()`."""
    buf = t.buf
    if not buf.alive:
        checks.dead(t, where)
    if t.oob is not None:
        _check_outside(t, where, mask)
    elif not buf.all_written and not buf.direct:
        # (a tile the kernel placed itself, nki.compiler.sbuf/psum allocation, sits at addresses the kernel reuses
        # on purpose: reading what it never wrote there gets the stale bytes, not a compile error [ALLOC Lifetime
        # Conflicts]. The values are unknown: NaN here, visible wherever they reach an output)
        w = t.written_view()
        if mask is not None:
            w = w | ~mask  # masked-off elements are not read
        if not w.all():
            checks.unwritten(t, w, where)
        if t.size == buf.data.size and 0 not in t.strides:
            buf.all_written = True
    if log_it:
        log = run.cur_log()
        if log is not None and log.frame.id not in buf.scope:  # (views leaving the tensor are not logged)
            log.add(buf, t.off, t.shape, t.strides, races.READ, where)


def values(t: Tensor, mask: np.ndarray | None = None) -> np.ndarray:
    """The elements of a view read() checked, in its dtype (for a view leaving the tensor: those under mask)."""
    if t.oob is not None:
        return t.buf.data.reshape(-1)[np.where(mask, _flat(t), 0)]
    return t.arr


def write(run: Run, t: Tensor, value: object, where: tuple[str, int], kind: int = races.WRITE,
          mask: np.ndarray | None = None) -> None:
    """Store `value` (None in a trace-only run: nothing to store) and mark the elements written."""
    buf = t.buf
    if not buf.alive:
        checks.dead(t, where)
    buf.f32 = None
    if buf.memory == "psum":
        flags = matmul_flags(run, t, create=False)
        if flags is not None:
            flags[...] = False  # (a matmul that wrote this sets the flags again after its write: isa06.nc_matmul)
    if value is None:
        run.known.discard(buf.id)  # (a trace-only write: the values are no longer known)
    if t.oob is not None:
        _write_outside(t, value, where, mask)
        return
    if value is not None:
        _store(t.arr, value, mask)
    if not buf.all_written:
        if mask is None and t.off == 0 and t.size == buf.data.size and 0 not in t.strides:
            buf.all_written = True  # the whole buffer in one write (e.g. a DMA into a fresh tile)
        elif mask is None:
            t.written_view()[...] = True
            buf.write_count += t.size
            if buf.write_count >= buf.data.size and buf.written.all():
                buf.all_written = True
        else:
            np.copyto(t.written_view(), True, where=mask)
    log = run.cur_log()
    if log is not None and log.frame.id not in buf.scope:
        log.add(buf, t.off, t.shape, t.strides, kind, where)


def matmul_flags(run: Run, t: Tensor, create: bool = True) -> np.ndarray | None:
    """NKI 0.6: the view of t in its PSUM buffer's "last written by a matmul" flags (None: not a 0.6 run, not PSUM,
    or never flagged). Accumulating onto PSUM a non-matmul instruction wrote is undefined behaviour on NeuronCore-v2
    and -v3 [ISA6 nc_matmul accumulate=], so every write clears them (write) and a matmul's write sets them."""
    table = getattr(run, "matmul_written", None)
    if table is None or t.buf.memory != "psum":
        return None
    flat = table.get(t.buf.id)
    if flat is None:
        if not create:
            return None
        flat = table[t.buf.id] = np.zeros(t.buf.data.size, dtype=bool)
    return np.ndarray(t.shape, np.bool_, buffer=flat, offset=t.off, strides=t.strides)


def _store(dst: np.ndarray, value: object, mask: np.ndarray | None) -> None:
    if mask is None:
        np.copyto(dst, value, casting="unsafe")
    else:
        np.copyto(dst, value, casting="unsafe", where=mask)


# ---- views whose index leaves the tensor: only the elements selected by mask= exist ----
def _flat(t: Tensor) -> np.ndarray:
    idx = np.full((1,) * len(t.shape), t.off, dtype=np.int64)
    for d, (n, s) in enumerate(zip(t.shape, t.strides)):
        shape = [1] * len(t.shape)
        shape[d] = n
        idx = idx + s * np.arange(n, dtype=np.int64).reshape(shape)
    return np.broadcast_to(idx, t.shape)


def _outside_mask(t: Tensor, where: tuple[str, int], mask: np.ndarray | None) -> np.ndarray:
    valid, error = t.oob
    if mask is None or (mask & ~valid).any():
        raise rules.NkiIndexError(error.message, error.rule, where, error.detail,
                                  hint="indices outside the tensor need a mask= that excludes them")
    return mask


def _check_outside(t: Tensor, where: tuple[str, int], mask: np.ndarray | None) -> None:
    mask = _outside_mask(t, where, mask)
    flat = np.where(mask, _flat(t), 0)
    if not t.buf.all_written and not t.buf.written[flat[mask]].all():
        checks.unwritten(t, t.buf.written[flat] | ~mask, where)


def _write_outside(t: Tensor, value: object, where: tuple[str, int], mask: np.ndarray | None) -> None:
    mask = _outside_mask(t, where, mask)
    flat = _flat(t)[mask]
    if value is not None:
        src = np.broadcast_to(np.asarray(value), t.shape)[mask]
        dst = t.buf.data.reshape(-1)
        tmp = np.empty(src.shape, dst.dtype)
        np.copyto(tmp, src, casting="unsafe")
        dst[flat] = tmp
    if not t.buf.all_written:
        t.buf.written[flat] = True


def f32(t: Tensor, mask: np.ndarray | None = None) -> np.ndarray:
    """An operand read() checked, as the engines see it: fp32. On-chip low-precision buffers keep an fp32 shadow
    copy, rebuilt after a write, so operands read many times (weights, input rows) are converted once."""
    a = values(t, mask)
    if a.dtype == F32:
        return a
    buf = t.buf
    if t.oob is not None or buf.memory == "hbm" or a.dtype not in _LOW_FLOATS:
        return a.astype(F32)
    shadow = buf.f32
    if shadow is None:
        shadow = buf.f32 = buf.data.astype(F32)
    return np.ndarray(t.shape, F32, buffer=shadow, offset=t.off * 4, strides=tuple(x * 4 for x in t.strides))


# ---- allocation ----
def allocate(run: Run, shape: tuple, dtype: np.dtype, memory: str, name: str, where: tuple[str, int],
             fill: object = None, temp: bool = False, pdim: int = 0) -> Tensor:
    """A new tensor of `shape` whose partition dimension is `pdim` (block dimensions before it, spec §1.4): stored
    partition-first, so `t[b]` is a (P, free...) tile; the tensor is a permuted view of that storage."""
    stored = (shape[pdim],) + shape[:pdim] + shape[pdim + 1:] if pdim else shape
    checks.new_tile(run, stored, dtype, memory, name, where, blocks=pdim)
    data = np.empty(stored, dtype)
    compute(run, lambda: _fill(data, fill))
    buf = Buffer(run, name, memory, data, written=fill is not None, where=where)
    if memory == "psum" and pdim:
        run.psum_bank_count[buf.id] = checks.psum_banks(run.target, stored, data.dtype.itemsize, pdim)
    run.allocate(buf, temp=temp)
    whole = Tensor.whole(buf)
    if not pdim:
        return whole
    s = whole.strides
    return Tensor(buf, 0, tuple(shape), s[1:pdim + 1] + (s[0],) + s[pdim + 1:])


def _fill(data: np.ndarray, fill: object) -> None:
    if fill is None:
        _poison(data)
    else:
        data[...] = fill


def _poison(data: np.ndarray) -> None:
    """New memory reads as NaN (floats) or a sentinel (ints), like AWS's newer simulator."""
    if data.dtype.kind in "iu":
        data.fill(4)
    else:
        data.fill(np.nan)


def result(run: Run, value: np.ndarray | None, shape: tuple, dtype: np.dtype, memory: str, where: tuple[str, int],
           default_name: str, mask: np.ndarray | None = None) -> Tensor:
    """A fresh output tile of `shape` holding `value` rounded to `dtype` (None in a trace-only run); remembers the
    unrounded value for retargeting. With a mask, only the masked elements are computed: the others stay unwritten.
    The shape is declared by the instruction, not taken from the value, because a trace-only run has no value."""
    name = target_name(where, default_name)
    checks.new_tile(run, shape, dtype, memory, name, where)
    data = np.empty(shape, dtype)
    if value is not None:
        if value.shape != shape:  # a full run checks the shape a trace-only run relies on
            raise InternalError(f"{default_name} computed shape {value.shape}, declared {shape}")
        if mask is not None:
            _poison(data)
        _store(data, value, mask)
    buf = Buffer(run, name, memory, data, written=mask is None, where=where)
    if mask is not None:
        buf.written[...] = mask.ravel()
        buf.mask = mask
    run.allocate(buf, temp=True)
    buf.raw = value
    return Tensor.whole(buf)


# ---- trace ----
def emit(run: Run, engine: str, op: str, out: Tensor | None, ins: tuple, where: tuple[str, int],
         **fields: object) -> int:
    for t in ins:
        checks.pattern_limits(t, op, "input", where, run.target)
    if out is not None:
        checks.pattern_limits(out, op, "destination", where, run.target)
    seq = len(run.instrs)
    infos = run.infos
    in_dtypes, reads = [], []
    for t in ins:  # one loop, no generators: this runs for every instruction
        buf = t.buf
        info = infos.get(buf.id)
        if info is not None:
            info.last_seq = seq
        in_dtypes.append(dtype_name(buf.dtype))
        reads.append(recorder.access(t))
    if out is not None:
        info = infos.get(out.buf.id)
        if info is not None:
            info.last_seq = seq
        out.buf.instr = seq
    fields.setdefault("partitions", out.partitions if out is not None else 0)
    fields.setdefault("free", out.free_size if out is not None else 0)
    run.instrs.append(Instr(
        seq=seq, engine=engine, op=op, in_dtypes=tuple(in_dtypes),
        out_dtype=dtype_name(out.dtype) if out is not None else "", reads=tuple(reads),
        writes=(recorder.access(out),) if out is not None else (), file=where[0], line=where[1], **fields))
    return seq


def also_writes(run: Run, seq: int, t: Tensor) -> None:
    """Record `t` as a second destination of instruction `seq` (an accumulator read-out, an activation's
    reduce_res), so the model orders its readers after that instruction."""
    info = run.infos.get(t.buf.id)
    if info is not None:
        info.last_seq = seq
    instr = run.instrs[seq]
    run.instrs[seq] = dataclasses.replace(instr, writes=instr.writes + (recorder.access(t),))


def _retarget(run: Run, tmp: Tensor, dst: Tensor, accumulate: bool) -> None:
    idx = tmp.buf.instr
    instr = run.instrs[idx]
    info = run.infos.get(dst.buf.id)
    if info is not None:
        info.last_seq = max(info.last_seq, idx)
    # the output's write becomes dst's; a second output (an activation's reduce_res) stays recorded
    run.instrs[idx] = dataclasses.replace(instr, writes=(recorder.access(dst),) + instr.writes[1:], out_dtype=dtype_name(dst.dtype),
                                          accumulate=accumulate or instr.accumulate)
    if instr.op == "nc_matmul":  # `acc[...] = nl.matmul(..)`, `acc += ..`: TensorE wrote the region (0.6 flags)
        flags = matmul_flags(run, dst)
        if flags is not None:
            flags[...] = True
    run.discard(tmp.buf)


def is_matmul_accumulation(dst: Tensor, value: object) -> bool:
    """`dst += value` is TensorE's PSUM accumulation: a fresh nc_matmul result into PSUM [ARCH2]."""
    run = runtime.current()
    return dst.buf.memory == "psum" and is_fresh(value) and run.instrs[value.buf.instr].op == "nc_matmul"


def is_fresh(value: object) -> bool:
    """An instruction's whole result, not yet kept (only core.result makes temps; flush and discard end them)."""
    return isinstance(value, Tensor) and value.buf.temp and value.off == 0 and value.shape == value.buf.shape


def _raw(value: Tensor, shape: tuple) -> np.ndarray | None:
    raw = value.buf.raw
    return None if raw is None else raw.reshape(shape)


# ---- dst[...] = value ----
def assign(dst: Tensor, value: object) -> None:
    if hasattr(value, "fold_into"):  # nl.loop_reduce: dst = op(dst, x), an accumulation across iterations
        value.fold_into(dst)
        return
    run = runtime.current()
    where = runtime.callsite()
    if isinstance(value, Tensor) and value.buf is dst.buf and value.off == dst.off and \
            value.shape == dst.shape and value.strides == dst.strides:
        return  # `acc[...] += x` re-stores the view it just updated
    if is_fresh(value) and value.size == dst.size and not _evacuated(run, value, dst):
        checks.retarget(run, run.instrs[value.buf.instr], dst, where)
        mask = value.buf.mask
        write(run, dst, _raw(value, dst.shape), where, mask=None if mask is None else mask.reshape(dst.shape))
        _retarget(run, value, dst, accumulate=False)
        return
    run.flush()
    if isinstance(value, Tensor):
        _copy(run, dst, value, where)
    elif isinstance(value, (int, float, np.number, bool)):
        write(run, dst, compute(run, lambda: value), where)
        emit(run, "vector", "memset", dst, (), where, attrs=(("value", float(value)),))
    else:
        raise rules.NkiTypeError(f"cannot assign a {type(value).__name__} to a tile", "assignment", where,
                                 f"destination {dst.describe()}",
                                 hint="assign the result of an NKI API call, a tile, or a scalar constant")


def _evacuated(run: Run, value: Tensor, dst: Tensor) -> bool:
    """`w_sbuf[...] = nisa.nc_transpose(t)`: TensorE writes only PSUM [ISA1 nc_transpose], but SDK 2.21 compiled the
    assignment into SBUF and the tile landed there (fidelity-cases/transpose_into_sbuf.py): the transpose goes to
    PSUM and a VectorE copy brings it to SBUF, as the compiler inserts it. NKI 0.2+ takes dst as an argument."""
    instr = run.instrs[value.buf.instr]
    if not (instr.engine == "tensor" and instr.op == "nc_transpose" and dst.buf.memory == "sbuf"):
        return False
    rules.later_release(run, "the TensorE result of nc_transpose is assigned into SBUF (modelled as a transpose "
                        "into PSUM and a copy to SBUF)", "engine_memory_access", runtime.callsite(),
                        "NKI 0.2 (Neuron SDK 2.27) and later take the PSUM destination as an argument",
                        f"destination {dst.describe()}",
                        hint="transpose into a PSUM tile and copy it to SBUF with nisa.tensor_copy",
                        error=rules.MemoryRuleError)
    return True


def _copy(run: Run, dst: Tensor, src: Tensor, where: tuple[str, int]) -> None:
    checks.assign_shapes(dst, src, where)
    if "hbm" in (dst.buf.memory, src.buf.memory):
        from tilec.nki import isa

        isa.dma_copy(dst=dst, src=src)
        return
    checks.partition_start(src, "tensor_copy", "src", where)
    checks.partition_start(dst, "tensor_copy", "dst", where)
    read(run, src, where)
    write(run, dst, compute(run, lambda: _copied(src, dst)), where)
    emit(run, "vector", "tensor_copy", dst, (src,), where)


def _copied(src: Tensor, dst: Tensor) -> np.ndarray:
    value = src.arr
    if src.size != dst.size:
        value = np.broadcast_to(value, dst.shape)
    elif value.shape != dst.shape:
        value = value.reshape(dst.shape)
    return value if src.dtype == dst.dtype else value.astype(F32)


# ---- acc += nc_matmul(...) ----
def accumulate(dst: Tensor, value: object) -> None:
    run = runtime.current()
    where = runtime.callsite()
    checks.accumulate(run, dst, value, where)
    checks.partition_start(dst, "nc_matmul", "dst", where)
    if dst.buf.direct and not dst.buf.all_written:
        _start_group(run, dst, value, where)
        return
    read(run, dst, where, log_it=False)  # the accumulation's own read-modify-write is logged as ACC
    if dst.dtype == F32 and dst.buf.all_written:
        compute(run, lambda: np.add(dst.arr, _addend(value, dst), out=dst.arr))
        log = run.cur_log()
        if log is not None and log.frame.id not in dst.buf.scope:
            log.add(dst.buf, dst.off, dst.shape, dst.strides, races.ACC, where)
    else:
        write(run, dst, compute(run, lambda: dst.arr.astype(F32) + _addend(value, dst)), where, kind=races.ACC)
    _retarget(run, value, dst, accumulate=True)


def _start_group(run: Run, dst: Tensor, value: Tensor, where: tuple[str, int]) -> None:
    """`acc += nc_matmul(...)` into a directly allocated PSUM tile some of whose elements were never written: the
    matmul there opens an accumulation group, and "the first nc_matmul instruction overwrites the destination PSUM
    bank" [ARCH2 Near-memory accumulation in PSUM]. Under automatic allocation the compiler recognises the group
    only from a zero-filled tile (nl.zeros, condition 1 there), so an unwritten one stays an uninitialized read;
    under direct allocation AWS's own kernels (nki-samples allocated attention and fused RMSNorm-QKV) start their
    groups on fresh tiles. Elements the matmul's mask= leaves out stay as they were."""
    was = dst.written_view().copy()
    mask = value.buf.mask
    mask = None if mask is None else mask.reshape(dst.shape)
    add = compute(run, lambda: np.where(was, dst.arr.astype(F32), np.float32(0)) + _addend(value, dst))
    write(run, dst, add, where, kind=races.ACC, mask=None if mask is None else (mask | was))
    _retarget(run, value, dst, accumulate=True)


def _addend(value: Tensor, dst: Tensor) -> np.ndarray:
    """The matmul result to add; elements its mask did not compute add nothing."""
    raw = _raw(value, dst.shape)
    mask = value.buf.mask
    return raw if mask is None else np.where(mask.reshape(dst.shape), raw, np.float32(0))
