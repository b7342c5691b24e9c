"""The `tilec` command line. Each subcommand is a pair (add its arguments, run it) in COMMANDS; it calls only the
public API in `tilec`.

One vocabulary for every subcommand (the helpers below add the options, so they read the same everywhere):
  PROGRAM.tl / FILE.py      what to work on; `check` and `fmt` take several files
  -D NAME=VALUE             a size of a .tl program (repeatable)
  --kernel NAME             the kernel in a .py file (needed only when the file holds several)
  --inputs IN.npz           input arrays named after the parameters (else taken in parameter order)
  --shape [NAME=]AxB[:DT]   a random input for a .py kernel (unnamed ones go in parameter order)
  --arg NAME=VALUE          a scalar argument of a .py kernel
  --seed K                  seed of random inputs
  --target trn2|trn1        the NeuronCore generation: limits, interpreter rules, model (default: the kernel's
                            own platform target, else trn2)
  --out OUT.npz             where output arrays go;  -o/--output FILE  where a generated file goes
  --quiet                   no progress display (it is shown only on a terminal, for work over ~2 s)
Results go to stdout; notes ("wrote X"), progress and errors to stderr. Files are written whole or not at all.
Exit codes: 0 success, 1 a user error (TilecError: file:line:col, caret, hint; never a traceback), 2 a usage error
(bad options), 3 an internal error (a bug in tilec), 130 interrupted (Ctrl-C)."""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Callable

from tilec.errors import InternalError, KernelError, TilecError

EXIT_USER, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 1, 2, 3, 130

Command = tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
COMMANDS: list[Command] = []


def command(name: str, help: str, add_args: Callable[[argparse.ArgumentParser], None]):
    """Register `run(args) -> exit code` as subcommand `name`."""

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS.append((name, help, add_args, run))
        return run

    return register


def parse_defines(items: list[str] | None) -> dict[str, int]:
    """-D N=1 -D C=256 -> {"N": 1, "C": 256}."""
    out: dict[str, int] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier() or not value.lstrip("-").isdigit():
            raise TilecError(f"bad -D option {item!r}", hint="write -D NAME=INTEGER, e.g. -D C=256")
        out[key] = int(value)
    return out


def note(message: str) -> None:
    """A note for the person at the terminal ("wrote X"): stderr, so stdout carries only results."""
    print(message, file=sys.stderr)


def _write_text(path: str, text: str, what: str = "the kernel", option: str = "-o") -> None:
    """Write an output file whole or not at all (through PATH.part, renamed when complete, so Ctrl-C never leaves
    half a file); a bad path is the user's mistake, reported with a hint, not a traceback."""
    _write_atomic(path, lambda f: f.write(text.encode()), what, option)


def _write_atomic(path: str, write: Callable, what: str, option: str) -> None:
    part = pathlib.Path(str(path) + ".part")
    try:
        try:
            with open(part, "wb") as f:
                write(f)
            os.replace(part, path)
        finally:
            if part.exists():
                part.unlink()
    except OSError as err:
        raise TilecError(f"cannot write {what} to {path}: {err.strerror or err}",
                         hint=f"give {option} a writable file path in an existing directory") from None


def add_sizes(p: argparse.ArgumentParser) -> None:
    p.add_argument("-D", dest="defines", action="append", metavar="NAME=VALUE",
                   help="a size of the program, e.g. -D C=256 (repeatable)")


def add_schedule(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schedule", metavar="FILE",
                   help="a schedule file (directives, e.g. from tilec tune --save-schedule) replacing the program's "
                        "own")


def add_target(p: argparse.ArgumentParser) -> None:
    from tilec.target import TARGETS

    p.add_argument("--target", choices=sorted(TARGETS, reverse=True),
                   help="the NeuronCore generation (tilec.target): its limits, and the modelled core (default: the "
                        "kernel's own platform target, else trn2)")


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress display")


