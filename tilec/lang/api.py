"""The public API of the tilec language: parse, check, bind sizes, evaluate.

Sizes: a size symbol (a name in a parameter's shape) gets its value, in order of precedence, from the input arrays
(`bind_inputs`, `evaluate`), from `defines` (-D N=1), or from the kernel's `default N = 4, ...` line. A `load`
with every size known checks everything (assumptions, divisions, bounds); with some unknown it checks what it can
and `Program.sizes` is partial, and the rest is checked when input arrays bind them.
"""
from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass, field

import numpy as np

from tilec.errors import Span, TilecError
from tilec.lang import bounds, checker, evaluator, parser, widen
from tilec.lang import syntax as s

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
NP_DTYPES = evaluator.NP_DTYPES


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # f32 | f16 | bf16
    shape: tuple[int, ...] | None  # None while some size is unknown
    kind: str  # input | output | temp
    span: Span


@dataclass(frozen=True)
class Program:
    kernel: s.Kernel
    path: str
    source: str
    sizes: dict[str, int]
    tensors: dict[str, TensorInfo]
    defines: dict[str, int] = field(default_factory=dict)  # sizes given explicitly (-D), kept by bind_inputs
    facts: checker.Facts | None = field(default=None, compare=False, repr=False)
    pending: bounds.Pending | None = field(default=None, compare=False, repr=False)
    # inputs and outputs the compiler reads through a reshaped view (compiler/view_split.py): their shapes in the
    # kernel's signature
    views: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def inputs(self) -> list[TensorInfo]:
        return [t for t in self.tensors.values() if t.kind == "input"]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [self.tensors[name] for name in self.kernel.outputs]

    def complete(self) -> bool:
        return all(t.shape is not None for t in self.tensors.values())


def parse(text: str, filename: str = "<string>") -> s.Kernel:
    return parser.parse(text, filename)


def parse_schedule(text: str, filename: str = "<string>") -> tuple[s.Directive, ...]:
    return parser.parse_schedule(text, filename)


def _read(path_or_text: str | pathlib.Path) -> tuple[str, str]:
    """A Path, a str ending in .tl or naming an existing file or directory is read as a file; other text is source."""
    if isinstance(path_or_text, str):
        looks_like_path = "\n" not in path_or_text and (
            path_or_text.endswith(".tl") or _exists(path_or_text))
        if not looks_like_path:
            return path_or_text, "<string>"
    return _read_file(pathlib.Path(path_or_text))


def _exists(name: str) -> bool:
    try:
        return pathlib.Path(name).exists()
    except (OSError, ValueError):  # e.g. a one-line program text longer than a file name may be
        return False


def _read_file(path: pathlib.Path) -> tuple[str, str]:
    if path.is_dir():
        raise TilecError(f"{path} is a directory", None, "give the path of a .tl program inside it")
    if not path.is_file():
        raise TilecError(f"no such file: {path}", None, "give the path of a .tl program")
    try:
        return path.read_text(), str(path)
    except (OSError, UnicodeDecodeError) as err:
        raise TilecError(f"cannot read {path} as a .tl program: {err}", None,
                         "give the path of a .tl program (UTF-8 text)") from None


def load(path_or_text: str | pathlib.Path, defines: dict[str, int] | None = None) -> Program:
    """Parse and check a program; sizes from defines, then the kernel's defaults."""
    source, path = _read(path_or_text)
    kernel = widen.widen_mixed(parser.parse(source, path))
    facts = checker.check(kernel)
    pending = bounds.prove(facts)
    defines = dict(defines or {})
    _check_defines(facts, defines)
    return _resolve(kernel, path, source, facts, pending, defines, {})


def check_file(path: str | pathlib.Path, defines: dict[str, int] | None = None) -> Program:
    """`load`, and when every size is known, that the statements store every element of every output (as `evaluate`
    does, without computing values)."""
    program = load(path, defines)
    if program.complete():
        evaluator.check_coverage(program.kernel, program.sizes, *_evaluator_tensors(program))
    return program


def _evaluator_tensors(program: Program) -> tuple[dict, dict]:
    """What the evaluator is told of the tensors: name -> (dtype, shape, kind), and name -> declaration span."""
    return ({n: (t.dtype, t.shape, t.kind) for n, t in program.tensors.items()},
            {n: t.span for n, t in program.tensors.items()})


def _check_defines(facts: checker.Facts, defines: dict[str, int]) -> None:
    sizes = ", ".join(facts.symbols) or "none"
    for name, value in defines.items():
        if name in facts.lets:
            raise TilecError(f"-D {name}={value}: `{name}` is derived by a `let`, it cannot be set",
                             facts.lets[name].span, f"set the sizes it is computed from instead ({sizes})")
        if name not in facts.symbols:
            raise TilecError(f"-D {name}={value}: kernel `{facts.kernel.name}` has no size `{name}`", None,
                             f"its sizes are: {sizes}")


def _resolve(kernel: s.Kernel, path: str, source: str, facts: checker.Facts, pending: bounds.Pending,
             defines: dict[str, int], bound: dict[str, int]) -> Program:
    given = {d.name: int(d.value.value) for d in kernel.defaults}
    given.update(defines)
    given.update(bound)
    sizes = bounds.resolve(facts, pending, given)
    tensors = {name: _info(t, sizes) for name, t in facts.tensors.items()}
    return Program(kernel, path, source, sizes, tensors, defines, facts, pending)


