"""NKI data types (`nl.float32`, `nl.bfloat16`, `nl.float8_e4m3`, ...) as numpy dtypes, and the type promotion rules
of nki.api.shared (spec §1.5).

Low-precision floats are real `ml_dtypes` dtypes, so storing into a bf16/fp8 tile rounds exactly like the hardware
(round-to-nearest-even); the AWS 0.1 simulator computes them in fp32 instead (spec §4.1), tilec does not.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
tfloat32 = np.dtype(np.float32)  # storage is 4 bytes; TensorE reads 10 mantissa bits (not modelled)
float32r = np.dtype(np.float32)
int8, uint8 = np.dtype(np.int8), np.dtype(np.uint8)
int16, uint16 = np.dtype(np.int16), np.dtype(np.uint16)
int32, uint32 = np.dtype(np.int32), np.dtype(np.uint32)
bool_ = np.dtype(np.uint8)  # NKI stores bool as uint8

FLOATS = (float32, float16, bfloat16, float8_e4m3, float8_e5m2)
SUPPORTED = frozenset(FLOATS + (int8, uint8, int16, uint16, int32, uint32))  # what an HBM argument may hold
_FP8 = (float8_e4m3, float8_e5m2)

# numpy types a user may hand in, mapped to the storage NKI would use (NKI has no 64-bit types)
_HOST_MAP = {np.dtype(np.float64): float32, np.dtype(np.int64): int32, np.dtype(np.uint64): uint32,
             np.dtype(np.bool_): bool_}


def as_dtype(dtype: object) -> np.dtype:
    """Any dtype spelling (nl.float16, np.float16, 'bfloat16', ml_dtypes type) -> numpy dtype."""
    if isinstance(dtype, str) and hasattr(ml_dtypes, dtype):
        return np.dtype(getattr(ml_dtypes, dtype))
    return np.dtype(dtype)


def storage_dtype(dtype: np.dtype) -> np.dtype:
    return _HOST_MAP.get(np.dtype(dtype), np.dtype(dtype))


def is_float(dtype: np.dtype) -> bool:
    return dtype in FLOATS or dtype.kind == "f"


def name(dtype: np.dtype) -> str:
    return np.dtype(dtype).name


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """Result dtype of an arithmetic op on two tiles (nki.api.shared 'type promotion')."""
    if a == b:
        return a
    fa, fb = is_float(a), is_float(b)
    if fa != fb:
        return a if fa else b
    if fa:
        return _promote_float(a, b)
    return _promote_int(a, b)


def _promote_float(a: np.dtype, b: np.dtype) -> np.dtype:
    pair = {a, b}
    if pair == {float16, bfloat16}:
        return float32
    if pair == set(_FP8):
        return bfloat16
    if a in _FP8 or b in _FP8:
        return b if a in _FP8 else a
    return a if a.itemsize >= b.itemsize else b


def _promote_int(a: np.dtype, b: np.dtype) -> np.dtype:
    if {a, b} == {int32, uint32}:
        return float32  # no int64 on the device
    return np.promote_types(a, b)


def scalar_dtype(value: object) -> np.dtype:
    """Weak Python scalars promote as the widest type of their kind (bool->uint8, int->int32, float->fp32)."""
    if isinstance(value, np.generic):
        return storage_dtype(value.dtype)
    if isinstance(value, bool):
        return uint8
    if isinstance(value, int):
        return int32
    return float32