def add_kernel_inputs(p: argparse.ArgumentParser) -> None:
    """The inputs of a kernel in a .py file: --kernel, --inputs, --shape, --arg, --seed."""
    p.add_argument("--kernel", metavar="NAME", help="the kernel function in FILE.py (needed if it holds several)")
    p.add_argument("--inputs", metavar="IN.npz",
                   help="input arrays named after the kernel's parameters (else taken in parameter order)")
    p.add_argument("--shape", action="append", metavar="[NAME=]D0xD1..[:DTYPE]",
                   help="a random input (repeat; unnamed ones go in parameter order), e.g. 128x512:float16")
    p.add_argument("--arg", action="append", metavar="NAME=VALUE", help="a scalar argument, e.g. --arg pool_size=2")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")


# ---- subcommands: each owner adds its own block below ------------------------------------------------------------


# ---- nki-run (NKI interpreter, issue 3) ----------------------------------------------------------------------------


def _nki_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a Python file with @nki.jit kernels (imports nki or neuronxcc.nki as usual)")
    add_kernel_inputs(p)
    add_target(p)
    p.add_argument("--out", metavar="OUT.npz", help="write the outputs here")
    p.add_argument("--trace", action="store_true", help="print every executed instruction")
    add_quiet(p)


@command("nki-run", "run an NKI kernel file (NKI 0.6 or 0.1) on tilec's CPU interpreter", _nki_run_args)
def _nki_run(args: argparse.Namespace) -> int:
    from tilec import progress
    from tilec.nki import api as nki_api

    name = _kernel_name(args.file, args.kernel, "running")
    inputs = _kernel_inputs(args.file, name, args)
    with progress.stage(f"running {name} on the interpreter"):
        outputs, trace = nki_api.run_file(args.file, name, inputs, target=args.target)
    if args.trace:
        print(nki_api.format_trace(trace))
    print(nki_api.summary(name, outputs, trace, inputs))
    if args.out:
        written = _save_npz(args.out, {**nki_api.named_outputs(outputs), **nki_api.written_arguments(trace, inputs)})
        note(f"wrote {written}")
    return 0


def _kernel_name(path: str, given: str | None, doing: str) -> str:
    """--kernel, or the only kernel of the file; several kernels and no --kernel is a mistake naming them."""
    from tilec.nki import api as nki_api

    if given:
        return given
    names = nki_api.kernel_names(path)
    if len(names) == 1:
        return names[0]
    file = pathlib.Path(path).name
    if not names:
        raise TilecError(f"{file} defines no @nki.jit kernel", hint="decorate the kernel function with @nki.jit")
    raise TilecError(f"{file} has {len(names)} kernels ({', '.join(names)}); {doing} it needs --kernel NAME",
                     hint=f"e.g. --kernel {names[0]}")


def _kernel_inputs(path: str, name: str, args: argparse.Namespace) -> dict:
    """The arrays (from --inputs or --shape) and scalars (--arg) of a .py kernel, by parameter name."""
    import inspect

    from tilec.nki import api as nki_api

    kernel = nki_api.load_kernel_file(path, name, force_interpreter=True)
    params = list(inspect.signature(getattr(kernel, "func", kernel)).parameters)
    if args.inputs and args.shape:
        raise TilecError("give the inputs as --inputs IN.npz or as --shape ..., not both",
                         hint="e.g. --shape 128x512:float16 --shape 128x512:float16")
    if not args.inputs and not args.shape:
        inputs: dict = {}
    elif args.inputs:
        inputs = _by_parameter(_load_npz(args.inputs), params)
    else:
        specs = dict(_shape_spec(text, params, i) for i, text in enumerate(args.shape))
        try:
            inputs = nki_api.random_inputs(specs, args.seed)
        except MemoryError as err:
            raise TilecError(f"not enough memory for the --shape inputs: {err}", hint="choose smaller shapes") from None
    inputs.update(_scalar_args(args.arg))
    return inputs


