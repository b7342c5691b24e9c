"""Public entry points of the NKI interpreter (the contract in the briefing):

    simulate(kernel_fn, *arrays, **kwargs) -> outputs            like nki.simulate_kernel
    simulate_traced(kernel_fn, *arrays, numerics=True, **kwargs) -> (outputs, Trace)
                                                                  numerics=False: trace-only (see simulate_traced)
    load_kernel_file(path, name) -> kernel                        imports a .py kernel file with the shim active
    run_file(path, kernel, inputs, ...) -> (outputs, Trace)       what `tilec nki-run` does
    random_inputs(specs, seed) -> dict of arrays                  from "a=128x512:float16" shape specs
    written_arguments(trace, inputs) -> dict of arrays            arguments the kernel wrote in place
"""
from __future__ import annotations

import importlib.util
import inspect
import pathlib
import sys
import types

import numpy as np

from tilec.nki import dtypes, shim
from tilec.nki.kernel import as_kernel, launch
from tilec.errors import KernelError
from tilec.nki.rules import NkiError
from tilec.trace import Trace


def simulate(kernel_fn: object, *arrays: object, target: str | None = None, strict: bool = False,
             **kwargs: object) -> object:
    outputs, _ = simulate_traced(kernel_fn, *arrays, target=target, strict=strict, **kwargs)
    return outputs


def simulate_traced(kernel_fn: object, *arrays: object, target: str | None = None, numerics: bool = True,
                    strict: bool = False, **kwargs: object) -> tuple[object, Trace]:
    """Run the kernel on the interpreter; return its outputs and its instruction trace.

    numerics=False is a trace-only run, for callers that need only the trace (the auto-tuner's performance model):
    every hardware rule is still enforced and the trace equals the full run's, but no arithmetic or data copy is
    done, so the returned outputs hold unspecified values (whatever the fresh memory held) and arguments the kernel
    writes are left unchanged. A kernel whose addresses depend on tensor values (indirect DMA) raises NkiError
    [trace_only_needs_values] instead of running.

    strict=True holds the kernel to the rules of later releases too: what SDK 2.21-2.26 accepted and later releases
    forbid (rules.later_release) is an error instead of a warning. tilec's compiler runs its own kernels so."""
    shim.install()
    return launch(kernel_fn, arrays, kwargs, target=target, numerics=numerics, strict=strict)


_loaded: dict[tuple[str, int], object] = {}  # (path, mtime) -> module: a file is executed once until it changes


def load_kernel_file(path: str | pathlib.Path, name: str, force_interpreter: bool = False) -> object:
    """Import `path` as a module (with `import neuronxcc.nki` served by tilec if needed) and return `name`.
    force_interpreter=True serves tilec's interpreter even where the real neuronxcc is installed."""
    shim.install(force=True if force_interpreter else None)
    path = pathlib.Path(path).resolve()
    module = _kernel_module(path)
    if not callable(getattr(module, name, None)):
        found = [k for k, v in vars(module).items() if _is_kernel(v)]
        raise NkiError(f"{path.name} has no kernel named '{name}'", "kernel_name", None,
                       f"kernels in {path}: {', '.join(found) or 'none'}", hint="pick one with --kernel NAME")
    return getattr(module, name)


def kernel_names(path: str | pathlib.Path) -> list[str]:
    """The @nki.jit kernels a .py file defines, in definition order (the file imported as load_kernel_file does)."""
    shim.install(force=True)
    return [k for k, v in vars(_kernel_module(pathlib.Path(path).resolve())).items() if _is_kernel(v)]


def _kernel_module(path: pathlib.Path) -> types.ModuleType:
    """The kernel file imported as a module, once per version of the file (cached by path and mtime)."""
    _check_kernel_path(path)
    key = (str(path), path.stat().st_mtime_ns)
    module = _loaded.get(key)
    if module is None:
        module = _loaded[key] = _import_file(path)
    return module


