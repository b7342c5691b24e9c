"""Kernels for any shape: a .tl program as a Python function, compiled per input shape and dtype on first call and
cached (as `nki.jit` and Triton's JIT do), and a generated module that serves several shapes from one file.

    conv = tilec.jit("examples/conv2d.tl")
    Y = conv(X, Wt)                   # NumPy arrays or CPU torch tensors; sizes come from the shapes
    Y16 = conv(X.half(), Wt.half())   # another dtype: another specialisation, cached too

    source = tilec.jit.bundle("fused_conv2d_maxpool", ["X", "W", "bias", "pool_size"], [
        Case("conv_bias_maxpool.tl", {"N": 4, "C": 128, "K": 128, "H": 32, "W": 16}, when={"pool_size": 2}), ...])

A .tl program declares its dtypes (`f32[...]`); called with arrays of another float dtype (all alike), the
program is compiled with that dtype instead, so a float16 call gets a float16 kernel, not casts.
"""
from __future__ import annotations

import hashlib
import pathlib
import re
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilec.errors import TilecError

TL_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
NL_DTYPES = {"f32": "nl.float32", "f16": "nl.float16", "bf16": "nl.bfloat16"}


class Kernel:
    """A .tl program callable on arrays of any shape the program accepts; one compiled kernel per (shapes, dtype,
    sizes) key, kept in `self.cache`."""

    def __init__(self, program: str | pathlib.Path, schedule: str | None = None, *, target: str | None = None,
                 **sizes: int) -> None:
        from tilec.lang import api as lang
        from tilec.target import target as get_target

        self.path = pathlib.Path(program)
        self.schedule = schedule
        self.target = get_target(target).name  # the NeuronCore generation it compiles for (an unknown one: here)
        self.sizes = sizes
        self.program = lang.load(self.path, sizes or None)  # a user's mistake in the program shows up here, once
        self.params = [p.name for p in self.program.kernel.params]
        self.cache: dict[tuple, Any] = {}
        self.__name__ = self.program.kernel.name
        self.__doc__ = f"tilec kernel `{self.__name__}` from {self.path} (compiled per input shape and dtype)"

    def __repr__(self) -> str:
        return f"<tilec.jit {self.__name__} from {self.path}: {len(self.cache)} specialisation(s)>"

    def __call__(self, *arrays: Any, **sizes: int) -> Any:
        if len(arrays) != len(self.params):
            raise TilecError(f"`{self.__name__}` takes {len(self.params)} arrays ({', '.join(self.params)}), "
                             f"got {len(arrays)}")
        torch_like = [_is_torch(a) for a in arrays]
        inputs = [_to_numpy(a, name) for a, name in zip(arrays, self.params)]
        compiled = self.specialise(*inputs, **sizes)
        results = _run(compiled, inputs)
        if any(torch_like):
            results = [_to_torch(r) for r in results]
        return results[0] if len(results) == 1 else tuple(results)

    def specialise(self, *arrays: Any, **sizes: int) -> Any:
        """The compiled kernel (tilec.compiler.api.Compiled) for these arrays' shapes and dtype, from the cache or
        compiled now; `.source` is its NKI module."""
        inputs = [_to_numpy(a, name) for a, name in zip(arrays, self.params)]
        dtype = _common_dtype(inputs, self.params)
        key = (tuple(a.shape for a in inputs), dtype, tuple(sorted(sizes.items())))
        if key not in self.cache:
            self.cache[key] = self._compile(inputs, dtype, {**self.sizes, **sizes})
        return self.cache[key]

    def _compile(self, inputs: list[np.ndarray], dtype: str | None, sizes: dict[str, int]) -> Any:
        from tilec.compiler.api import compile_loaded, read_schedule
        from tilec.lang import api as lang

        program = program_for_dtype(self.path, dtype, sizes)
        bound = lang.bind_inputs(program, dict(zip(self.params, inputs)))
        shapes = {name: bound.sizes[name] for name in bound.facts.symbols}
        return compile_loaded(lang.load(program.path, shapes), read_schedule(self.schedule), target=self.target)


