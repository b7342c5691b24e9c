"""`neuronxcc.nki.isa`: the ISA-level instructions of NKI 0.1 (return-value style), executed eagerly with numpy.

Each function checks its operands against the hardware rules (checks.py), computes in fp32 (matmul accumulates in
fp32 into PSUM; dma_copy casts through fp32 only when dtypes differ, otherwise copies bits), stores the result
rounded to its dtype, and records one trace instruction. The arithmetic of each is a step (a closure) passed to
`core.compute`, which a trace-only run skips; so every output shape is declared from the operands' shapes, never
taken from a computed value.
"""
from __future__ import annotations

import enum

import numpy as np

from tilec.nki import alu, checks, core, dtypes, indirect, rules, runtime
from tilec.nki.indexing import IndexExpr, Predicate
from tilec.nki.indirect import Indirect
from tilec.nki.tensor import Tensor

F32 = np.dtype(np.float32)


class engine(enum.IntEnum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    vector = 5
    sync = 6


engine_enum = engine
unknown_engine, tensor_engine, scalar_engine = engine.unknown, engine.tensor, engine.scalar
gpsimd_engine, vector_engine, sync_engine = engine.gpsimd, engine.vector, engine.sync


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3


def get_nc_version() -> nc_version:
    from tilec.nki import runtime

    run = runtime.active()
    return nc_version.gen2 if run is not None and run.target.name == "trn1" else nc_version.gen3


class oob_mode(enum.IntEnum):
    error = 0
    skip = 1


_OOB_SKIP = oob_mode.skip


class dge_mode(enum.IntEnum):
    unknown = 0
    none = 1
    swdge = 2
    hwdge = 3


class reduce_cmd(enum.IntEnum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3


_ENGINE_NAMES = {engine.tensor: "tensor", engine.scalar: "scalar", engine.gpsimd: "gpsimd",
                 engine.vector: "vector"}


def _engine(requested: object, default: str) -> str:
    return _ENGINE_NAMES.get(requested, default) if requested is not None else default


def _op(op: object, api: str, where: tuple) -> alu.Op:
    found = alu.lookup(op)
    if found is None:
        raise rules.NkiTypeError(f"unsupported operator {op!r} for '{api}'", "unsupported_op", where,
                                 hint="pass an nl.* operator such as nl.add, nl.multiply, nl.maximum")
    return found


def mask_array(mask: object, shape: tuple) -> np.ndarray | None:
    if mask is None:
        return None
    if isinstance(mask, Predicate):
        return np.broadcast_to(mask.evaluate(), shape)
    return np.broadcast_to(np.asarray(mask, dtype=bool), shape)


def _finish(run, mask: object, value: np.ndarray | None, shape: tuple, dtype: object, default: np.dtype,
            memory: str, where: tuple, name: str) -> Tensor:
    out_dtype = dtypes.as_dtype(dtype) if dtype is not None else default
    return core.result(run, value, shape, out_dtype, memory, where, name, mask=mask_array(mask, shape))


# ---- data movement ----
def dma_copy(*, dst: Tensor, src: Tensor, mask: object = None, dst_rmw_op: object = None,
             oob_mode: object = None, dge_mode: object = None) -> None:
    triggered_dma_copy(dst, src, mask, dst_rmw_op, oob_mode)


def triggered_dma_copy(dst: Tensor, src: Tensor, mask: object = None, dst_rmw_op: object = None,
                       oob_mode: object = None, trigger: str | None = None) -> None:
    """dma_copy; `trigger`: the engine an NKI 0.6 kernel named to issue it (dge_mode=hwdge, engine=sync or scalar),
    recorded for the model's DMA trigger streams."""
    run, where = core.begin()
    if isinstance(src, Indirect) or isinstance(dst, Indirect):
        rmw = _op(dst_rmw_op, "dma_copy", where) if dst_rmw_op is not None else None
        plain = dst if isinstance(src, Indirect) else src
        indirect.dma(run, dst, src, where, skip=oob_mode == _OOB_SKIP, op=rmw,
                     mask=_row_mask(mask, plain.shape) if isinstance(plain, Tensor) else None)
        return
    for role, t in (("src", src), ("dst", dst)):
        if not isinstance(t, Tensor):
            raise rules.NkiTypeError(f"operand '{role}' of 'dma_copy' must be a tensor, got {type(t).__name__}",
                                     "operand_type", where)
    checks.dma(src, dst, where)
    m = mask_array(mask, dst.shape)
    src_mask = m if m is not None and src.shape == dst.shape else None
    core.read(run, src, where, mask=src_mask)
    op = None
    if dst_rmw_op is not None:
        op = _op(dst_rmw_op, "dma_copy", where)
        core.read(run, dst, where)
    core.write(run, dst, core.compute(run, lambda: _dma_value(src, dst, src_mask, op)), where, mask=m)
    _emit_dma(run, "dma_copy", src, dst, where, **({"trigger": trigger} if trigger else {}))


def _row_mask(mask: object, shape: tuple) -> np.ndarray | None:
    """A (P, F) mask of an indirect DMA over its plain side's shape; a (P, 1) partition predicate covers each row."""
    if mask is None:
        return None
    m = mask.evaluate() if isinstance(mask, Predicate) else np.asarray(mask, dtype=bool)
    if m.ndim < len(shape):
        m = m.reshape(m.shape[:1] + (1,) * (len(shape) - m.ndim) + m.shape[1:])
    return np.broadcast_to(m, shape)


def _dma_value(src: Tensor, dst: Tensor, src_mask: np.ndarray | None, op: alu.Op | None) -> np.ndarray:
    value = core.values(src, src_mask)
    if value.shape != dst.shape:
        value = value.reshape(dst.shape)
    if src.dtype != dst.dtype:
        value = value.astype(F32)  # DMA casts src -> fp32 -> dst
    if op is not None:
        value = op.binary(core.f32(dst), value.astype(F32))
    return value


def _emit_dma(run, op: str, src: Tensor, dst: Tensor, where: tuple, rows: Tensor | None = None,
              **attrs: object) -> None:
    """`rows`: a DMA transpose's source in its own layout. The engines read it in its contiguous runs and write the
    destination in [128, 16] blocks together, at up to 90 % of a copy's throughput [ARCH3, nki-spec 1.10.12]: its
    descriptors are the source's runs (the throughput factor is the model's, `dma_transpose_factor`), not one per
    element of the transposed view."""
    from tilec.nki import recorder

    chunks, chunk_bytes = recorder.dma_chunks(src, dst) if rows is None else recorder.dma_chunks(rows, rows)
    side = dst if dst.buf.memory != "hbm" else src if src.buf.memory != "hbm" else dst
    parts = side.shape[0] if side.shape else 1
    core.emit(run, "dma", op, dst, (src,), where, partitions=parts, free=dst.size // max(parts, 1),
              bytes=dst.size * dst.itemsize, dma_chunks=chunks, dma_chunk_bytes=chunk_bytes,
              attrs=tuple(attrs.items()))


def dma_transpose(src: Tensor, *, axes: tuple | None = None, mask: object = None, dtype: object = None,
                  dge_mode: object = None) -> Tensor:
    run, where = core.begin()
    perms = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}
    perm = tuple(axes) if axes is not None else perms.get(src.ndim)
    if perm is None or perms.get(src.ndim) != perm:
        raise rules.NkiSyntaxError(f"dma_transpose supports axes {perms.get(src.ndim)} for a {src.ndim}-D source, "
                                   f"got {perm}", "dma_transpose_axes", where, f"src {src.describe()}")
    if src.buf.memory == "psum":
        checks.dma(src, src, where)
    if src.itemsize not in (2, 4):  # ARCH3 documents DMA transposes of 2- and 4-byte elements only
        raise rules.NkiTypeError(f"dma_transpose moves 2- or 4-byte elements, got {src.dtype.name}",
                                 "dma_transpose_dtype", where, f"src {src.describe()}",
                                 hint="transpose on TensorE (nc_transpose), or widen the tile first")
    view = Tensor(src.buf, src.off, tuple(src.shape[p] for p in perm), tuple(src.strides[p] for p in perm))
    core.read(run, view, where)
    value = core.compute(run, lambda: view.arr if dtype is None else view.arr.astype(F32))
    out = _finish(run, mask, value, view.shape, dtype, src.dtype, "sbuf", where, "dma_transpose")
    _emit_dma(run, "dma_transpose", view, out, where, rows=src, transpose=True)
    return out


# ---- TensorE ----
def nc_matmul(stationary: Tensor, moving: Tensor, *, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, tile_position: tuple = (),
              tile_size: tuple = (), mask: object = None, **kwargs: object) -> Tensor:
    run, where = core.begin()
    for role, t in (("stationary", stationary), ("moving", moving)):
        checks.tile(t, "nc_matmul", role, where)
    stationary, moving = (_to_sbuf(run, t, role, where) for role, t in (("stationary", stationary),
                                                                         ("moving", moving)))
    for role, t in (("stationary", stationary), ("moving", moving)):
        checks.engine_reads("tensor", t, "nc_matmul", role, where)
    if kwargs.get("perf_mode") == "double_row_gen3":
        if is_transpose:
            raise rules.NkiSyntaxError(
                "nc_matmul: the FP8 double-row performance mode cannot be combined with transpose mode",
                "matmul_double_row_transpose", where, f"stationary {stationary.describe()}",
                hint="transpose with is_transpose=True and no perf_mode, or nisa.nc_transpose")
        return _double_row(run, stationary, moving, where)
    if not is_transpose:  # (a transpose moves any dtype: nc_transpose's "any valid NKI data type" [ISA6])
        checks.matmul_input_dtypes(stationary, moving, where)
    checks.matmul(run, stationary, moving, where)
    k, m, n = stationary.shape[0], stationary.free_size, moving.free_size
    out_shape = (m,) + tuple(moving.shape[1:])
    if is_transpose:
        _transpose_operands(run, stationary, moving, where)
    rows, out_mask = _matmul_mask(mask, k, out_shape, where)
    if out_mask is None:
        keeps = [_read_rows(run, t, rows, where) for t in (stationary, moving)]
    else:
        keeps = _read_for_outputs(run, stationary, moving, out_mask, where)
    if is_transpose:
        _identity_moving(run, moving, keeps[1], where)
    flagged = [(role, t, keep) for role, t, keep, flag in zip(("stationary", "moving"), (stationary, moving), keeps,
                                                              (is_stationary_onezero, is_moving_onezero)) if flag]
    for role, t, keep in flagged:
        _onezero(run, role, t, keep, where)
    if is_transpose:  # moving is the identity: transpose mode moves the data, NC-v2 sums products with it
        rows_of = (lambda x: x.T) if run.target.transpose_mode else _identity_matmul
        value = core.compute(run, lambda: rows_of(_contraction_rows(stationary, keeps[0]).reshape(k, -1))
                             .reshape(out_shape))
    else:
        value = core.compute(run, lambda: _matmul_value(stationary, moving, keeps, out_shape))
    out = core.result(run, value, out_shape, F32, "psum", where, "matmul", mask=out_mask)
    attrs = (("is_transpose", True),) if is_transpose else ()
    attrs += (("onezero", True),) if flagged else ()
    core.emit(run, "tensor", "nc_matmul", out, (stationary, moving), where, partitions=m, free=n, k=k, m=m,
              attrs=attrs)
    return out


def _transpose_operands(run, stationary: Tensor, moving: Tensor, where: tuple) -> None:
    """is_transpose=True: `moving` is an identity matrix and `stationary` the tile transposed [ISA1, ISA6 nc_matmul],
    so moving is [K, K]. On NeuronCore-v3 this is TensorE's transpose mode (ARCH3, v2.32.0 trainium2_arch.rst,
    Built-in Transpose Support): the data moves bit-exactly and an fp8 input comes out as 16-bit PSUM elements with
    the upper 8 bits zero, a layout no NKI dtype describes, so the interpreter does not take fp8 here."""
    k = stationary.shape[0]
    if moving.free_size != k:
        raise rules.NkiSyntaxError(
            f"nc_matmul(is_transpose=True) transposes stationary with an identity matrix as moving: moving must be "
            f"[{k}, {k}] (stationary has {k} partitions), got {tuple(moving.shape)}", "matmul_transpose_identity",
            where, f"stationary {stationary.describe()}; moving {moving.describe()}",
            hint=f"pass a [{k}, {k}] identity (e.g. nl.shared_identity_matrix) as moving")
    if run.target.transpose_mode and stationary.itemsize == 1:
        raise rules.NkiTypeError(
            "nc_matmul(is_transpose=True) of an fp8 tile writes 16-bit PSUM elements with the upper 8 bits zero "
            "(ARCH3), which the interpreter does not model", "matmul_transpose_fp8", where,
            f"stationary {stationary.describe()}", hint="transpose a 16-bit copy of the tile, or use dma_transpose")


def _onezero(run, role: str, t: Tensor, keep: np.ndarray | None, where: tuple) -> None:
    """is_<role>_onezero=True promises TensorE an operand of ones and zeros only [ISA1, ISA6 nc_matmul: "could
    lead to 2x better performance if [it] is in float32"]; a broken promise is the kernel's error (checked when
    values are computed)."""
    if not run.numerics:
        return
    got = _contraction_rows(t, keep)
    bad = np.argwhere((got != 0) & (got != 1))
    if len(bad):
        at = tuple(int(i) for i in bad[0])
        raise rules.NkiValueError(
            f"nc_matmul(is_{role}_onezero=True) needs {role} to hold only 0 and 1: element {list(at)} is "
            f"{float(got[at])!r}", "matmul_onezero", where, f"{role} {t.describe()}",
            hint=f"leave is_{role}_onezero=False for a general operand")


def _identity_moving(run, moving: Tensor, keep: np.ndarray | None, where: tuple) -> None:
    """The values of an is_transpose=True moving operand: the identity (checked when values are computed)."""
    if not run.numerics:
        return
    k = moving.shape[0]
    got = _contraction_rows(moving, keep).reshape(k, k)
    if not np.array_equal(got, np.eye(k, dtype=F32)):
        bad = [int(i) for i in np.argwhere(got != np.eye(k, dtype=F32))[0]]
        raise rules.NkiValueError(
            f"nc_matmul(is_transpose=True) needs moving to be an identity matrix: element {bad} is "
            f"{float(got[tuple(bad)])!r}", "matmul_transpose_identity", where, f"moving {moving.describe()}",
            hint="transpose mode streams an identity; for a general product leave is_transpose=False")


def _to_sbuf(run, t: Tensor, role: str, where: tuple) -> Tensor:
    """TensorE "must read inputs from SBUF" [ISA1 nc_matmul]. A TensorE nc_transpose result the kernel left to the
    compiler to place (`tr = nisa.nc_transpose(x)`, no destination) lands in PSUM, and SDK 2.21-2.26 compiled it as
    a matmul operand by copying it to SBUF first (AWS's flash attention backward, nki-samples fc5c69f, feeds it so).
    The copy is modelled (a VectorE tensor_copy); NKI 0.2+ (Neuron SDK 2.27) writes every result to an explicit dst,
    so there the kernel copies it itself. A PSUM tile the kernel placed stays an error."""
    if t.buf.memory != "psum" or t.buf.result_of != "nc_transpose":
        return t
    rules.later_release(run, f"operand '{role}' of nc_matmul is the PSUM result of nc_transpose (modelled as a copy "
                        "to SBUF, as the compiler inserted it)", "engine_memory_access", where,
                        "NKI 0.2 (Neuron SDK 2.27) and later write results to an explicit dst, and TensorE reads "
                        "only SBUF", f"tensor {t.describe()}",
                        hint="copy the transpose to SBUF with nisa.tensor_copy before the matmul",
                        error=rules.MemoryRuleError)
    whole = t.buf.mask is not None and t.off == 0 and t.shape == t.buf.shape
    return tensor_copy(t, engine=vector_engine, mask=t.buf.mask if whole else None)  # (what a mask= computed)


def _double_row(run, stationary: Tensor, moving: Tensor, where: tuple) -> Tensor:
    """perf_mode="double_row_gen3" (NeuronCore-v3, fp8): both operands are (K, 2, free) and the contraction runs
    over K partitions x 2 rows: out[i, j] = sum_k,l s[k, l, i] * m[k, l, j] [ISA1 nc_matmul, v2.26.1 doc test]."""
    ok = stationary.ndim == 3 and moving.ndim == 3 and stationary.shape[1] == moving.shape[1] == 2 and \
        stationary.shape[0] == moving.shape[0] and stationary.shape[2] <= run.target.stationary_fmax and \
        moving.shape[2] <= run.target.moving_fmax and run.target.name != "trn1"
    if not ok:
        raise rules.NkiSyntaxError(
            "nc_matmul perf_mode='double_row_gen3' takes (K, 2, M <= 128) stationary and (K, 2, N <= 512) moving "
            "tiles on trn2", "matmul_double_row", where, f"stationary {stationary.describe()}; moving "
            f"{moving.describe()}")
    core.read(run, stationary, where)
    core.read(run, moving, where)
    shape = (stationary.shape[2], moving.shape[2])
    value = core.compute(run, lambda: np.einsum("kli,klj->ij", core.f32(stationary), core.f32(moving)))
    out = core.result(run, value, shape, F32, "psum", where, "matmul")
    core.emit(run, "tensor", "nc_matmul", out, (stationary, moving), where, partitions=shape[0], free=shape[1],
              k=2 * stationary.shape[0], m=shape[0], attrs=(("perf_mode", "double_row_gen3"),))
    return out


def _matmul_mask(mask: object, k: int, out_shape: tuple, where: tuple) -> tuple:
    """nc_matmul masks the operands (spec §1.6): a mask over the partitions alone, shape (K, 1), selects the
    contraction rows of both operands (a ragged last K tile); any other mask selects output elements."""
    if mask is None:
        return None, None
    m = mask.evaluate() if isinstance(mask, Predicate) else np.asarray(mask, dtype=bool)
    if m.ndim == 2 and m.shape == (k, 1):
        return m[:, 0], None
    try:
        return None, np.broadcast_to(m, out_shape)
    except ValueError:
        raise rules.NkiSyntaxError(
            f"nc_matmul mask of shape {tuple(m.shape)} fits neither the contraction partitions ({k}, 1) nor the "
            f"output {out_shape}", "matmul_mask_shape", where,
            hint="mask the contraction rows with a predicate on the partition index only, e.g. k*128 + i_p < K")


def _read_rows(run, t: Tensor, rows: np.ndarray | None, where: tuple) -> np.ndarray | None:
    """Check TensorE's read of an operand; rows masked off are not read. Returns the element mask read."""
    keep = None if rows is None else np.broadcast_to(rows.reshape((-1,) + (1,) * (len(t.shape) - 1)), t.shape)
    core.read(run, t, where, mask=keep)
    return keep


def _read_for_outputs(run, stationary: Tensor, moving: Tensor, out_mask: np.ndarray, where: tuple) -> list:
    """Under an output mask, TensorE reads the stationary columns and moving columns of the output elements it
    computes: out[i, j] needs stationary[:, i] and moving[:, j] (a mask that is all False reads nothing, as AWS's
    fused RMSNorm-QKV sample relies on for its tail tiles)."""
    flat = out_mask.reshape(out_mask.shape[0], -1)
    cols = [flat.any(axis=1), flat.any(axis=0)]
    keeps = []
    for t, used in zip((stationary, moving), cols):
        keep = None if used.all() else np.broadcast_to(used.reshape((1,) + tuple(t.shape[1:])), t.shape)
        core.read(run, t, where, mask=keep)
        keeps.append(keep)
    return keeps


def _matmul_value(stationary: Tensor, moving: Tensor, keeps: list, out_shape: tuple) -> np.ndarray:
    k = stationary.shape[0]
    s, mv = (_contraction_rows(t, keep).reshape(k, -1) for t, keep in zip((stationary, moving), keeps))
    return (s.T @ mv).reshape(out_shape)


def _contraction_rows(t: Tensor, keep: np.ndarray | None) -> np.ndarray:
    """An operand as TensorE sees it; rows masked off contribute nothing."""
    if keep is None:
        return core.f32(t)
    return np.where(keep, core.f32(t, keep), np.float32(0))


def nc_transpose(data: Tensor, *, mask: object = None, dtype: object = None, engine: object = None) -> Tensor:
    run, where = core.begin()
    checks.tile(data, "nc_transpose", "data", where)
    p, f = data.shape[0], data.free_size
    eng = _engine(engine, "vector" if p <= 32 and f <= 32 else "tensor")
    limit = 32 if eng == "vector" else run.target.pmax
    if p > limit or f > limit:
        raise rules.NkiSyntaxError(
            f"nc_transpose on the {eng} engine supports at most [{limit}, {limit}], got [{p}, {f}]",
            "err_size_of_dimension_exceed_arch_limit", where, f"data {data.describe()}",
            hint="transpose 128x128 tiles on the tensor engine, 32x32 on the vector engine")
    checks.engine_reads(eng, data, "nc_transpose", "data", where)
    core.read(run, data, where)
    if eng == "tensor" and not run.target.transpose_mode:
        value = core.compute(run, lambda: _identity_matmul(core.f32(data).reshape(p, f)))
    else:  # VectorE, and TensorE's transpose mode (NC-v3): bit-exact [ISA6 nc_transpose, ARCH3]
        value = core.compute(run, lambda: data.arr.reshape(p, f).T)
    memory = "psum" if eng == "tensor" else "sbuf"
    out = _finish(run, mask, value, (f, p), dtype, data.dtype, memory, where, "transpose")
    core.emit(run, eng, "nc_transpose", out, (data,), where, k=p, attrs=(("is_transpose", True),))
    out.buf.result_of = "nc_transpose"
    return out


def _identity_matmul(x: np.ndarray) -> np.ndarray:
    """x.T as a TensorE matmul with an identity computes it without transpose mode (NeuronCore-v2): every product
    x[k, i] * I[k, j] is summed, so a NaN or Inf in column i of x makes row i of the result NaN where it is not the
    element itself ("not bit-accurate if the input data contains NaN/Inf" [ISA1, ISA6 nc_transpose])."""
    with np.errstate(invalid="ignore"):  # Inf * 0 is NaN, as on the hardware
        return np.einsum("ki,kj->ij", x, np.eye(x.shape[0], dtype=F32))


# ---- VectorE / ScalarE / GpSimdE ----
def _elementwise_engine(requested: object, default: str, operands: tuple, api: str, run, where: tuple) -> str:
    _engine_allowed(requested, api, run, where)
    eng = _engine(requested, default)
    for role, t in operands:
        checks.tile(t, api, role, where)
        checks.engine_reads(eng, t, api, role, where)
        checks.free_limit(t, eng, api, role, run, where)
    return eng


def _engine_allowed(requested: object, api: str, run, where: tuple) -> None:
    """An explicit engine= must be one the instruction runs on for this target (tilec/target.py `engines`):
    tensor_tensor on VectorE or GpSimdE; tensor_scalar and tensor_copy also on ScalarE from NeuronCore-v3 [NISA,
    nki-spec §1.10.4-7]. engine.unknown (or None) lets the instruction choose."""
    if requested is None or requested == engine.unknown or run is None:
        return
    try:
        allowed = run.target.instr(api).engines
    except KeyError:
        return
    name = _ENGINE_NAMES.get(requested, getattr(requested, "name", str(requested)))
    if allowed and name not in allowed:
        raise rules.NkiSyntaxError(
            f"{api} cannot run on the {name} engine of {run.target.core} ({run.target.name}); it runs on "
            f"{', '.join(allowed)}", "engine_choice", where,
            hint=f"pass engine=nisa.{allowed[0]}_engine, or leave engine= out to let the instruction choose")


def tensor_tensor(data1: Tensor, data2: Tensor, op: object, *, dtype: object = None, mask: object = None,
                  engine: object = None) -> Tensor:
    run, where = core.begin()
    fn = _op(op, "tensor_tensor", where)
    ints = data1.dtype == dtypes.int32 and data2.dtype == dtypes.int32 and fn.name in ("add", "subtract",
                                                                                       "multiply")
    default = "gpsimd" if fn.name == "power" or ints else "vector"
    eng = _elementwise_engine(engine, default, (("data1", data1), ("data2", data2)), "tensor_tensor", run, where)
    if fn.name == "power" and eng != "gpsimd":  # "Valid choices for op: 1. Any supported binary operator that runs
        # on the Vector Engine ... 2. nl.power. (Which runs on the GpSimd engine.)" (ISA6 v2.32.0 tensor_tensor)
        raise rules.NkiSyntaxError(f"tensor_tensor with op=nl.power runs on the gpsimd engine, not {eng}",
                                   "engine_choice", where, hint="leave engine= out (GpSimdE reads SBUF only)")
    checks.same_partitions(data1, data2, "tensor_tensor", ("data1", "data2"), where)
    checks.psum_operands(data1, data2, "tensor_tensor", where)
    if data1.free_size != data2.free_size:
        data1, data2 = _column_broadcast(run, data1, data2, where)
    m = mask_array(mask, data1.shape)
    m2 = m if data2.shape == data1.shape else None
    _read_operand(run, data1, fn, where, m)
    _read_operand(run, data2, fn, where, m2)
    value = core.compute(run, lambda: fn.binary(_operand(data1, fn, m),
                                                _operand(data2, fn, m2).reshape(data1.shape)))
    out = _finish(run, mask, value, data1.shape, dtype, dtypes.promote(data1.dtype, data2.dtype), "sbuf", where,
                  "tensor_tensor")
    core.emit(run, eng, "tensor_tensor", out, (data1, data2), where, attrs=(("alu", fn.name),))
    return out


def _column_broadcast(run, data1: Tensor, data2: Tensor, where: tuple) -> tuple[Tensor, Tensor]:
    """A (P, 1) column against a (P, F...) tile. The NKI docs (v2.26.1 and 0.6) ask for equal elements per
    partition, but SDK 2.21 compiled it and the hardware broadcast the column along the free dimensions (the course
    README suggests tensor_tensor for the conv bias; fidelity-cases/bias_broadcast.py): the column is read with
    stride 0 along the free dims. Any other mismatch is an error."""
    detail = f"data1 {data1.describe()}; data2 {data2.describe()}"
    if 1 not in (data1.free_size, data2.free_size):
        raise rules.NkiSyntaxError(
            f"tensor_tensor operands differ in elements per partition: {data1.free_size} vs {data2.free_size}",
            "tensor_tensor_shape", where, detail,
            hint="use nisa.tensor_scalar to broadcast a (P, 1) vector along the free dimension")
    rules.later_release(
        run, f"tensor_tensor broadcasts a ({data1.shape[0]}, 1) column along the free dimension", "tensor_tensor_shape",
        where, "the NKI docs require equal elements per partition and the NKI 0.6 API (Neuron SDK 2.32) takes "
        "equal shapes", detail, hint="nisa.tensor_scalar(data, op, column) broadcasts a column and is faster",
        error=rules.NkiSyntaxError)

    def spread(col: Tensor, like: Tensor) -> Tensor:
        return Tensor(col.buf, col.off, like.shape, (col.strides[0],) + (0,) * (like.ndim - 1))

    return (data1, spread(data2, data1)) if data2.free_size == 1 else (spread(data1, data2), data2)


def _read_operand(run, t: Tensor, fn: alu.Op, where: tuple, mask: np.ndarray | None = None) -> None:
    if fn.kind == "bitvec" and t.dtype.kind not in "iu":
        raise rules.NkiTypeError(f"bitvec operator nl.{fn.name} needs integer operands, got {t.dtype.name}",
                                 "bitvec_dtype", where, f"tensor {t.describe()}")
    core.read(run, t, where, mask=mask)


def _operand(t: Tensor, fn: alu.Op, mask: np.ndarray | None = None) -> np.ndarray:
    """An operand _read_operand checked, as the ALU sees it: integer bits for bitvec ops, else fp32."""
    return core.values(t, mask) if fn.kind == "bitvec" else core.f32(t, mask)


def tensor_scalar(data: Tensor, op0: object, operand0: object, reverse0: bool = False, op1: object = None,
                  operand1: object = None, reverse1: bool = False, *, dtype: object = None, mask: object = None,
                  engine: object = None) -> Tensor:
    run, where = core.begin()
    eng = _elementwise_engine(engine, "vector", (("data", data),), "tensor_scalar", run, where)
    if (op1 is None) != (operand1 is None):
        raise rules.NkiValueError("tensor_scalar: op1 and operand1 must be given together", "tensor_scalar_args",
                                  where)
    ops = [(op0, operand0, reverse0, "operand0")] + ([(op1, operand1, reverse1, "operand1")] if op1 else [])
    fns = [_op(o, "tensor_scalar", where) for o, *_ in ops]
    if len({f.kind == "bitvec" for f in fns}) > 1:  # "op0 and op1 ... must be of the same type (both bitvec or
        # both arithmetic)": ISA6 v2.32.0 and ISA1 v2.26.1 nki/api/nki/isa/__init__.py, tensor_scalar
        raise rules.NkiTypeError(
            f"tensor_scalar's op0 and op1 must both be bitvec or both arithmetic operators: got nl.{fns[0].name} "
            f"({fns[0].kind}) and nl.{fns[1].name} ({fns[1].kind})", "tensor_scalar_op_kinds", where,
            hint="split it into two tensor_scalar instructions")
    _tensor_scalar_engine(eng, [f.name for f in fns], where)
    m = mask_array(mask, data.shape)
    _read_operand(run, data, fns[0], where, m)
    reads, steps = [data], []
    for fn, (_, operand, reverse, role) in zip(fns, ops):
        steps.append((fn, _scalar_operand(run, data, operand, role, fn, eng, where), reverse))
        if isinstance(operand, Tensor):
            reads.append(operand)
    value = core.compute(run, lambda: _tensor_scalar_value(data, m, steps))
    out = _finish(run, mask, value, data.shape, dtype, data.dtype, "sbuf", where, "tensor_scalar")
    core.emit(run, eng, "tensor_scalar", out, tuple(reads), where, attrs=(("alu", tuple(f.name for f in fns)),))
    return out


def _tensor_scalar_value(data: Tensor, mask: np.ndarray | None, steps: list) -> np.ndarray:
    """Apply (op, operand, reverse) steps in order; an operand is a scalar or a thunk of a (P, 1, ...) column."""
    value = _operand(data, steps[0][0], mask)
    for fn, v, reverse in steps:
        v = v() if callable(v) else v
        value = fn.binary(v, value) if reverse else fn.binary(value, v)
    return value


_SCALAR_ENGINE_OPS = (["multiply"], ["add"], ["multiply", "add"])


def _tensor_scalar_engine(eng: str, names: list, where: tuple) -> None:
    """ScalarE (trn2) runs only (multiply[, add]) / (add); GpSimdE only rsqrt [NISA tensor_scalar]."""
    if eng == "scalar" and names not in _SCALAR_ENGINE_OPS:
        raise rules.NkiSyntaxError(
            f"tensor_scalar on the scalar engine supports only (multiply, add), (multiply) or (add); got "
            f"({', '.join(names)})", "scalar_engine_alu", where, hint="use the vector engine (the default)")
    if eng == "gpsimd" and names != ["rsqrt"]:
        raise rules.NkiSyntaxError(f"tensor_scalar on the gpsimd engine supports only rsqrt; got "
                                   f"({', '.join(names)})", "gpsimd_engine_alu", where,
                                   hint="use the vector engine (the default)")


def _scalar_operand(run, data: Tensor, operand: object, role: str, fn: alu.Op, eng: str, where: tuple,
                    api: str = "tensor_scalar") -> object:
    if not isinstance(operand, Tensor):
        if isinstance(operand, (int, float, np.number)):
            return operand if fn.kind == "bitvec" else np.float32(operand)
        raise rules.NkiTypeError(f"{api} {role} must be a scalar or a (P, 1) tile, got "
                                 f"{type(operand).__name__}", "tensor_scalar_operand", where)
    checks.tile(operand, api, role, where)
    checks.engine_reads(eng, operand, api, role, where)
    checks.same_partitions(data, operand, api, ("data", role), where)
    if operand.free_size != 1:
        raise rules.NkiSyntaxError(
            f"{api} {role} must be a scalar or a per-partition vector of shape ({data.shape[0]}, 1), got "
            f"shape {tuple(operand.shape)}", "tensor_scalar_operand", where, f"{role} {operand.describe()}",
            hint="use nisa.tensor_tensor for element-wise operations between two tiles")
    _read_operand(run, operand, fn, where)
    return lambda: _operand(operand, fn).reshape((data.shape[0],) + (1,) * (data.ndim - 1))


def tensor_reduce(op: object, data: Tensor, axis: object, *, mask: object = None, dtype: object = None,
                  negate: bool = False, keepdims: bool = False) -> Tensor:
    run, where = core.begin()
    fn = _op(op, "tensor_reduce", where)
    eng = _elementwise_engine(None, "vector", (("data", data),), "tensor_reduce", run, where)
    axes = reduce_axes(axis, data, "tensor_reduce", where)
    if fn.reduce is None:
        raise rules.NkiTypeError(f"nl.{fn.name} cannot be used as a reduction", "unsupported_op", where)
    shape = tuple(1 if d in axes else n for d, n in enumerate(data.shape) if keepdims or d not in axes)
    m_in = _input_mask(mask, data.shape, shape)
    _read_operand(run, data, fn, where, m_in)
    value = core.compute(run, lambda: _reduced(fn, data, axes, keepdims, negate, m_in))
    out = _finish(run, None if m_in is not None else mask, value, shape, dtype, data.dtype, "sbuf", where,
                  "tensor_reduce")
    core.emit(run, eng, "tensor_reduce", out, (data,), where,
              attrs=(("alu", fn.name), ("axis", axes), ("in_free", data.free_size)))
    return out


_IDENTITY = {"add": 0.0, "max": -np.inf, "maximum": -np.inf, "min": np.inf, "minimum": np.inf, "multiply": 1.0}


def _input_mask(mask: object, in_shape: tuple, out_shape: tuple) -> np.ndarray | None:
    """A reduction's mask= over its input's shape (AWS's adaptive_avg_pool2d masks the tile it sums): the masked-off
    elements are left out of the reduction. A mask that fits only the output keeps selecting output elements."""
    if mask is None:
        return None
    try:
        mask_array(mask, out_shape)
        return None
    except ValueError:
        return mask_array(mask, in_shape)


def _reduced(fn: alu.Op, data: Tensor, axes: tuple, keepdims: bool, negate: bool,
             mask: np.ndarray | None = None) -> np.ndarray:
    x = _operand(data, fn, mask)
    if mask is not None:
        x = np.where(mask, x, np.float32(_IDENTITY.get(fn.name, 0.0)))
    value = np.asarray(fn.reduce(x, axis=axes, keepdims=keepdims), dtype=F32)
    return -value if negate else value


def reduce_axes(axis: object, data: Tensor, api: str, where: tuple) -> tuple[int, ...]:
    """The free axes to reduce. The v2.26.1 docstring asks for consecutive axes ending at the last one; SDK 2.21
    compiled other free axes (`axis=(1, 3)` of a pooling view, `axis=1` of a 3-D tile) and the hardware reduced
    them, its access pattern ordering the reduced axes innermost (fidelity-cases/reduce_inner_axes.py); NKI 0.3
    (SDK 2.29) enforces the rule [MIG]. The partition axis and more than four axes stay errors [ISA1]."""
    axes = tuple(sorted({int(a) % data.ndim for a in (axis if isinstance(axis, (tuple, list)) else (axis,))}))
    trailing = tuple(range(data.ndim - len(axes), data.ndim))
    if not axes or 0 in axes or len(axes) > 4:
        raise rules.NkiSyntaxError(
            f"{api} reduces up to four free dimensions (e.g. {trailing or (1,)}), got axis {axis}", "reduce_axis",
            where, f"data {data.describe()}",
            hint="the partition dimension (0) cannot be reduced on VectorE; transpose first or use a matmul")
    if axes != trailing:
        rules.later_release(
            runtime.current(), f"{api} over free axes {axes} that do not end at the last one", "reduce_axis", where,
            "NKI 0.3 (Neuron SDK 2.29) and later reduce only consecutive free axes ending at the last one",
            f"data {data.describe()}", hint=f"reshape or permute so the reduced axes come last, e.g. {trailing}",
            error=rules.NkiSyntaxError)
    return axes


def tensor_copy(src: Tensor, *, mask: object = None, dtype: object = None, engine: object = None) -> Tensor:
    run, where = core.begin()
    eng = _elementwise_engine(engine, "vector", (("src", src),), "tensor_copy", run, where)
    m = mask_array(mask, src.shape)
    core.read(run, src, where, mask=m)
    out_dtype = dtypes.as_dtype(dtype) if dtype is not None else src.dtype
    value = core.compute(run, lambda: core.values(src, m) if out_dtype == src.dtype else
                         core.values(src, m).astype(F32))
    out = core.result(run, value, src.shape, out_dtype, "sbuf", where, "tensor_copy", mask=m)
    core.emit(run, eng, "tensor_copy", out, (src,), where)
    return out


def activation(op: object, data: Tensor, *, bias: object = None, scale: object = 1.0, reduce_op: object = None,
               reduce_res: Tensor | None = None, reduce_cmd: object = None, mask: object = None,
               dtype: object = None) -> Tensor:
    run, where = core.begin()
    fn = _op(op, "activation", where)
    if fn.unary is None:
        raise rules.NkiTypeError(f"nl.{fn.name} is not an activation function", "unsupported_op", where)
    _elementwise_engine(None, "scalar", (("data", data),), "activation", run, where)
    _activation_rules(run, fn, bias, reduce_op, where)
    m = mask_array(mask, data.shape)
    core.read(run, data, where, mask=m)
    reads = [data]
    scale_of = _activation_scale(run, data, scale, where, reads)
    bias_of = _activation_bias(run, data, bias, where, reads) if bias is not None else None
    value = core.compute(run, lambda: _activated(fn, core.f32(data, m), scale_of, bias_of))
    out = _finish(run, mask, value, data.shape, dtype, data.dtype, "sbuf", where, "activation")
    attrs = (("func", fn.name),) + ((("reduce", True),) if reduce_res is not None else ())
    seq = core.emit(run, "scalar", "activation", out, tuple(reads), where, attrs=attrs)
    if reduce_res is not None:
        checks.tile(reduce_res, "activation", "reduce_res", where)
        total = core.compute(run, lambda: value.reshape(value.shape[0], -1).sum(axis=1, dtype=F32)
                             .reshape(reduce_res.shape))
        core.write(run, reduce_res, total, where)
        core.also_writes(run, seq, reduce_res)
    return out


def _activation_rules(run, fn: alu.Op, bias: object, reduce_op: object, where: tuple) -> None:
    """The documented rejections of activation's arguments beyond its operands' own checks: the reduction is a sum
    ("reduce_op must be nl.add", ISA6 v2.32.0 nki/api/nki/isa/__init__.py, activation; the nki-spec §1.10.8 rule
    for 0.1), a scalar bias needs NeuronCore-v3 and op=nl.reciprocal takes no bias on NeuronCore-v2
    (Target.activation_scalar_bias / activation_reciprocal_bias: their citations)."""
    if reduce_op is not None and _op(reduce_op, "activation", where).name not in ("add", "sum"):  # (np.sum: AWS's
        # samples pass it, a sum all the same)
        raise rules.NkiValueError(f"activation reduces with nl.add only, got reduce_op=nl."
                                  f"{_op(reduce_op, 'activation', where).name}", "activation_reduce_op", where,
                                  hint="sum with reduce_op=nl.add, or reduce the result with nisa.tensor_reduce")
    tgt = run.target
    if bias is None:
        return
    if not isinstance(bias, Tensor) and not tgt.activation_scalar_bias:
        raise rules.NkiTypeError(f"activation bias must be a (P, 1) vector on {tgt.core} ({tgt.name}); a "
                                 f"compile-time scalar bias needs NeuronCore-v3", "err_activation_bias_scalar_or_vector",
                                 where, f"bias={bias!r}", hint="pass a (P, 1) fp32 tile holding the value")
    if fn.name == "reciprocal" and not tgt.activation_reciprocal_bias:
        raise rules.NkiValueError(f"activation(op=nl.reciprocal) takes no bias on {tgt.core} ({tgt.name})",
                                  "activation_reciprocal_bias", where,
                                  hint="add the bias first (nisa.tensor_scalar), then take the reciprocal")


def _activated(fn: alu.Op, x: np.ndarray, scale_of, bias_of) -> np.ndarray:
    """func(x * scale + bias) in fp32; scale and bias are thunks of a scalar or a (P, 1, ...) column."""
    x = x * scale_of()
    if bias_of is not None:
        x = x + bias_of()
    with np.errstate(all="ignore"):  # inf/NaN propagate as on the engine, without NumPy's warnings to the user
        return fn.unary(x.astype(F32)).astype(F32)


def _activation_scale(run, data: Tensor, scale: object, where: tuple, reads: list):
    """Check the scale operand; return a thunk of its value."""
    if not isinstance(scale, Tensor):
        return lambda: np.float32(scale)
    if scale.dtype != F32:
        raise rules.NkiTypeError(f"activation scale vector must be float32, got {scale.dtype.name}",
                                 "err_activation_scale_invalid_type", where, f"scale {scale.describe()}")
    if scale.free_size != 1 or scale.shape[0] != data.shape[0]:
        raise rules.NkiSyntaxError(f"activation scale must be a scalar or a ({data.shape[0]}, 1) vector, got "
                                   f"shape {tuple(scale.shape)}", "err_activation_scale_scalar_or_vector", where,
                                   f"scale {scale.describe()}")
    checks.tile(scale, "activation", "scale", where)
    reads.append(scale)
    core.read(run, scale, where)
    return lambda: core.f32(scale).reshape((data.shape[0],) + (1,) * (data.ndim - 1))


def _activation_bias(run, data: Tensor, bias: object, where: tuple, reads: list):
    """Check the bias operand; return a thunk of its value."""
    if not isinstance(bias, Tensor):
        return lambda: np.float32(bias)  # scalar bias: accepted on NeuronCore-v3 (trn2)
    if bias.dtype not in (F32, dtypes.float16, dtypes.bfloat16):
        raise rules.NkiTypeError(f"activation bias must be float32, float16 or bfloat16, got {bias.dtype.name}",
                                 "err_activation_bias_invalid_type", where, f"bias {bias.describe()}")
    checks.tile(bias, "activation", "bias", where)
    checks.same_partitions(data, bias, "activation", ("data", "bias"), where)
    if bias.free_size != 1:  # checked, not left to numpy's reshape: a trace-only run never reshapes the values
        raise rules.NkiSyntaxError(f"activation bias must be a scalar or a ({data.shape[0]}, 1) vector, got shape "
                                   f"{tuple(bias.shape)}", "err_activation_bias_scalar_or_vector", where,
                                   f"bias {bias.describe()}")
    reads.append(bias)
    core.read(run, bias, where)
    return lambda: core.f32(bias).reshape((data.shape[0],) + (1,) * (data.ndim - 1))


def iota(expr: object, dtype: object, *, mask: object = None) -> Tensor:
    run, where = core.begin()
    if not isinstance(expr, IndexExpr):
        raise rules.NkiTypeError("iota takes an affine expression of nl.arange/nl.mgrid", "iota_expr", where)
    value = expr.values().astype(np.int32)  # index arithmetic: computed in a trace-only run too (Run.known)
    out = core.result(run, value, expr.shape, dtypes.as_dtype(dtype), "sbuf", where, "iota",
                      mask=mask_array(mask, expr.shape))
    if mask is None:
        run.known.add(out.buf.id)
    core.emit(run, "gpsimd", "iota", out, (), where)
    return out


def memset(shape: tuple, value: object, dtype: object, *, mask: object = None, engine: object = None) -> Tensor:
    run, where = core.begin()
    named = _ENGINE_NAMES.get(engine, getattr(engine, "name", str(engine)))
    if engine is not None and engine != engine_enum.unknown and named not in ("vector", "gpsimd"):
        # "Initialize a tile filled with a compile-time constant value using Vector or GpSimd Engine" (ISA1 v2.26.1
        # and ISA6 v2.32.0 nki/api/nki/isa/__init__.py, memset; engine= "vector ... or gpsimd")
        raise rules.NkiSyntaxError(f"memset runs on the vector or gpsimd engine, not {named}", "engine_choice",
                                   where, hint="pass engine=nisa.vector_engine, or leave engine= out")
    shape = tuple(int(s) for s in shape)
    filled = core.compute(run, lambda: np.full(shape, value, dtype=F32))
    out = core.result(run, filled, shape, dtypes.as_dtype(dtype), "sbuf", where, "memset", mask=mask_array(mask, shape))
    choice = (("engine_choice", True),) if engine is None or engine == engine_enum.unknown else ()
    core.emit(run, _engine(engine, "vector"), "memset", out, (), where, attrs=(("value", float(value)),) + choice)
    return out


def affine_select(pred: Predicate, on_true_tile: Tensor, on_false_value: object, *, mask: object = None,
                  dtype: object = None) -> Tensor:
    run, where = core.begin()
    if isinstance(on_true_tile, Tensor) and on_true_tile.buf.memory == "psum":
        # GpSimdE cannot read PSUM [ISA1 affine_select], yet AWS's own flash attention (nki-samples fc5c69f,
        # reference/attention.py) hands it a PSUM tile and ran on the SDK 2.21-2.26 toolchain: the compiler
        # evacuates the tile to SBUF first, which is what runs here (a VectorE copy, then the select)
        on_true_tile = tensor_copy(on_true_tile)
        run, where = core.begin()
    _elementwise_engine(None, "gpsimd", (("on_true_tile", on_true_tile),), "affine_select", run, where)
    if not isinstance(pred, Predicate):
        raise rules.NkiTypeError("affine_select pred must be an affine comparison of nl.arange/mgrid indices",
                                 "affine_select_pred", where)
    cond = np.broadcast_to(pred.evaluate(), on_true_tile.shape)  # index arithmetic: a trace-only run checks it too
    core.read(run, on_true_tile, where)
    value = core.compute(run, lambda: np.where(cond, core.f32(on_true_tile),
                                               np.float32(on_false_value)).astype(F32))
    out = _finish(run, mask, value, on_true_tile.shape, dtype, on_true_tile.dtype, "sbuf", where, "affine_select")
    core.emit(run, "gpsimd", "affine_select", out, (on_true_tile,), where)
    return out


# The less common instructions live in isa_extra.py; imported last because they build on the helpers above.
from tilec.nki.isa_extra import (bn_aggr, bn_stats, scalar_tensor_tensor, select_reduce,  # noqa: E402,F401
                                 tensor_copy_predicated, tensor_partition_reduce, tensor_tensor_scan)
from tilec.nki.isa_more import (activation_reduce, dropout, local_gather, max8, nc_find_index8, nc_match_replace8,  # noqa: E402,F401
                                nc_stream_shuffle, range_select, reciprocal,
                                sequence_bounds, tensor_copy_dynamic_src, tensor_scalar_reduce)