def _scalar_args(items: list[str] | None) -> dict[str, int | float]:
    """--arg pool_size=2 --arg eps=1e-5 -> {"pool_size": 2, "eps": 1e-05}."""
    out: dict[str, int | float] = {}
    for item in items or []:
        key, _, value = item.partition("=")
        try:
            out[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            raise TilecError(f"bad --arg {item!r}", hint="write --arg NAME=NUMBER, e.g. --arg pool_size=2") from None
        if not key.isidentifier():
            raise TilecError(f"bad --arg {item!r}", hint="write --arg NAME=NUMBER, e.g. --arg pool_size=2")
    return out


# ---- check, run, fmt (LANG, issue 2) -----------------------------------------------------------------------------


def _nki_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nki", choices=["0.6", "0.1"], default=None,
                   help="NKI API of the kernel: 0.6 (`import nki`, Neuron SDK 2.29+; the default) or 0.1 "
                        "(`import neuronxcc.nki`, SDK <= 2.29, the course environment)")


def _program_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="the .tl program")
    add_sizes(p)


def _check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("programs", nargs="+", metavar="PROGRAM.tl", help="one or more .tl programs")
    add_sizes(p)


def _shape_text(info) -> str:
    dims = ", ".join(str(n) for n in info.shape) if info.shape is not None else "?"
    return f"{info.name}: {info.dtype}[{dims}]"


@command("check", "parse and check .tl programs; print their tensors and shapes", _check_args)
def run_check(args: argparse.Namespace) -> int:
    from tilec.lang import api

    failed = 0
    for path in args.programs:
        try:
            prog = api.check_file(path, parse_defines(args.defines))
        except TilecError as err:
            if len(args.programs) == 1:
                raise
            print(err.render(), file=sys.stderr)
            failed += 1
            continue
        kinds = {"input": "in", "output": "out", "temp": "temp"}
        parts = [f"{kinds[t.kind]} {_shape_text(t)}" for t in prog.tensors.values()]
        unknown = [n for n in prog.facts.symbols if n not in prog.sizes]
        if unknown:  # bounds and divisions that need sizes are checked when -D or input arrays give them
            parts.append(f"sizes {', '.join(unknown)} unknown (give -D NAME=VALUE to check everything)")
        else:  # how far each padded read reaches beyond its tensor, as np.pad's pad_width
            parts += [f"{acc.tensor} padded {pad} at line {acc.span.line}" for acc, pad in api.padding(prog)]
        print(f"{prog.path}: OK: kernel {prog.kernel.name}; " + "; ".join(parts))
    return EXIT_USER if failed else 0