def _info(t: checker.Tensor, sizes: dict[str, int]) -> TensorInfo:
    try:
        shape = tuple(bounds.evaluate_size(d, sizes) for d in t.shape)
    except KeyError:
        shape = None
    return TensorInfo(t.name, t.dtype, shape, t.kind, t.span)


def padding(program: Program) -> list[tuple[s.Access, tuple[tuple[int, int], ...]]]:
    """Every padded read (`X[y + r - 1] ?? 0`) with how far it reaches beyond X per dimension, as np.pad's
    pad_width ((before, after) per dimension), at the program's sizes (all must be known)."""
    _need_sizes(program)
    assert program.facts is not None
    return [(site.access, bounds.halo(program.facts, site, program.sizes))
            for site in program.facts.sites if site.access.fill is not None]


# ---- inputs ---------------------------------------------------------------------------------------------------------


def bind_inputs(program: Program, inputs: dict[str, np.ndarray]) -> Program:
    """Infer sizes from the input arrays' shapes (they override defaults; they must agree with -D) and re-check."""
    params = {p.name: p for p in program.kernel.params}
    for name in inputs:
        if name not in params:
            raise TilecError(f"input `{name}` is not a parameter of kernel `{program.kernel.name}`", None,
                             f"its parameters are: {', '.join(params)}")
    bound: dict[str, int] = {}
    origin: dict[str, str] = {}
    for p in program.kernel.params:
        if p.name not in inputs:
            raise TilecError(f"missing input `{p.name}`", p.span, "pass an array for every parameter")
        _check_real(p, inputs[p.name])
        _bind_param(p, np.shape(inputs[p.name]), program.defines, bound, origin)
    result = _resolve(program.kernel, program.path, program.source, program.facts, program.pending,
                      program.defines, bound)
    for p in program.kernel.params:
        _match_shape(p, np.shape(inputs[p.name]), result.tensors[p.name].shape)
    return result


def _check_real(p: s.Param, value: object) -> None:
    """Inputs are real numbers (bool, int, float, bfloat16...); complex, text and objects have no f32 meaning."""
    kind = np.asarray(value).dtype.kind
    if kind in "cSUOMm":
        raise TilecError(f"input `{p.name}` has dtype {np.asarray(value).dtype}, not a real number type", p.span,
                         f"pass a float array (it is rounded to {p.type.dtype})")


def _bind_param(p: s.Param, shape: tuple[int, ...], defines: dict[str, int], bound: dict[str, int],
                origin: dict[str, str]) -> None:
    dims = p.type.shape
    if len(shape) != len(dims):
        raise TilecError(f"input `{p.name}` has {len(shape)} dimensions {tuple(shape)}, the kernel declares "
                         f"{len(dims)}", p.span, f"pass an array of rank {len(dims)}")
    for i, (dim, n) in enumerate(zip(dims, shape)):
        if not isinstance(dim, s.Name):
            continue
        where = f"dimension {i + 1} of `{p.name}`"
        if dim.id in defines and defines[dim.id] != n:
            raise TilecError(f"{where} is {n}, but {dim.id} = {defines[dim.id]} was given with -D", dim.span,
                             f"drop -D {dim.id} or pass an array with {dim.id} = {defines[dim.id]}")
        if dim.id in bound and bound[dim.id] != n:
            raise TilecError(f"{where} is {n}, but {origin[dim.id]} gives {dim.id} = {bound[dim.id]}", dim.span,
                             f"the inputs must agree on {dim.id}")
        bound[dim.id], origin[dim.id] = n, origin.get(dim.id, where)


def _match_shape(p: s.Param, actual: tuple[int, ...], expected: tuple[int, ...] | None) -> None:
    if expected is not None and tuple(actual) != expected:
        raise TilecError(f"input `{p.name}` has shape {tuple(actual)}, the kernel expects {expected}", p.span,
                         "pass an array of the declared shape")


def _need_sizes(program: Program) -> None:
    missing = [n for n in program.facts.symbols if n not in program.sizes]
    if missing:
        raise TilecError(f"size{'s' * (len(missing) > 1)} {', '.join(missing)} of kernel `{program.kernel.name}` "
                         "unknown", None, f"give {' '.join(f'-D {n}=...' for n in missing)} "
                         "or add a `default` line to the kernel")


def random_inputs(program: Program, seed: int = 0) -> dict[str, np.ndarray]:
    """float32 inputs, uniform in [-1, 1), drawn in parameter order from np.random.default_rng(seed)."""
    _need_sizes(program)
    for t in program.inputs:  # numpy would raise ValueError (or MemoryError) on a shape like 10**23
        if math.prod(t.shape) > MAX_RANDOM_ELEMENTS:
            raise TilecError(f"input {t.name} of shape {t.shape} has {math.prod(t.shape):.3g} elements, too many to "
                             f"draw random inputs for", t.span, "choose smaller sizes with -D NAME=VALUE")
    if not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise TilecError(f"the seed of random inputs must be a non-negative integer, got {seed}",
                         hint="give e.g. --seed 0")
    rng = np.random.default_rng(seed)
    return {t.name: rng.random(t.shape, dtype=np.float32) * np.float32(2) - np.float32(1) for t in program.inputs}


MAX_RANDOM_ELEMENTS = 2**34  # 64 GiB of float32: beyond any machine this runs on


def evaluate(program: Program, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the reference evaluator; outputs come back in their declared dtype."""
    bound = bind_inputs(program, inputs)
    _need_sizes(bound)
    tensors, spans = _evaluator_tensors(bound)
    return evaluator.run(bound.kernel, bound.sizes, tensors, inputs, spans)
