"""The hardware and API rules each NKI call is checked against (spec §1.3-1.11, §2.2), one function per rule.

Messages use NKI's own wording where the spec quotes one (e.g. "number of partitions 256 exceed architecture
limitation of 128") and always name the tile, its buffer and shape; `rules.NkiError` adds the kernel file:line.
"""
from __future__ import annotations

import math

import numpy as np

from tilec.nki import rules, runtime
from tilec.patterns import canonical

_ON_CHIP = ("sbuf", "psum")


def _desc(t: object) -> str:
    return t.describe()


# ---- allocation and capacity ----
def new_tile(run: object, shape: tuple, dtype: np.dtype, memory: str, name: str, where: tuple,
             blocks: int = 0) -> None:
    """`shape` is stored partition-first; its `blocks` dimensions after the partition one are block dimensions,
    each index of which is a tile of its own (spec §1.4), so the PSUM bank limit applies to one block's tile."""
    if memory == "hbm":
        return
    tgt = run.target
    if shape and shape[0] > tgt.pmax:
        raise rules.NkiSyntaxError(
            f"number of partitions {shape[0]} exceed architecture limitation of {tgt.pmax}",
            "err_num_partition_exceed_arch_limit", where, f"tile '{name}' of shape {tuple(shape)} in {memory}",
            hint=f"the first (partition) dimension of an SBUF/PSUM tile is at most {tgt.pmax}; loop over chunks "
                 f"of {tgt.pmax} rows")
    bpp = math.prod(shape[1 + blocks:]) * np.dtype(dtype).itemsize
    if memory == "psum" and bpp > tgt.psum_bank_bytes:
        raise rules.NkiSyntaxError(
            f"PSUM tile needs {bpp} bytes per partition, more than one {tgt.psum_bank_bytes}-byte PSUM bank",
            "psum_tile_exceeds_bank", where, f"tile '{name}' of shape {tuple(shape)}, {np.dtype(dtype).name}",
            hint=f"a PSUM tile holds at most {tgt.psum_fmax} fp32 per partition (nl.tile_size.psum_fmax); "
                 "split the free dim")