def _check_kernel_path(path: pathlib.Path) -> None:
    if not path.is_file():
        raise NkiError(f"kernel file {path} does not exist", "kernel_file", None,
                       hint="give the path of a Python file with @nki.jit kernels")
    if path.suffix != ".py":
        hint = ("a .tl program runs with `tilec run`, or compile it with `tilec compile`" if path.suffix == ".tl"
                else "NKI kernels live in .py files")
        raise NkiError(f"{path.name} is not a Python file", "kernel_file", None, hint=hint)


def _import_file(path: pathlib.Path) -> object:
    """Execute a kernel file as a module; an error in it is reported at its file:line, without a traceback."""
    module_name = f"tilec_kernel_{path.stem}_{abs(hash(str(path))) % 10**8}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        raise NkiError(f"syntax error in the kernel file: {exc.msg}", "kernel_file",
                       (exc.filename or str(path), exc.lineno or 0)) from None
    except KernelError:
        raise
    except Exception as exc:  # noqa: BLE001  (whatever the user's module raises is the user's to fix)
        raise NkiError(f"importing the kernel file raised {type(exc).__name__}: {exc}", "kernel_file",
                       _kernel_frame(exc, str(path)) or (str(path), 0)) from None
    return module


def _is_kernel(value: object) -> bool:
    from tilec.nki.kernel import Kernel

    return isinstance(value, Kernel)