def _run(compiled: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs, in the program's order: on the NeuronCore where AWS's NKI package of the kernel's API is
    installed (`nki` for 0.6, `neuronxcc` for 0.1; an @nki.jit kernel called with NumPy arrays runs there; this path
    cannot be exercised without Trainium), else on tilec's interpreter."""
    from tilec.nki import shim, shim06

    real = shim06.active_backend() == "nki" if compiled.nki == "0.6" else shim.active_backend() == "neuronxcc"
    if real:
        from tilec.compiler.api import _bind, load_kernel

        kernel = load_kernel(compiled.source, compiled.kernel_name)
        outs = kernel(*_bind(compiled.program, tuple(inputs), {}))
        return [np.asarray(o) for o in (outs if isinstance(outs, tuple) else (outs,))]
    outputs = compiled.run(*inputs)
    return [outputs[name] for name in compiled.program.kernel.outputs]


def jit(program: str | pathlib.Path, schedule: str | None = None, *, target: str | None = None,
        **sizes: int) -> Kernel:
    """`tilec.jit("conv.tl")(X, Wt)`: the program as a function compiled per input shape and dtype (see Kernel);
    `target="trn1"` compiles for that NeuronCore generation (tilec.target; default trn2) and runs under its rules."""
    return Kernel(program, schedule, target=target, **sizes)


def program_for_dtype(path: str | pathlib.Path, dtype: str | None, sizes: dict[str, int] | None = None) -> Any:
    """The program loaded with every tensor of its declared float type written `dtype` (f32, f16 or bf16).

    A program whose tensors do not all share one type keeps its own types (inputs are then cast to them)."""
    from tilec.lang import api as lang

    program = lang.load(path, sizes or None)
    declared = {t.dtype for t in program.tensors.values()}
    if dtype is None or declared == {dtype} or len(declared) != 1:
        return program
    (old,) = declared
    text = re.sub(rf"\b{old}\[", f"{dtype}[", program.source)
    variant = _variant_file(pathlib.Path(path), dtype, text)
    return lang.load(variant, sizes or None)


def _variant_file(path: pathlib.Path, dtype: str, text: str) -> pathlib.Path:
    """The dtype variant of a program, written once under the temp folder (named after the original, so error
    messages and generated docstrings still read like it)."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = pathlib.Path(tempfile.gettempdir()) / "tilec_jit" / digest
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{path.stem}_{dtype}.tl"
    if not out.exists():
        part = out.with_name(out.name + ".part")
        part.write_text(text)
        part.replace(out)
    return out


def _is_torch(a: Any) -> bool:
    return type(a).__module__.split(".")[0] == "torch" and hasattr(a, "detach")


def _to_numpy(a: Any, name: str) -> np.ndarray:
    """NumPy arrays as they are; torch tensors on the CPU as NumPy views (bfloat16 through ml_dtypes)."""
    if not _is_torch(a):
        return np.asarray(a)
    if a.device.type != "cpu":
        raise TilecError(f"`{name}` is a torch tensor on {a.device}; tilec runs kernels on the CPU interpreter",
                         hint=f"pass {name}.cpu(), or run the generated kernel with neuronxcc on a Trainium host")
    t = a.detach()
    if str(t.dtype) == "torch.bfloat16":
        import ml_dtypes
        import torch

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _to_torch(a: np.ndarray) -> Any:
    import torch

    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":  # torch has no NumPy bfloat16: share the bits
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _common_dtype(inputs: list[np.ndarray], names: list[str]) -> str | None:
    """f32/f16/bf16 when every input has that float dtype; None (keep the program's types, cast the inputs) else."""
    for name, a in zip(names, inputs):
        if np.dtype(a.dtype).kind not in "fiub" and np.dtype(a.dtype).name not in TL_DTYPES:
            raise TilecError(f"`{name}` has dtype {a.dtype}, not a real number type",
                             hint="pass float arrays (float32, float16 or bfloat16)")
    found = {np.dtype(a.dtype).name for a in inputs}
    return TL_DTYPES.get(found.pop()) if len(found) == 1 else None


# ---- one module, several shapes: a dispatcher over specialised kernels -------------------------------------------


@dataclass(frozen=True)
class Case:
    """One specialisation of a bundle: a program at given sizes and dtype, chosen when the extra scalar arguments
    equal `when` (e.g. {"pool_size": 2})."""
    program: str
    sizes: dict[str, int]
    dtype: str = "f32"
    when: dict[str, Any] = field(default_factory=dict)
    schedule: str | None = None
    target: str | None = None  # the NeuronCore generation it is compiled for (tilec.target; None: the default)


# per NKI version (tilec.compiler.codegen.NKI_VERSIONS): the module's imports and the dispatcher's decorators
IMPORTS = {"0.1": "import neuronxcc.nki as nki\nimport neuronxcc.nki.isa as nisa\nimport neuronxcc.nki.language as nl\n",
           "0.6": "import nki\nimport nki.isa as nisa\nimport nki.language as nl\n"}
DECORATORS = {"0.1": "@nki.compiler.skip_middle_end_transformations\n@nki.jit\n", "0.6": "@nki.jit\n"}
CONSTANT = re.compile(r"^([A-Z][A-Z0-9_]*) = ", re.M)


def bundle(name: str, params: list[str], cases: list[Case], nki: str | None = None) -> str:
    """The source of one NKI module whose `@nki.jit` kernel `name(*params)` serves every case: it compares the
    arguments' shapes, dtype and scalar selectors at trace time and calls the kernel specialised for them
    (plain functions in the same file, each as tilec generated it, its constants renamed to stay apart).
    `nki`: the NKI API to write ("0.6" or "0.1"; None: tilec's default), e.g. "0.1" for the course's SDK."""
    from tilec.compiler import codegen
    from tilec.compiler.api import compile_loaded, read_schedule

    nki = codegen.check_nki(nki)

    if not cases:
        raise TilecError("a bundle needs at least one case")
    sections, branches, tensor_params = [], [], []
    for i, case in enumerate(cases):
        compiled = compile_loaded(program_for_dtype(case.program, case.dtype, case.sizes),
                                  read_schedule(case.schedule), nki, case.target)
        tensors = [p.name for p in compiled.program.kernel.params]
        tensor_params.append(tensors)
        if len(tensors) > len(params):
            raise TilecError(f"{case.program} takes {len(tensors)} tensors, the bundle has {len(params)} parameters")
        scalars = params[len(tensors):]
        unknown = set(case.when) - set(scalars)
        if unknown:
            raise TilecError(f"`when` names {', '.join(sorted(unknown))}, not among the scalar parameters "
                             f"{', '.join(scalars) or '(none)'}")
        fn = f"_{compiled.kernel_name}_{i}"
        sections.append(_specialised(compiled, fn, i, case))
        shapes = [compiled.program.tensors[t].shape for t in tensors]
        test = [f"tuple({params[j]}.shape) == {shape}" for j, shape in enumerate(shapes)]
        test.append(f"{params[0]}.dtype == {NL_DTYPES[case.dtype]}")
        test += [f"{k} == {v!r}" for k, v in case.when.items()]
        branches.append(f"    if {' and '.join(test)}:\n        return {fn}({', '.join(params[:len(tensors)])})")
    ntensors = max(len(compiled_params) for compiled_params in tensor_params)
    head = (f'"""NKI kernel `{name}`, specialised by tilec for {len(cases)} cases and dispatched at trace time\n\n'
            f"Generated by tilec (tilec.jit.bundle); do not edit by hand. Cases:\n\n"
            + "".join(f"    {i}: {pathlib.Path(c.program).name} {c.dtype} "
                      f"{', '.join(f'{k}={v}' for k, v in sorted(c.sizes.items()))}"
                      f"{''.join(f' {k}={v!r}' for k, v in c.when.items())}\n" for i, c in enumerate(cases))
            + '"""\n' + IMPORTS[nki])
    selectors = f" and {', '.join(params[ntensors:])}" if params[ntensors:] else ""
    shapes = ", ".join(f"{a}.shape" for a in params[:ntensors])
    dispatcher = (f"\n\n{DECORATORS[nki]}def {name}({', '.join(params)}):\n"
                  f'    """The kernel specialised for these shapes and dtype{selectors}."""\n'
                  + "\n".join(branches)
                  + f"\n    assert False, f'{name}: no specialised kernel for shapes {{({shapes},)}}, dtype "
                    f"{{{params[0]}.dtype}}{''.join(f', {s}={{{s}}}' for s in params[ntensors:])}; "
                    f"add the case to the bundle'\n")
    return head + "".join(sections) + dispatcher


def _specialised(compiled: Any, fn: str, index: int, case: Case) -> str:
    """The generated module's constants and kernel, as a plain function `fn` with constants prefixed `K<index>_`."""
    source = compiled.source
    body_start = source.index("\n@") if "\n@" in source else source.index("\ndef ")
    constants = CONSTANT.findall(source[:body_start])
    text = source[source.index("\n", source.index('"""', 3)) + 1:]  # drop the module docstring
    text = "\n".join(line for line in text.splitlines() if not line.startswith(("import ", "from ", "@")))
    for const in constants:
        text = re.sub(rf"\b{const}\b", f"K{index}_{const}", text)
    text = re.sub(rf"^def {re.escape(compiled.kernel_name)}\(", f"def {fn}(", text, flags=re.M)
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(compiled.program.sizes.items()))
    return (f"\n\n# ---- case {index}: {pathlib.Path(case.program).name}, {case.dtype}, {sizes}"
            + "".join(f", {k}={v!r}" for k, v in case.when.items()) + "\n" + text.strip("\n") + "\n")


class _Module(sys.modules[__name__].__class__):
    """`tilec.jit(...)` is the function; `tilec.jit.bundle`, `tilec.jit.Case` are still reachable."""

    def __call__(self, program: str | pathlib.Path, schedule: str | None = None, **sizes: int) -> Kernel:
        return jit(program, schedule, **sizes)


sys.modules[__name__].__class__ = _Module