def _run_args(p: argparse.ArgumentParser) -> None:
    _program_args(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--seed", type=int, default=0, help="random inputs from this seed (default 0)")
    source.add_argument("--inputs", metavar="IN.npz", help="input arrays, one per parameter name")
    p.add_argument("--out", metavar="OUT.npz", help="write the outputs here")
    p.add_argument("--backend", choices=["ref", "nki"], default="nki",
                   help="nki: compile, run on the NKI backend and compare with the reference evaluator (default); "
                        "ref: the NumPy reference evaluator only")
    _nki_arg(p)
    add_schedule(p)
    add_target(p)
    add_quiet(p)


def _load_npz(path: str) -> dict:
    """An .npz file of named arrays; any problem with it is the user's, reported without a traceback."""
    import numpy as np

    hint = "give an .npz file written by numpy.savez(path, name=array, ...)"
    try:
        data = np.load(path)
        if not hasattr(data, "files"):
            raise ValueError("it holds a single array, not named arrays")
        with data:
            return {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise TilecError(f"no such file: {path}", hint=hint) from None
    except ValueError as err:
        if "pickled" in str(err):
            err = "not an .npz archive of numeric arrays"
        raise TilecError(f"cannot read inputs from {path}: {err}", hint=hint) from None
    except (OSError, EOFError) as err:
        raise TilecError(f"cannot read inputs from {path}: {err}", hint=hint) from None


def _save_npz(path: str, arrays: dict) -> str:
    """Write the arrays to PATH (.npz added when missing, as numpy.savez would); return the path written."""
    import numpy as np

    if not path.endswith(".npz"):
        path += ".npz"
    _write_atomic(path, lambda f: np.savez(f, **arrays), "the outputs", "--out")
    return path


def _checksum(array) -> str:
    import hashlib

    import numpy as np

    digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]
    return f"sum={float(np.asarray(array, dtype=np.float64).sum()):.6g} sha256={digest}"


@command("run", "run a .tl program on random or given inputs; print shapes and checksums", _run_args)
def run_run(args: argparse.Namespace) -> int:
    try:
        return _run_program(args)
    except MemoryError as err:  # sizes from -D are the user's: say so instead of numpy's traceback
        raise TilecError(f"not enough memory for these sizes: {err}", hint="choose smaller sizes with -D") from None


def _run_program(args: argparse.Namespace) -> int:
    from tilec.lang import api

    prog = api.load(args.program, parse_defines(args.defines))
    inputs = _load_npz(args.inputs) if args.inputs else api.random_inputs(prog, args.seed)
    bound = api.bind_inputs(prog, inputs)
    for name in (t.name for t in bound.inputs):
        print(f"input  {_shape_text(bound.tensors[name])}  {_checksum(inputs[name])}")
    from tilec import progress

    with progress.stage("reference evaluator"):
        outputs = api.evaluate(prog, inputs)
    if args.backend == "nki":
        outputs = _run_nki(args.program, bound, inputs, outputs, args.schedule, args.nki, args.target)
    for name, array in outputs.items():
        print(f"output {_shape_text(bound.tensors[name])}  {_checksum(array)}")
    if args.out:
        note(f"wrote {_save_npz(args.out, outputs)}")
    return 0


def _run_nki(path: str, bound, inputs: dict, reference: dict, schedule: str | None = None,
             nki: str | None = None, target: str | None = None) -> dict:
    """Compile for `target` and run on the NKI backend under its rules; report the largest difference from the
    reference evaluator."""
    import numpy as np

    import tilec
    from tilec import progress

    shapes = {name: bound.sizes[name] for name in bound.facts.symbols}
    with progress.stage("compiling and running the kernel on the NKI backend"):
        result = tilec.compile_file(path, shapes=shapes, schedule=schedule, nki=nki, target=target).run(**inputs)
    if isinstance(result, dict):
        outputs = result
    elif isinstance(result, (tuple, list)):
        outputs = dict(zip(reference, result))
    else:
        outputs = {next(iter(reference)): result}
    from tilec.tolerance import max_error, mismatches

    for name, ref in reference.items():
        print(f"nki    {name}: max abs error vs reference {float(max_error(outputs[name], ref)):.3g}")
        nan = int(np.isnan(np.asarray(ref, np.float64)).sum())
        if nan:  # NaN on both sides compares equal: say so, the inputs may be outside a function's domain
            note(f"{name}: {nan} of {np.size(ref)} values are NaN in the reference (and in the same places in the "
                 f"kernel's output): an input outside a function's domain? (random inputs are uniform in [-1, 1))")
    for bad in mismatches(bound, outputs, reference, inputs)[:1]:  # (also catches NaN on one side)
        raise TilecError(f"the NKI kernel's `{bad.name}` differs from the reference evaluator by {bad.error:.3g} "
                         f"(tolerance {bad.tolerance:.3g})",
                         hint="a compiler or interpreter bug: please report it with this program and -D sizes")
    return outputs


def _fmt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("programs", nargs="+", metavar="PROGRAM.tl", help="one or more .tl programs")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="exit 1 if a file is not canonically formatted")
    what.add_argument("-i", "--in-place", action="store_true", help="rewrite the files in place")