def random_inputs(specs: dict[str, tuple[tuple[int, ...], str]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in specs.items():
        dt = dtypes.as_dtype(dtype)
        values = rng.random(shape, dtype=np.float32)
        out[name] = values.astype(dt) if dt.kind != "i" and dt.kind != "u" else (values * 100).astype(dt)
    return out


def parse_shape_spec(spec: str) -> tuple[str, tuple[tuple[int, ...], str]]:
    """'a=128x512:float16' -> ('a', ((128, 512), 'float16')); dtype defaults to float32."""
    name, _, rest = spec.partition("=")
    dims, _, dtype = rest.partition(":")
    if not name.isidentifier() or not dims:
        raise ValueError(f"bad shape spec {spec!r}; write NAME=DIMxDIM[:dtype], e.g. a=128x512:float16")
    parts = dims.lower().split("x")
    from tilec.lang.api import DTYPES  # the .tl spellings (f32, f16, bf16) name the same dtypes
    dtype = DTYPES.get(dtype, dtype)
    if not all(d.isdigit() and int(d) > 0 for d in parts):
        raise ValueError(f"bad shape {dims!r} in {spec!r}; dimensions are positive integers joined by 'x'")
    try:
        dtypes.as_dtype(dtype or "float32")
    except TypeError:
        raise ValueError(f"unknown dtype {dtype!r} in {spec!r}; use float32, float16, bfloat16 (or f32, f16, "
                         "bf16), float8_e4m3, int32, ...") from None
    return name, (tuple(int(d) for d in parts), dtype or "float32")


def run_file(path: str, kernel: str, inputs: dict[str, object], target: str | None = None) -> tuple[object, Trace]:
    """What `tilec nki-run` does: always on tilec's interpreter, also where neuronxcc is installed."""
    fn = load_kernel_file(path, kernel, force_interpreter=True)
    _check_inputs(fn, kernel, inputs)
    try:
        return simulate_traced(fn, target=target, **inputs)
    except KernelError:
        raise
    except _USER_ERRORS as exc:
        raise NkiError(f"the kernel raised {type(exc).__name__}: {exc}", "kernel_exception",
                       _kernel_frame(exc, path)) from exc


# what a kernel's own Python code raises when it is given inputs it does not expect (its asserts, unpacking, ...)
_USER_ERRORS = (ArithmeticError, AssertionError, AttributeError, LookupError, NameError, RecursionError, TypeError,
                ValueError)


def _check_inputs(fn: object, kernel: str, inputs: dict[str, object]) -> None:
    """Every parameter without a default has an input, and every input names a parameter."""
    params = inspect.signature(as_kernel(fn).func).parameters
    signature = f"kernel {kernel}({', '.join(params)}); given: {', '.join(inputs) or 'nothing'}"
    missing = [p for p, v in params.items() if p not in inputs and v.default is inspect.Parameter.empty
               and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)]
    if missing:
        raise NkiError(f"no input given for kernel parameter(s) {', '.join(missing)}", "kernel_inputs", None,
                       signature, hint="name each input after its parameter (--shape NAME=AxB, or .npz keys)")
    unknown = [n for n in inputs if n not in params]
    if unknown and not any(v.kind == v.VAR_KEYWORD for v in params.values()):
        raise NkiError(f"kernel {kernel} has no parameter(s) {', '.join(unknown)}", "kernel_inputs", None,
                       signature, hint="name each input after its parameter (--shape NAME=AxB, or .npz keys)")


def _kernel_frame(exc: BaseException, path: str) -> tuple[str, int] | None:
    """The innermost traceback frame in the kernel file: where the user's code failed."""
    target = str(pathlib.Path(path).resolve())
    where = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == target:
            where = (target, tb.tb_lineno)
        tb = tb.tb_next
    return where


def summary(kernel: str, outputs: object, trace: Trace, inputs: dict[str, object] | None = None) -> str:
    """A short human-readable report of one run: outputs and instruction counts per engine."""
    lines = [f"kernel {kernel}: {len(trace.instrs)} instructions on tilec's NKI interpreter ({trace.target})"]
    per_engine: dict[str, int] = {}
    for ins in trace.instrs:
        per_engine[f"{ins.engine}:{ins.op}"] = per_engine.get(f"{ins.engine}:{ins.op}", 0) + 1
    for key in sorted(per_engine):
        lines.append(f"  {key:<28} {per_engine[key]}")
    dma = [i for i in trace.instrs if i.engine == "dma"]
    if dma:
        lines.append(f"  dma bytes {sum(i.bytes for i in dma)} in {sum(i.dma_chunks for i in dma)} chunks")
    for name, arr in named_outputs(outputs).items():
        lines.append(f"  output {name}: shape {tuple(arr.shape)} {arr.dtype}")
    for name, arr in written_arguments(trace, inputs or {}).items():
        lines.append(f"  argument {name} (written by the kernel): shape {tuple(arr.shape)} {arr.dtype}")
    return "\n".join(lines)


def named_outputs(outputs: object) -> dict[str, np.ndarray]:
    if outputs is None:
        return {}
    if isinstance(outputs, (tuple, list)):
        return {f"out{i}": np.asarray(o) for i, o in enumerate(outputs) if isinstance(o, np.ndarray)}
    return {"out": np.asarray(outputs)} if isinstance(outputs, np.ndarray) else {}


def written_arguments(trace: Trace, inputs: dict[str, object]) -> dict[str, np.ndarray]:
    """The array arguments the kernel wrote in place (e.g. the tutorial matmul's `result`), by parameter name."""
    written = {a.name for i in trace.instrs for a in i.writes if a.memory == "hbm"}
    return {n: v for n, v in inputs.items() if n in written and isinstance(v, np.ndarray)}


def format_trace(trace: Trace) -> str:
    """One line per instruction: seq, engine, op, shape facts, dtypes, DMA bytes/chunks, kernel line."""
    out = []
    for i in trace.instrs:
        extra = f" bytes={i.bytes} chunks={i.dma_chunks}x{i.dma_chunk_bytes}B" if i.engine == "dma" else ""
        if i.op == "nc_matmul":
            extra = f" K={i.k} M={i.m} N={i.free}" + (" +=" if i.accumulate else "")
        src = ",".join(f"{a.name}[{a.memory}]" for a in i.reads)
        dst = ",".join(f"{a.name}[{a.memory}]" for a in i.writes)
        out.append(f"{i.seq:6d} {i.engine:<6} {i.op:<14} P={i.partitions:<3} F={i.free:<6} "
                   f"{'/'.join(i.in_dtypes)}->{i.out_dtype}{extra}  {src} -> {dst}  "
                   f"{pathlib.Path(i.file).name}:{i.line}")
    return "\n".join(out)
