"""The compiler's public API: `compile_file(path, shapes, schedule) -> Compiled` (source, IR stages, runnable)."""
from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, cast

import numpy as np

from tilec.compiler import codegen
from tilec.compiler.pipeline import STAGES, Result, compile_program
from tilec.errors import TilecError
from tilec.lang import api as lang


@dataclass(frozen=True)
class Compiled:
    source: str
    kernel_name: str
    stages: dict[str, str]
    program: Any
    result: Result = field(repr=False)
    nki: str = codegen.DEFAULT_NKI  # the NKI API version `source` is written for (0.6: `import nki`, 0.1: neuronxcc)

    def run(self, /, *arrays: np.ndarray, **named: np.ndarray) -> dict[str, np.ndarray]:
        """Run the kernel on the active backend; inputs by position or name, cast to their declared dtypes.
        (`self` is positional-only: a kernel input may be named `self`.)"""
        return run_source(self.source, self.kernel_name, self.program, arrays, named, target=self.result.target.name)

    def run_traced(self, /, *arrays: np.ndarray, **named: np.ndarray):
        """(outputs, trace). numerics=False: a trace-only run (same trace and rule checks, output values
        unspecified; see tilec.nki.api.simulate_traced). `numerics` given as a bool is that option; an array
        under that name is the kernel input `numerics`."""
        numerics = cast(bool, named.pop("numerics")) if isinstance(named.get("numerics"), bool) else True
        return run_source(self.source, self.kernel_name, self.program, arrays, named, traced=True,
                          numerics=numerics, target=self.result.target.name)


def read_schedule(schedule: str | None):
    """A schedule file path or schedule text -> directives (None: use the program's own schedule section)."""
    if schedule is None:
        return None
    path = pathlib.Path(schedule)
    if "\n" in schedule or not schedule.strip():  # "" is no directive at all (the tuner's all-default point)
        return lang.parse_schedule(schedule, "<schedule>")
    hint = "give the path of a schedule file (directives, one per line) or the directives themselves"
    if path.is_dir():
        raise TilecError(f"schedule {schedule} is a directory, not a file", hint=hint)
    if path.exists():
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise TilecError(f"cannot read schedule file {schedule}: {getattr(err, 'strerror', None) or err}",
                             hint=hint) from None
        return lang.parse_schedule(text, str(path))
    # directives never contain a path separator, so such a text is a path that does not exist
    if path.suffix in (".sched", ".schedule", ".txt", ".tls") or "/" in schedule:
        raise TilecError(f"no such schedule file: {schedule}", hint=hint)
    return lang.parse_schedule(schedule, "<schedule>")


def compile_file(path: str | pathlib.Path, shapes: dict[str, int] | None = None,
                 schedule: str | None = None, nki: str | None = None, target: str | None = None) -> Compiled:
    """`nki`: "0.6" (`import nki`, Neuron SDK 2.29+) or "0.1" (`import neuronxcc.nki`, SDK <= 2.29 and the course
    environment); None is the default, codegen.DEFAULT_NKI (0.6). Both forms come from the same scheduled IR.
    `target`: a NeuronCore generation of tilec.target.TARGETS (default trn2); it sets the limits and budgets."""
    nki = codegen.check_nki(nki)
    program = lang.load(path, shapes)
    return compile_loaded(program, read_schedule(schedule), nki, target)


def compile_loaded(program, directives=None, nki: str | None = None, target: str | None = None) -> Compiled:
    if not program.complete():
        missing = sorted(t.name for t in program.tensors.values() if t.shape is None)
        raise TilecError(f"shapes of {', '.join(missing)} are not known; the compiler needs every size",
                         None, "give sizes with -D NAME=VALUE or a `default` line in the program")
    nki = codegen.check_nki(nki)
    result = compile_program(program, directives, nki, target)
    return Compiled(result.source, _kernel_name(result), result.stages, program, result, nki)


def _kernel_name(result: Result) -> str:
    for line in result.source.splitlines():
        if line.startswith("def "):
            return line[4:line.index("(")]
    return result.kernel.name


def _bind(program, arrays: tuple, named: dict, copy: bool = True) -> list[np.ndarray]:
    """The inputs in parameter order, cast to their declared dtypes; copy=False reuses arrays already in that
    dtype (for a trace-only run, which never writes them: copying a 200 MB input costs 0.4 s)."""
    params = [p.name for p in program.kernel.params]
    if arrays and named:
        raise TilecError("pass kernel inputs either by position or by name, not both")
    if arrays:
        if len(arrays) != len(params):
            raise TilecError(f"the kernel takes {len(params)} inputs ({', '.join(params)}), got {len(arrays)}")
        named = dict(zip(params, arrays))
    missing = [p for p in params if p not in named]
    if missing:
        raise TilecError(f"missing kernel inputs: {', '.join(missing)}")
    out = []
    for p in params:
        info = program.tensors[p]
        arr = np.asarray(named[p]).astype(lang.NP_DTYPES[info.dtype], copy=copy)
        if info.shape is not None and tuple(arr.shape) != tuple(info.shape):
            raise TilecError(f"input {p} has shape {arr.shape}, the compiled kernel expects {info.shape}")
        out.append(arr)
    return out