def psum_banks(tgt: object, stored: tuple, itemsize: int, blocks: int) -> int:
    """PSUM banks a tensor occupies: a tile never crosses a bank boundary [ALLOC v2.26.1 "Known Limitations" 3: "A
    PSUM tile cannot cross bank boundaries"; nki.compiler.psum.alloc: "a physical PSUM tile cannot span multiple PSUM
    banks"], so each block of an NKI 0.1 block tensor (B, par_dim(P), F) is a tile of its own in some bank: as many
    blocks as fit whole share one bank (direct allocation places one per bank, psum.mod_alloc; automatic allocation
    is not documented, this is its least)."""
    if not blocks:
        return 1
    n = math.prod(stored[1:1 + blocks])
    tile = max(1, math.prod(stored[1 + blocks:]) * itemsize)
    per_bank = max(1, tgt.psum_bank_bytes // tile)
    return -(-n // per_bank)


def psum_address(run: object, address: object, shape: tuple, name: str, where: tuple) -> None:
    """NKI 0.6 `nl.ndarray(..., buffer=nl.psum, address=(partition, free))`: "The allocation for PSUM tensors must
    start at the beginning of each bank — the compiler will throw an error otherwise" (MIG v2.32.0
    nki/migration/index.rst, "Improved allocation API"). The free offset of a PSUM address is in bytes: the same
    section's example puts a (128, 1024) bf16 tensor "on bank 3" with address=(0, bank_id * 2048), which in bf16
    elements would be bank 6. The partition offset is a partition lane, as for SBUF."""
    tgt = run.target
    if not (isinstance(address, tuple) and len(address) == 2 and all(isinstance(x, (int, np.integer))
                                                                       for x in address)):
        raise rules.NkiTypeError(
            f"address of PSUM tensor '{name}' must be a (partition offset, free offset) pair of integers, got "
            f"{address!r}", "psum_address", where, hint="address=(0, bank * 2048) places it at the start of a bank")
    part, free = (int(x) for x in address)
    bank = tgt.psum_bank_bytes
    if free % bank or not 0 <= free < tgt.psum_bytes:
        raise rules.MemoryRuleError(
            f"PSUM tensor '{name}' must start at the beginning of a bank: free offset {free} is not one of the "
            f"{tgt.psum_banks} bank starts 0, {bank}, ..., {tgt.psum_bytes - bank} (bytes)", "psum_address", where,
            f"address={address!r}, shape {tuple(shape)}",
            hint=f"use address=(0, bank * {bank}) with bank in 0..{tgt.psum_banks - 1}")
    if part < 0 or part + (shape[0] if shape else 1) > tgt.pmax:
        raise rules.MemoryRuleError(
            f"PSUM tensor '{name}' at partition offset {part} with {shape[0] if shape else 1} partitions exceeds the "
            f"{tgt.pmax} partitions", "psum_address", where, f"address={address!r}, shape {tuple(shape)}",
            hint="the partition offset plus the partition dimension must be at most 128")


def psum_capacity(run: object, buf: object) -> None:
    banks = run.target.psum_banks
    used = sum(run.psum_bank_count.get(i, 1) for i in run.psum_live)
    need = run.psum_bank_count.get(buf.id, 1)
    if used + need > banks:
        live = ", ".join(f"'{n}'" for n in run.psum_live.values())
        what = f"{len(run.psum_live) + 1} PSUM tiles" if used + need == len(run.psum_live) + 1 else \
            f"{used + need} PSUM banks (its {need} blocks each a tile of their own)"
        raise rules.MemoryRuleError(
            f"PSUM has {banks} banks of {run.target.psum_bank_bytes} bytes per partition; allocating '{buf.name}' "
            f"would make {what} live at once", "psum_bank_overflow", buf.where,
            f"live PSUM tiles: {live}" if live else f"'{buf.name}' alone",
            hint="evacuate PSUM to SBUF (tensor_copy) and allocate PSUM tiles inside the loop body so they die "
                 "each iteration")


def sbuf_capacity(run: object, buf: object) -> None:
    tgt = run.target
    if run.sbuf_used + buf.bpp > tgt.sbuf_usable:
        raise rules.MemoryRuleError(
            f"SBUF usage per partition exceeds the usable {tgt.sbuf_usable} bytes of {tgt.name}: "
            f"{run.sbuf_used} bytes live + {buf.bpp} bytes for '{buf.name}'", "sbuf_capacity", buf.where,
            f"tile '{buf.name}' of shape {tuple(buf.shape)}, {buf.dtype.name}; {len(run.sbuf_live)} SBUF tiles live",
            hint="use smaller tiles or allocate them inside the loop body that uses them")


# ---- memory state ----
def dead(t: object, where: tuple) -> None:
    raise rules.ScopeError(
        f"tile '{t.buf.name}' is used outside the loop iteration that allocated it",
        "err_local_variable_used_out_of_scope", where, f"tensor {_desc(t)}, allocated at line {t.buf.where[1]}",
        hint="a tile allocated inside a loop body lives for one iteration; allocate it before the loop")


def unwritten(t: object, written: np.ndarray, where: tuple) -> None:
    index = [int(i) for i in np.argwhere(~written)[0]]
    raise rules.UninitializedReadError(
        f"read of memory that was never written: element {index} of {_desc(t)}", "uninitialized_read", where,
        f"tile '{t.buf.name}' allocated at line {t.buf.where[1]}",
        hint="on hardware this reads garbage; write the tile first (nl.zeros for accumulators) or fix the bounds")


# ---- operands ----
def tile(t: object, api: str, role: str, where: tuple) -> None:
    from tilec.nki.tensor import Tensor

    if not isinstance(t, Tensor):
        raise rules.NkiTypeError(f"operand '{role}' of '{api}' must be a tile, got {type(t).__name__}",
                                 "operand_type", where, hint="pass an SBUF/PSUM tile")
    if t.buf.memory not in _ON_CHIP:
        raise rules.MemoryRuleError(
            f"Expected operand '{role}' of '{api}' to be in address space 'sbuf' or 'psum', but got a tile in "
            f"'{t.buf.memory}' instead", "err_unsupported_memory", where, f"tensor {_desc(t)}",
            hint="load HBM data into SBUF first (nisa.dma_copy)")
    partition_first(t, api, role, where)
    partition_start(t, api, role, where)
    free_pattern(t, api, role, where)


def free_pattern(t: object, api: str, role: str, where: tuple) -> None:
    """An engine operand's free access pattern has at most the target's `ap_free_dims` dimensions once unit ones
    are dropped and contiguous neighbours merged (v2.32.0 nki/deep-dives/nki-aps.rst: "up to four-dimensional
    arrays" per partition; nki-spec §1.6); its strides are free, so windows may overlap (an NKI 0.1 advanced index
    `t[i_p, s*i_o + i_k]`, a 0.6 `.ap([[F, P], [s, O], [1, K]])`)."""
    run = runtime.active()
    if run is None or len(t.shape) < 2:
        return
    dims = canonical(tuple(t.shape[1:]), tuple(t.strides[1:]))[0]
    limit = run.target.ap_free_dims
    if len(dims) > limit:
        raise rules.NkiSyntaxError(
            f"operand '{role}' of '{api}' walks {len(dims)} free dimensions {tuple(dims)}; an access pattern has at "
            f"most {limit} per partition", "access_pattern_dims", where,
            f"view of shape {tuple(t.shape)} of {_desc(t)}",
            hint="merge contiguous dimensions, or split the instruction along an outer dimension")


def pattern_limits(t: object, api: str, role: str, where: tuple, target: object) -> None:
    """An on-chip operand (of any instruction or DMA) whose free dimension holds more elements than an
    access-pattern dimension can count (target.ap_dim_max, a uint16 size) or steps further than its stride can say
    (ap_stride_max, an int16; a dimension of one element has no step). The twin of `free_pattern`, which counts
    an engine operand's dimensions."""
    limit, step = target.ap_dim_max, target.ap_stride_max
    if t.buf.memory == "hbm" or len(t.shape) < 2 or (max(t.shape[1:]) <= limit
                                                     and max(map(abs, t.strides[1:])) <= step):
        return
    for dim in range(1, len(t.shape)):
        n, s = t.shape[dim], t.strides[dim]
        if n > limit:
            raise rules.NkiSyntaxError(
                f"free dimension {dim} of the {role} of '{api}' has {n} elements; an access-pattern dimension "
                f"counts at most {limit} (a uint16 size)", "access_pattern_dim_size", where,
                f"{role} {t.describe()}",
                hint="split the dimension in two (reshape the tile), or the instruction in two")
        if n > 1 and not -step - 1 <= s <= step:
            raise rules.NkiSyntaxError(
                f"free dimension {dim} of the {role} of '{api}' steps by {s} elements; an access-pattern stride is "
                f"at most {step} (an int16)", "access_pattern_stride", where, f"{role} {t.describe()}",
                hint="lay the tile out so the dimension steps less far (split the dimension it steps over)")


# An engine access starts at a partition the quadrant wiring allows: 64 < P <= 128 -> 0; 32 < P <= 64 -> 0 or 64;
# P <= 32 -> 0, 32, 64 or 96 (spec §1.6 [ARCH2, ALLOC]). DMA is not bound by it. Tiles are taken to start at
# partition 0, so the offset of the view inside its tile is the start partition.
def _allowed_starts(count: int) -> tuple[int, ...]:
    return (0,) if count > 64 else (0, 64) if count > 32 else (0, 32, 64, 96)


def partition_start(t: object, api: str, role: str, where: tuple) -> None:
    ps = t.buf.pstride
    if t.buf.memory == "hbm" or not t.shape or not ps or t.strides[0] == 0:
        return  # a partition broadcast reads one partition; its wiring is the broadcast's own
    start, count = t.off // ps, (t.shape[0] if t.strides[0] == ps else 1)
    allowed = _allowed_starts(count)
    if start not in allowed:
        raise rules.NkiSyntaxError(
            f"operand '{role}' of '{api}' starts at partition {start}; an access of {count} partition(s) must "
            f"start at partition {' or '.join(map(str, allowed))}", "partition_start_alignment", where,
            f"view of shape {tuple(t.shape)} of {_desc(t)}",
            hint="engines reach partitions in quadrants of 32; use a separate tile for these rows, or move them "
                 "to an allowed start with a DMA (nisa.dma_copy)")


def partition_first(t: object, api: str, role: str, where: tuple) -> None:
    ps = t.buf.pstride
    shape, strides = t.shape, t.strides
    p_ok = bool(shape) and (shape[0] == 1 or strides[0] in (ps, 0))
    free_ok = all(n == 1 or s == 0 or abs(s) < ps for n, s in zip(shape[1:], strides[1:]))
    if free_ok and shape[0] > 1 and strides[0] % ps == 0 and strides[0] > ps:
        raise rules.NkiSyntaxError(
            f"operand '{role}' of '{api}' steps over partitions by {strides[0] // ps}; an access covers a "
            "contiguous range of partitions", "partition_stride", where,
            f"view of shape {tuple(t.shape)} of {_desc(t)}",
            hint="engines have no partition stride: gather the rows into a tile with a DMA (nisa.dma_copy) or "
                 "lay the data out so they are contiguous")
    if free_ok and shape[0] > 1 and strides[0] < 0 and t.buf.memory != "hbm":
        raise rules.NkiSyntaxError(
            f"operand '{role}' of '{api}' walks its partitions backwards; an access covers a contiguous, ascending "
            "range of partitions", "partition_stride", where, f"view of shape {tuple(t.shape)} of {_desc(t)}",
            hint="engines have no partition stride: reverse the rows on the way in, in the DMA that loads them")
    bad = not (p_ok and free_ok)
    if bad:
        raise rules.NkiSyntaxError(
            f"operand '{role}' of '{api}': the partition dimension must be the first dimension of a tile",
            "err_failed_to_infer_tile_from_local_tensor", where, f"view of shape {tuple(t.shape)} of {_desc(t)}",
            hint="index the partition dimension first, e.g. t[0:128, ...]")


def engine_reads(engine: str, t: object, api: str, role: str, where: tuple) -> None:
    if engine == "tensor" and t.buf.memory != "sbuf":
        raise rules.MemoryRuleError(
            f"TensorE reads only SBUF: operand '{role}' of '{api}' is in {t.buf.memory}", "engine_memory_access",
            where, f"tensor {_desc(t)}", hint="copy it to SBUF first (nisa.tensor_copy)")
    if engine == "gpsimd" and t.buf.memory == "psum":
        raise rules.MemoryRuleError(
            f"GpSimdE cannot access PSUM: operand '{role}' of '{api}' is in psum", "engine_memory_access", where,
            f"tensor {_desc(t)}", hint="use the vector engine, or copy the data to SBUF first")


def engine_writes(engine: str, api: str, dst: object, where: tuple) -> None:
    mem = dst.buf.memory
    bad = (engine == "tensor" and mem != "psum") or (engine in ("gpsimd",) and mem == "psum") or \
          (engine == "dma" and mem == "psum") or (engine in ("vector", "scalar", "gpsimd") and mem == "hbm")
    if bad:
        what = {"tensor": "TensorE writes only PSUM", "gpsimd": "GpSimdE cannot access PSUM",
                "dma": "dma_copy cannot access PSUM", "vector": "VectorE cannot write HBM",
                "scalar": "ScalarE cannot write HBM"}[engine if not (engine == "gpsimd" and mem == "hbm") else "vector"]
        raise rules.MemoryRuleError(f"{what}: the result of '{api}' cannot be stored into a tile in {mem}",
                                    "engine_memory_access", where, f"destination {_desc(dst)}",
                                    hint="store to HBM with nisa.dma_copy from SBUF; evacuate PSUM with "
                                         "nisa.tensor_copy")


def same_partitions(a: object, b: object, api: str, roles: tuple, where: tuple) -> None:
    if a.shape[0] != b.shape[0]:
        raise rules.NkiSyntaxError(
            f"number of partitions mismatch in '{api}': '{roles[0]}' has {a.shape[0]}, '{roles[1]}' has "
            f"{b.shape[0]}", "err_num_partition_mismatch", where, f"{roles[0]} {_desc(a)}; {roles[1]} {_desc(b)}",
            hint="operands must span the same partitions; broadcast explicitly")


def free_limit(t: object, engine: str, api: str, role: str, run: object, where: tuple) -> None:
    tgt = run.target
    limit = tgt.vector_psum_fmax if t.buf.memory == "psum" else tgt.vector_sbuf_fmax
    if t.free_size > limit:
        raise rules.NkiSyntaxError(
            f"free size {t.free_size} of operand '{role}' of '{api}' exceeds the {engine} engine limit of {limit} "
            f"elements per partition from {t.buf.memory}", "engine_free_size_limit", where, f"tensor {_desc(t)}",
            hint="split the free dimension into several instructions")


def psum_operands(a: object, b: object, api: str, where: tuple) -> None:
    if a.buf.memory == "psum" and b.buf.memory == "psum":
        raise rules.MemoryRuleError(
            f"'{api}' can read at most one operand from PSUM; both are in psum", "tensor_tensor_psum_operands",
            where, f"data1 {_desc(a)}; data2 {_desc(b)}", hint="copy one operand to SBUF first")


def matmul(run: object, stationary: object, moving: object, where: tuple) -> None:
    matmul_dtypes(stationary, moving, where)
    tgt = run.target
    k, k2 = stationary.shape[0], moving.shape[0]
    m, n = stationary.free_size, moving.free_size
    if k == k2 and m <= tgt.stationary_fmax and n <= tgt.moving_fmax:
        return
    pair = f"stationary {_desc(stationary)}; moving {_desc(moving)}"
    if k != k2:
        raise rules.NkiSyntaxError(
            f"nc_matmul contraction mismatch: stationary has {k} partitions, moving has {k2}",
            "matmul_contraction_mismatch", where, pair, hint="both operands carry the contraction dim on partitions")
    if m > tgt.stationary_fmax:
        raise rules.NkiSyntaxError(
            f"nc_matmul stationary free size {m} exceeds gemm_stationary_fmax {tgt.stationary_fmax}",
            "matmul_stationary_size", where, pair, hint="the stationary tile is at most 128 x 128")
    if n > tgt.moving_fmax:
        raise rules.NkiSyntaxError(
            f"nc_matmul moving free size {n} exceeds gemm_moving_fmax {tgt.moving_fmax}", "matmul_moving_size",
            where, pair, hint="the moving tile is at most 128 x 512; split N into several matmuls")


def matmul_input_dtypes(stationary: object, moving: object, where: tuple) -> None:
    """"The nc_matmul instruction currently supports float8_e4m3/float8_e5m2/bfloat16/float16/tfloat32/float32 input
    data types" (ISA1 v2.26.1 nki/api/nki/isa/__init__.py, nc_matmul; the same list in ISA6 v2.32.0, which adds
    float8_e4m3fn from NeuronCore-v4): an integer operand is refused (tfloat32 is stored as float32 here)."""
    from tilec.nki import dtypes

    for role, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in dtypes.FLOATS:
            raise rules.NkiTypeError(
                f"nc_matmul {role} is {t.dtype.name}; TensorE multiplies float8_e4m3, float8_e5m2, bfloat16, "
                "float16, tfloat32 or float32 inputs", "matmul_input_dtype", where, f"{role} {_desc(t)}",
                hint="convert it first (nisa.tensor_copy into a bfloat16 or float32 tile)")


def matmul_dtypes(stationary: object, moving: object, where: tuple) -> None:
    """Spec §1.10.2 (NKI 0.5 doc): if one input is fp32/tf32 the other must be too (tf32 is stored as float32 here,
    so the two are one dtype to this check)."""
    wide = [t.dtype == np.float32 for t in (stationary, moving)]
    if wide[0] == wide[1]:
        return
    raise rules.NkiTypeError(
        f"nc_matmul operands must both be fp32/tf32 when one is: stationary is {stationary.dtype.name}, moving is "
        f"{moving.dtype.name}", "matmul_fp32_operands", where, f"stationary {_desc(stationary)}; moving "
        f"{_desc(moving)}", hint="cast the other operand to float32 (e.g. with nisa.tensor_copy(x, dtype=nl.float32))"
        " or both to a 16-bit type")


def dma(src: object, dst: object, where: tuple) -> None:
    for role, t in (("src", src), ("dst", dst)):
        if t.buf.memory == "psum":
            raise rules.MemoryRuleError(
                f"dma_copy cannot access PSUM: operand '{role}' is in psum", "dma_psum_access", where,
                f"tensor {_desc(t)}", hint="copy PSUM to SBUF with nisa.tensor_copy before the DMA")
    if src.size != dst.size:
        raise rules.NkiSyntaxError(
            f"dma_copy element counts differ: src has {src.size}, dst has {dst.size}", "dma_shape_mismatch", where,
            f"src {_desc(src)} view {tuple(src.shape)}; dst {_desc(dst)} view {tuple(dst.shape)}")
    for role, t in (("src", src), ("dst", dst)):
        if t.buf.memory == "sbuf":
            partition_first(t, "dma_copy", role, where)
    negative_dma_stride(src, dst, where)


def negative_dma_stride(src: object, dst: object, where: tuple) -> None:
    """NKI 0.1's era (Neuron SDK 2.26) ran DMA access patterns with a negative stride wrongly: Neuron Runtime 2.33
    (SDK 2.32 release notes, runtime bug fixes) "fixed incorrect data movement for negative-stride DMA access
    patterns on Trn1 and Trn2, where the descriptor generator previously computed addresses with an unsigned step".
    A 0.1 kernel that relies on one is refused; a 0.6 kernel (SDK 2.29+, the fixed runtime) may use them."""
    if getattr(getattr(src.buf, "run", None), "api", "0.1") == "0.6":
        return
    for role, t in (("src", src), ("dst", dst)):
        if any(s < 0 and n > 1 for n, s in zip(t.shape, t.strides)):
            raise rules.NkiSyntaxError(
                f"dma_copy operand '{role}' walks memory backwards (a negative stride); runtimes before Neuron "
                "Runtime 2.33 move such patterns to the wrong addresses", "dma_negative_stride", where,
                f"view of shape {tuple(t.shape)} strides {tuple(t.strides)} of {_desc(t)}",
                hint="reverse the rows with an indirect DMA (an index tile from nisa.iota), or reverse on chip")


def retarget(run: object, instr: object, dst: object, where: tuple) -> None:
    engine_writes(instr.engine, instr.op, dst, where)
    if dst.buf.memory != "hbm":
        partition_first(dst, instr.op, "dst", where)
        partition_start(dst, instr.op, "dst", where)


def assign_shapes(dst: object, src: object, where: tuple) -> None:
    try:
        ok = src.size <= dst.size and (src.size == dst.size or
                                       np.broadcast_shapes(tuple(src.shape), tuple(dst.shape)) == tuple(dst.shape))
    except ValueError:
        ok = False
    if not ok:
        raise rules.NkiSyntaxError(
            f"assignment destination shape {tuple(dst.shape)} is smaller than the source shape {tuple(src.shape)}",
            "err_store_dst_shape_smaller_than_other_shape", where, f"dst {_desc(dst)}; src {_desc(src)}")


def accumulate(run: object, dst: object, value: object, where: tuple) -> None:
    from tilec.nki.core import is_fresh

    ok = is_fresh(value) and run.instrs[value.buf.instr].op == "nc_matmul" and dst.buf.memory == "psum"
    if not ok:
        raise rules.NkiSyntaxError(
            "'+=' is only supported for accumulating nc_matmul results into a PSUM tile", "psum_accumulate_only",
            where, f"destination {_desc(dst)}",
            hint="write acc += nisa.nc_matmul(a, b) with acc = nl.zeros(..., buffer=nl.psum); for other updates "
                 "assign dst[...] = nl.add(dst, x)")
    if value.size != dst.size:
        raise rules.NkiSyntaxError(
            f"'+=' shape mismatch: accumulator {tuple(dst.shape)} vs matmul result {tuple(value.shape)}",
            "psum_accumulate_shape", where, f"destination {_desc(dst)}")