@command("fmt", "print .tl programs in canonical form (comments kept), check or rewrite them", _fmt_args)
def run_fmt(args: argparse.Namespace) -> int:
    from tilec.lang.fmt import format_source

    if len(args.programs) > 1 and not (args.check or args.in_place):
        raise UsageError("several files need --check or -i (printing them one after another would merge them)")
    status = 0
    for name in args.programs:
        path = pathlib.Path(name)
        if not path.is_file():
            raise TilecError(f"no such file: {path}", hint="give the path of a .tl program")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise TilecError(f"cannot read {path} as a .tl program: {err}",
                             hint="give a .tl program (UTF-8 text)") from None
        canonical = format_source(text, str(path))
        if args.check:
            if canonical != text:
                note(f"{path}: not canonically formatted (run tilec fmt -i {path})")
                status = EXIT_USER
        elif args.in_place:
            if canonical != text:
                _write_text(str(path), canonical, "the formatted program", "-i")
                note(f"reformatted {path}")
        else:
            sys.stdout.write(canonical)
    return status


class UsageError(Exception):
    """Options that do not fit together (argparse cannot say it): exit 2 like argparse's own usage errors."""


# ---- tune (TUNE, issue 6) -----------------------------------------------------------------------------------------


def _tune_args(p: argparse.ArgumentParser) -> None:
    _program_args(p)
    limit = p.add_mutually_exclusive_group()
    limit.add_argument("--budget", type=int, default=None, help="candidates to evaluate (default 48)")
    limit.add_argument("--time", type=float, default=None, metavar="S", help="stop after S seconds instead")
    p.add_argument("--seed", type=int, default=0, help="search seed; the same seed gives the same result")
    p.add_argument("--jobs", type=int, default=None,
                   help="worker processes evaluating candidates (default: one per available core)")
    p.add_argument("-o", "--output", metavar="KERNEL.py", help="write the tuned NKI kernel here")
    p.add_argument("--save-schedule", metavar="FILE", help="write the tuned schedule text here")
    p.add_argument("--no-cache", action="store_true", help="ignore and do not fill .tilec-cache/tune/")
    add_target(p)
    add_quiet(p)
    _nki_arg(p)


@command("tune", "search the schedule space with the performance model; write the best kernel", _tune_args)
def _tune_run(args: argparse.Namespace) -> int:
    from tilec import progress
    from tilec.tune.api import DEFAULT_BUDGET, summary_text, tune

    show = not args.quiet and progress.wanted(sys.stderr)
    budget = args.budget if args.budget is not None or args.time is not None else DEFAULT_BUDGET
    result = tune(args.program, parse_defines(args.defines) or None, budget=budget, time_s=args.time,
                  seed=args.seed, jobs=args.jobs, progress=show, use_cache=not args.no_cache, nki=args.nki,
                  target=args.target or "trn2")
    if result.verified:  # files first: the summary goes to stdout, which may be a pipe that closes early
        if args.save_schedule:
            _write_text(args.save_schedule, result.best_schedule, "the schedule", "--save-schedule")
        if args.output:
            _write_text(args.output, result.source)
    print(summary_text(result))
    if not result.verified:
        print("error: the tuned kernel did not match the reference evaluator; nothing written", file=sys.stderr)
        return 1
    return 0


# ---- profile (PERF, issue 5) --------------------------------------------------------------------------------------


def _profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="an NKI kernel file (.py) or a tilec program (.tl)")
    add_kernel_inputs(p)
    add_sizes(p)
    add_schedule(p)
    add_target(p)
    p.add_argument("-o", "--output", metavar="TRACE.json",
                   help="the Perfetto / Chrome trace of the modelled timeline (default <name>.trace.json here; "
                        "open it in https://ui.perfetto.dev)")
    p.add_argument("--html", metavar="OUT.html", help="also (with -o) or only write the timeline as an HTML picture")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
    _nki_arg(p)
    add_quiet(p)