_LOADED: dict[str, Callable] = {}


def load_kernel(source: str, name: str) -> Callable:
    """Write the source to `<tmp>/tilec_kernels/<hash>/<name>.py` (so kernel file:line in errors and profiles is
    stable and reads like the kernel's own name) and import it."""
    from tilec.nki import api as nki_api

    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    if digest not in _LOADED:
        folder = pathlib.Path(tempfile.gettempdir()) / "tilec_kernels" / digest
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.py"
        if not path.exists():  # whole or not at all: a run interrupted here must not leave half a kernel behind
            part = path.with_name(f"{path.name}.{os.getpid()}.part")
            part.write_text(source)
            part.replace(path)
        _LOADED[digest] = cast(Callable, nki_api.load_kernel_file(str(path), name))  # a kernel: checked callable
    return _LOADED[digest]


def run_source(source: str, name: str, program, arrays: tuple, named: dict, traced: bool = False,
               numerics: bool = True, target: str | None = None):
    """Run a kernel on the interpreter under `target`'s rules (the one it was compiled for; None: the default)."""
    from tilec.nki import api as nki_api

    kernel = load_kernel(source, name)
    inputs = _bind(program, arrays, named, copy=numerics)
    if traced:  # strict: tilec's own kernels keep to the rules of later releases as well (rules.later_release)
        outs, trace = nki_api.simulate_traced(kernel, *inputs, numerics=numerics, strict=True, target=target)
    else:
        outs, trace = nki_api.simulate(kernel, *inputs, strict=True, target=target), None
    outs = outs if isinstance(outs, tuple) else (outs,)
    result = {o: np.asarray(v) for o, v in zip(program.kernel.outputs, outs)}
    return (result, trace) if traced else result


def explain(c: Compiled) -> str:
    """Operations selected, the schedule applied (as directives), buffer placement and memory per partition."""
    out = [f"program {c.program.path}: kernel {c.kernel_name}", "", "operations:"]
    out += ["  " + line for line in c.stages["select"].splitlines()]
    out += ["", "schedule applied (as directives, after each op's resolved plan):"]
    out += ["  " + line for line in c.stages["schedule"].splitlines()]
    out += ["", "tensor placement:"] + ["  " + line for line in _placement(c)]
    out += ["", "buffers (allocate):"]
    out += ["  " + line for line in c.stages["allocate"].splitlines()]
    return "\n".join(out) + "\n"


def _placement(c: Compiled) -> list[str]:
    from tilec.compiler.ir import Alloc, walk
    from tilec.compiler.placement import hbm_reason
    from tilec.compiler.schedule import sbuf_budget

    in_hbm = {s.buf.name for s in walk(c.result.kernel.body) if isinstance(s, Alloc) and s.buf.memory == "hbm"}
    fused_into = {name: op.out for op in c.result.ops for name in getattr(op, "fused", ()) if name != op.out}
    fused_into.update({op.name: op.out for op in c.result.ops if op.name != op.out})
    outs = {op.name: op.out for op in c.result.ops}
    for part in c.result.chains:  # a chain's temporaries live in its tiles; it stores its last op's output
        chain = part.members
        fused_into.update({outs[name]: f"the {part.kind} writing {outs[chain[-1]]}" for name in chain[:-1]})
    lines = []
    placed = {name: (on_chip, why) for name, on_chip, why in c.result.placed}  # conv -> conv / pool chains
    pooled = {op.src for op in c.result.ops if type(op).__name__ == "PoolOp"}
    for name, t in c.program.tensors.items():
        link = "conv -> pool chain" if name in pooled else "conv -> conv chain"
        if t.kind != "temp" and name in placed and placed[name][0]:
            where = f"HBM ({t.kind}) and SBUF, one image at a time ({link})\n" + _wrap(placed[name][1])
        elif t.kind != "temp":
            where = f"HBM ({t.kind})"
        elif name in placed and placed[name][0]:
            where = (f"SBUF, one image at a time ({link})" + (" and HBM" if name in in_hbm else "") +
                     "\n" + _wrap(placed[name][1]))
        elif name in in_hbm and name in placed:
            where = "HBM scratch (not fused: written, then read back)\n" + _wrap(placed[name][1])
        elif name in in_hbm:
            why = hbm_reason(c.result.ops, name, t.dtype, sbuf_budget(c.result.target), c.result.unfused)
            where = "HBM scratch (not fused: written, then read back)\n" + _wrap(why)
        else:
            where = f"never in HBM: fused into {fused_into.get(name, '?')} (on-chip PSUM/SBUF tiles only)"
        lines.append(f"{name:<12} {where}")
    return lines


def _wrap(text: str, indent: int = 15, width: int = 116) -> str:
    """A reason under its tensor's line, indented past the name column."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width - indent, initial_indent=" " * indent, subsequent_indent=" " * indent))


__all__ = ["Compiled", "STAGES", "compile_file", "compile_loaded", "explain"]
