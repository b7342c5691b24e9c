"""Public entry points of the NKI interpreter (the contract in the briefing):

    simulate(kernel_fn, *arrays, **kwargs) -> outputs            like nki.simulate_kernel
    simulate_traced(kernel_fn, *arrays, **kwargs) -> (outputs, Trace)
    load_kernel_file(path, name) -> kernel                        imports a .py kernel file with the shim active
    run_file(path, kernel, inputs, ...) -> (outputs, Trace)       what `tilec nki-run` does
    random_inputs(specs, seed) -> dict of arrays                  from "a=128x512:float16" shape specs
"""
from __future__ import annotations

import importlib.util
import inspect
import pathlib
import sys

import numpy as np

from tilec.nki import dtypes, shim
from tilec.nki.kernel import as_kernel, run_kernel
from tilec.nki.rules import NkiError
from tilec.trace import Trace


def simulate(kernel_fn: object, *arrays: object, target: str | None = None, **kwargs: object) -> object:
    outputs, _ = simulate_traced(kernel_fn, *arrays, target=target, **kwargs)
    return outputs


def simulate_traced(kernel_fn: object, *arrays: object, target: str | None = None,
                    **kwargs: object) -> tuple[object, Trace]:
    shim.install()
    return run_kernel(as_kernel(kernel_fn), arrays, kwargs, target=target)


_loaded: dict[tuple[str, int], object] = {}  # (path, mtime) -> module: a file is executed once until it changes


def load_kernel_file(path: str | pathlib.Path, name: str, force_interpreter: bool = False) -> object:
    """Import `path` as a module (with `import neuronxcc.nki` served by tilec if needed) and return `name`.
    force_interpreter=True serves tilec's interpreter even where the real neuronxcc is installed."""
    shim.install(force=True if force_interpreter else None)
    path = pathlib.Path(path).resolve()
    if not path.is_file():
        raise NkiError(f"kernel file {path} does not exist", "kernel_file", None)
    key = (str(path), path.stat().st_mtime_ns)
    module = _loaded.get(key)
    if module is None:
        module_name = f"tilec_kernel_{path.stem}_{abs(hash(str(path))) % 10**8}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        _loaded[key] = module
    if not hasattr(module, name):
        found = [k for k, v in vars(module).items() if _is_kernel(v)]
        raise NkiError(f"{path.name} has no kernel named '{name}'", "kernel_name", (str(path), 0),
                       f"kernels in the file: {', '.join(found) or 'none'}")
    return getattr(module, name)


def _is_kernel(value: object) -> bool:
    from tilec.nki.kernel import Kernel

    return isinstance(value, Kernel)


def kernel_params(kernel: object) -> list[str]:
    return list(inspect.signature(as_kernel(kernel).func).parameters)


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
    shape = tuple(int(d) for d in dims.lower().split("x"))
    return name, (shape, dtype or "float32")


def run_file(path: str, kernel: str, inputs: dict[str, object], target: str | None = None) -> tuple[object, Trace]:
    """What `tilec nki-run` does: always on tilec's interpreter, also where neuronxcc is installed."""
    fn = load_kernel_file(path, kernel, force_interpreter=True)
    params = kernel_params(fn)
    missing = [p for p in params if p not in inputs and
               inspect.signature(as_kernel(fn).func).parameters[p].default is inspect.Parameter.empty]
    if missing:
        raise NkiError(f"no input given for kernel parameter(s) {', '.join(missing)}", "kernel_inputs",
                       None, f"kernel {kernel}({', '.join(params)})")
    args = {p: inputs[p] for p in params if p in inputs}
    try:
        return simulate_traced(fn, target=target, **args)
    except (AssertionError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as exc:
        if isinstance(exc, NkiError):
            raise
        raise NkiError(f"the kernel raised {type(exc).__name__}: {exc}", "kernel_exception",
                       _kernel_frame(exc, path)) from exc


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


def summary(kernel: str, outputs: object, trace: Trace) -> str:
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
    return "\n".join(lines)


def named_outputs(outputs: object) -> dict[str, np.ndarray]:
    if outputs is None:
        return {}
    if isinstance(outputs, (tuple, list)):
        return {f"out{i}": np.asarray(o) for i, o in enumerate(outputs) if isinstance(o, np.ndarray)}
    return {"out": np.asarray(outputs)} if isinstance(outputs, np.ndarray) else {}


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