@command("profile", "estimate a kernel's latency with the Trainium2 model; print the summary, write a Perfetto trace",
         _profile_args)
def _profile_run(args: argparse.Namespace) -> int:
    import json

    from tilec import progress
    from tilec.perf.api import estimate, write_timeline
    from tilec.perf.export import headline, summary_json, write_trace
    from tilec.perf.report import line_report, tl_line_map

    path = pathlib.Path(args.file)
    if not path.exists():
        raise TilecError(f"no such file: {args.file}")
    if path.suffix == ".tl":
        trace, kernel_source = _profile_trace_tl(path, parse_defines(args.defines), args.schedule, args.nki,
                                                 args.target)
    elif args.schedule:
        raise TilecError("--schedule applies to .tl programs", hint="profile the .tl program with --schedule, or "
                                                                     "the kernel file alone")
    else:
        trace, kernel_source = _profile_trace_py(path, args)
    with progress.stage("modelling the timeline"):
        est = estimate(trace, args.target or trace.target or "trn2")
    tl_map = tl_line_map(kernel_source) or None  # generated kernels (.tl or their .py) carry `# tl:LINE` marks
    if args.json:
        print(json.dumps(summary_json(est, tl_map), indent=1))
    else:
        print(headline(est) + "\n" + est.summary_text() + line_report(est, tl_map), end="")
    if args.output or not args.html:
        out = args.output or path.stem + ".trace.json"
        try:
            write_trace(est, out, tl_map)
        except OSError as err:
            raise TilecError(f"cannot write {out}: {err.strerror or err}",
                             hint="give -o a writable path in an existing directory") from None
        note(f"wrote {out} (open it in https://ui.perfetto.dev)")
    if args.html:
        try:
            write_timeline(est, args.html, tl_map)
        except OSError as err:
            raise TilecError(f"cannot write {args.html}: {err.strerror or err}",
                             hint="give --html a writable path in an existing directory") from None
        note(f"wrote {args.html}")
    return 0


def _profile_trace_py(path, args: argparse.Namespace):
    from tilec import progress
    from tilec.nki import api as nki_api

    name = _kernel_name(str(path), args.kernel, "profiling")
    inputs = _kernel_inputs(str(path), name, args)
    with progress.stage(f"running {name} on the interpreter"):
        _, trace = nki_api.run_file(str(path), name, inputs, target=args.target)
    return trace, path.read_text()


def _by_parameter(arrays: dict, params: list[str]) -> dict:
    """Arrays named after the kernel's parameters stay so; otherwise they are taken in parameter order."""
    if set(arrays) <= set(params):
        return arrays
    if len(arrays) > len(params):
        raise TilecError(f"{len(arrays)} input arrays for {len(params)} kernel parameters ({', '.join(params)})")
    return dict(zip(params, arrays.values()))


def _shape_spec(text: str, params: list[str], index: int) -> tuple[str, tuple[tuple[int, ...], str]]:
    """--shape NAME=128x512:float16, or 128x512:float16 for the next parameter in order."""
    from tilec.nki.api import parse_shape_spec

    if "=" not in text:
        if index >= len(params):
            raise TilecError(f"more --shape options than kernel parameters ({', '.join(params)})")
        text = f"{params[index]}={text}"
    try:
        return parse_shape_spec(text)
    except ValueError as err:
        raise TilecError(f"bad --shape {text!r}: {err}",
                         hint="write e.g. --shape 256x256x3x3:float16 or --shape w=256x256x3x3:float16") from None


def _profile_trace_tl(path, defines: dict[str, int], schedule: str | None = None, nki: str | None = None,
                      target: str | None = None):
    """The trace of a .tl program's kernel from a trace-only run: the same trace and checks as a full run, without
    the arithmetic (several times faster on convolutions), on random inputs in the declared dtypes."""
    from tilec import compile_file, progress
    from tilec.lang.api import random_inputs

    with progress.stage("compiling and tracing on the interpreter"):
        compiled = compile_file(str(path), defines or None, schedule, nki, target)
        _, trace = compiled.run_traced(**random_inputs(compiled.program, seed=0), numerics=False)
    return trace, compiled.source


# ---- compiler (issue 4): compile, explain ----------------------------------------------------------------------


def _compile_args(p: argparse.ArgumentParser) -> None:
    _program_args(p)
    p.add_argument("-o", "--output", metavar="KERNEL.py", help="write the NKI kernel here (default: print it)")
    add_schedule(p)
    p.add_argument("--dump-ir", metavar="STAGE|all", help="print the IR after a pipeline stage (or all of them)")
    _nki_arg(p)
    add_target(p)
    p.add_argument("--shapes", action="append", metavar="N=4,H=32,...",
                   help="one module for several shapes: a kernel per --shapes (sizes as with -D; repeat), under one "
                        "@nki.jit dispatcher named after the kernel")
    p.add_argument("--dtype", action="append", choices=["f32", "f16", "bf16"],
                   help="with --shapes: the tensors' dtypes (repeat for several; default: as the program declares)")


@command("compile", "compile a .tl program to an NKI kernel (Python module)", _compile_args)
def run_compile(args: argparse.Namespace) -> int:
    from tilec.compiler.api import STAGES, compile_file

    if args.dump_ir and args.dump_ir != "all" and args.dump_ir not in STAGES:
        raise TilecError(f"unknown IR stage {args.dump_ir!r}", hint="stages: " + ", ".join(STAGES) + ", all")
    if args.shapes or args.dtype:
        return _compile_bundle(args)
    compiled = compile_file(args.program, parse_defines(args.defines) or None, args.schedule, args.nki,
                            target=args.target)
    if args.dump_ir:
        for name, text in compiled.stages.items():
            if args.dump_ir in ("all", name):
                print(f"=== {name} ===\n{text}")
    if args.output:
        _write_text(args.output, compiled.source)
        note(f"wrote {args.output} (kernel {compiled.kernel_name})")
    elif not args.dump_ir:
        print(compiled.source, end="")
    return 0


def _compile_bundle(args: argparse.Namespace) -> int:
    """`tilec compile PROG.tl --shapes N=4,H=32 --shapes N=1,H=224 --dtype f32 --dtype f16 -o kernel.py`: one
    module whose kernel serves every (shapes, dtype) pair (tilec.jit.bundle)."""
    from tilec.jit import Case, bundle
    from tilec.lang import api as lang

    if args.dump_ir:
        raise UsageError("--dump-ir shows one compilation; use it without --shapes/--dtype")
    base = parse_defines(args.defines)
    # without --shapes (only --dtype): one specialisation at the program's own sizes and the -D ones
    sets = [{**base, **parse_defines([d for d in s.split(",") if d])} for s in args.shapes or [""]]
    program = lang.load(args.program, sets[0] or None)
    declared = sorted({t.dtype for t in program.tensors.values()})
    dtypes = args.dtype or declared[:1]
    cases = [Case(args.program, sizes, dtype, schedule=args.schedule, target=args.target) for dtype in dtypes
             for sizes in sets]
    source = bundle(program.kernel.name, [p.name for p in program.kernel.params], cases, args.nki)
    if args.output:
        _write_text(args.output, source)
        plural = "" if len(cases) == 1 else "s"
        note(f"wrote {args.output} (kernel {program.kernel.name}, {len(cases)} specialisation{plural})")
    else:
        print(source, end="")
    return 0


def _explain_args(p: argparse.ArgumentParser) -> None:
    _program_args(p)
    add_schedule(p)
    add_target(p)


@command("explain", "show what the compiler does with a program: operations, schedule, buffers, memory use",
         _explain_args)
def run_explain(args: argparse.Namespace) -> int:
    from tilec.compiler.api import compile_file, explain

    print(explain(compile_file(args.program, parse_defines(args.defines) or None, args.schedule,
                               target=args.target)),
          end="")
    return 0


# ---- examples (packaging, issue 14) -------------------------------------------------------------------------------


def _examples_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--copy", metavar="DIR", help="copy the example programs into DIR (created if needed; existing "
                                                 "files are kept)")


@command("examples", "list the example .tl programs shipped with tilec (or copy them somewhere to edit)",
         _examples_args)
def run_examples(args: argparse.Namespace) -> int:
    from tilec.resources import examples

    found = examples()
    if args.copy:
        target = pathlib.Path(args.copy)
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TilecError(f"cannot create {target}: {err.strerror or err}", hint="give --copy a writable path")
        for path in found:
            dest = target / path.name
            if dest.exists():
                note(f"kept {dest} (exists)")
                continue
            _write_text(str(dest), path.read_text(), "the example", "--copy")
            note(f"wrote {dest}")
        return 0
    width = max(len(p.name) for p in found)
    for path in found:
        print(f"{path.name:<{width}}  {_first_comment(path)}")
    print(f"\n(in {found[0].parent}; `tilec examples --copy DIR` copies them, "
          f"`tilec run {found[0].parent / 'vector_add.tl'}` runs one)")
    return 0


def _first_comment(path: pathlib.Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("# ").rstrip()
            return text if len(text) <= 90 else text[:87] + "..."
    return ""


# ---- entry point ---------------------------------------------------------------------------------------------------


HELP_ORDER = ("check", "fmt", "run", "compile", "explain", "profile", "tune", "nki-run", "examples")


def build_parser() -> argparse.ArgumentParser:
    from tilec import __version__

    parser = argparse.ArgumentParser(
        prog="tilec",
        description="Compile loop nests (.tl) to NKI kernels for AWS Trainium; run NKI kernels on a CPU interpreter;"
        " estimate their latency on a Trainium2 NeuronCore.",
        epilog="exit codes: 0 ok, 1 error in your program or inputs, 2 bad options, 3 internal error, "
               "130 interrupted",
    )
    parser.add_argument("--version", action="version", version=f"tilec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    order = {name: i for i, name in enumerate(HELP_ORDER)}  # the order of a user's day; others after them
    for name, help, add_args, run in sorted(COMMANDS, key=lambda c: order.get(c[0], len(order))):
        p = sub.add_parser(name, help=help, description=help)
        add_args(p)
        p.set_defaults(run=run, parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors exit 2 here, with argparse's message
    from tilec import progress

    progress.configure(False if getattr(args, "quiet", False) else None)  # None: shown on a terminal only
    try:
        return args.run(args)
    except UsageError as err:
        args.parser.print_usage(sys.stderr)
        print(f"tilec {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except TilecError as err:
        print(err.render(), file=sys.stderr)
        return EXIT_USER
    except KernelError as err:
        print(err, file=sys.stderr)  # already "file:line: error: rule ..." with the tile, shape and a hint
        return EXIT_USER
    except BrokenPipeError:  # e.g. `tilec explain PROG.tl | head`: the reader left early, nothing went wrong here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail again
        return EXIT_USER
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback; output files are written whole or not at all
        print("tilec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except InternalError as err:  # a compiler bug, caught by an IR verifier: say so plainly, no traceback
        print(f"internal compiler error: {err}\n  this is a bug in tilec, not in your program; please report it with"
              " the program and its -D sizes (TILEC_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        if os.environ.get("TILEC_TRACEBACK"):
            raise
        return EXIT_INTERNAL
    except Exception as err:  # noqa: BLE001  anything else is a bug in tilec too
        if os.environ.get("TILEC_TRACEBACK"):
            raise
        print(f"internal error: {type(err).__name__}: {err}\n  this is a bug in tilec; please report it with the "
              "command line (TILEC_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
