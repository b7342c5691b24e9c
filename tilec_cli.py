"""The `tilec` command line. Each subcommand is a pair (add its arguments, run it) in COMMANDS; it calls only the
public API in `tilec`. A TilecError is printed with its caret display and exits 1, never as a traceback."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from tilec.errors import InternalError, KernelError, TilecError

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


def _write_text(path: str, text: str, what: str = "the kernel", option: str = "-o") -> None:
    """Write an output file; a bad path is the user's mistake, reported with a hint, not a traceback."""
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as err:
        raise TilecError(f"cannot write {what} to {path}: {err.strerror or err}",
                         hint=f"give {option} a writable file path in an existing directory") from None


# ---- subcommands: each owner adds its own block below ------------------------------------------------------------


# ---- nki-run (NKI interpreter, issue 3) ----------------------------------------------------------------------------


def _nki_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a Python file with @nki.jit kernels (imports neuronxcc.nki as usual)")
    p.add_argument("--kernel", required=True, help="name of the kernel function in the file")
    p.add_argument("--inputs", help="an .npz file with one array per kernel parameter name")
    p.add_argument("--shape", action="append", metavar="NAME=AxB[:dtype]",
                   help="random input for a parameter, e.g. --shape a=128x512:float16 (repeatable)")
    p.add_argument("--arg", action="append", metavar="NAME=VALUE", help="a scalar argument, e.g. --arg pool_size=2")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--target", default="trn2", help="trn2 (default) or trn1")
    p.add_argument("--out", help="save the outputs to this .npz file")
    p.add_argument("--trace", action="store_true", help="print every executed instruction")


@command("nki-run", "run an NKI kernel file on tilec's CPU interpreter of neuronxcc.nki", _nki_run_args)
def _nki_run(args: argparse.Namespace) -> int:
    from tilec.nki import api as nki_api

    inputs: dict[str, object] = _load_npz(args.inputs) if args.inputs else {}
    try:
        specs = dict(nki_api.parse_shape_spec(s) for s in args.shape or [])
    except ValueError as err:
        raise TilecError(str(err), hint="e.g. --shape a=128x512:float16") from None
    try:
        inputs.update(nki_api.random_inputs(specs, args.seed))
    except MemoryError as err:
        raise TilecError(f"not enough memory for the --shape inputs: {err}", hint="choose smaller shapes") from None
    inputs.update(_scalar_args(args.arg))
    outputs, trace = nki_api.run_file(args.file, args.kernel, inputs, target=args.target)
    if args.trace:
        print(nki_api.format_trace(trace))
    print(nki_api.summary(args.kernel, outputs, trace, inputs))
    if args.out:
        _save_npz(args.out, {**nki_api.named_outputs(outputs), **nki_api.written_arguments(trace, inputs)})
        print(f"outputs saved to {args.out}")
    return 0


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


def _program_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="the .tl program")
    p.add_argument("-D", dest="defines", action="append", metavar="NAME=VALUE", help="a size, e.g. -D C=256")


def _shape_text(info) -> str:
    dims = ", ".join(str(n) for n in info.shape) if info.shape is not None else "?"
    return f"{info.name}: {info.dtype}[{dims}]"


@command("check", "parse and check a .tl program; print its tensors and their shapes", _program_args)
def run_check(args: argparse.Namespace) -> int:
    from tilec.lang import api

    prog = api.check_file(args.program, parse_defines(args.defines))
    kinds = {"input": "in", "output": "out", "temp": "temp"}
    parts = [f"{kinds[t.kind]} {_shape_text(t)}" for t in prog.tensors.values()]
    unknown = [n for n in prog.facts.symbols if n not in prog.sizes]
    if unknown:  # bounds and divisions that need sizes are checked when -D or input arrays give them
        parts.append(f"sizes {', '.join(unknown)} unknown (give -D NAME=VALUE to check everything)")
    print(f"{prog.path}: OK: kernel {prog.kernel.name}; " + "; ".join(parts))
    return 0


def _run_args(p: argparse.ArgumentParser) -> None:
    _program_args(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--seed", type=int, default=0, help="random inputs from this seed (default 0)")
    source.add_argument("--inputs", metavar="IN.npz", help="input arrays, one per parameter name")
    p.add_argument("--out", metavar="OUT.npz", help="write the outputs here")
    p.add_argument("--backend", choices=["ref", "nki"], default="nki",
                   help="nki: compile, run on the NKI backend and compare with the reference evaluator (default); "
                        "ref: the NumPy reference evaluator only")
    p.add_argument("--schedule", help="a schedule file (e.g. from tilec tune --save-schedule) replacing the "
                                      "program's own; used by the nki backend")


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


def _save_npz(path: str, arrays: dict) -> None:
    import numpy as np

    try:
        np.savez(path, **arrays)
    except OSError as err:
        raise TilecError(f"cannot write {path}: {err.strerror or err}",
                         hint="give a writable path in an existing directory") from None


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
    outputs = api.evaluate(prog, inputs)
    if args.backend == "nki":
        outputs = _run_nki(args.program, bound, inputs, outputs, args.schedule)
    for name, array in outputs.items():
        print(f"output {_shape_text(bound.tensors[name])}  {_checksum(array)}")
    if args.out:
        _save_npz(args.out, outputs)
        print(f"wrote {args.out}")
    return 0


def _run_nki(path: str, bound, inputs: dict, reference: dict, schedule: str | None = None) -> dict:
    """Compile and run on the NKI backend; report the largest difference from the reference evaluator."""
    import numpy as np

    import tilec

    shapes = {name: bound.sizes[name] for name in bound.facts.symbols}
    result = tilec.compile_file(path, shapes=shapes, schedule=schedule).run(**inputs)
    if isinstance(result, dict):
        outputs = result
    elif isinstance(result, (tuple, list)):
        outputs = dict(zip(reference, result))
    else:
        outputs = {next(iter(reference)): result}
    from tilec.tolerance import max_error, program_budget, scale_of, tolerance

    budget = program_budget(bound)
    for name, ref in reference.items():
        err = max_error(outputs[name], ref)
        print(f"nki    {name}: max abs error vs reference {float(err):.3g}")
        acc_len, inter = budget.get(name, (1, None))
        tol = tolerance(np.asarray(ref).dtype, acc_len, scale_of(ref), inter)
        if not err <= tol:  # (also catches NaN on one side)
            raise TilecError(f"the NKI kernel's `{name}` differs from the reference evaluator by {float(err):.3g} "
                             f"(tolerance {tol:.3g})",
                             hint="a compiler or interpreter bug: please report it with this program and -D sizes")
    return outputs


def _fmt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="the .tl program")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="exit 1 if the file is not canonically formatted")
    what.add_argument("-i", "--in-place", action="store_true", help="rewrite the file in place")


@command("fmt", "print a .tl program in canonical form (comments kept)", _fmt_args)
def run_fmt(args: argparse.Namespace) -> int:
    import pathlib

    from tilec.lang.fmt import format_source

    path = pathlib.Path(args.program)
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
            print(f"{path}: not canonically formatted (run tilec fmt -i {path})", file=sys.stderr)
            return 1
        return 0
    if args.in_place:
        if canonical != text:
            path.write_text(canonical)
        return 0
    sys.stdout.write(canonical)
    return 0


# ---- tune (TUNE, issue 6) -----------------------------------------------------------------------------------------


def _tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="the .tl program")
    p.add_argument("-D", dest="defines", action="append", metavar="NAME=VALUE", help="a size, e.g. -D C=256")
    limit = p.add_mutually_exclusive_group()
    limit.add_argument("--budget", type=int, default=None, help="candidates to evaluate (default 48)")
    limit.add_argument("--time", type=float, default=None, metavar="S", help="stop after S seconds instead")
    p.add_argument("--seed", type=int, default=0, help="search seed; the same seed gives the same result")
    p.add_argument("--jobs", type=int, default=None,
                   help="worker processes evaluating candidates (default: one per available core)")
    p.add_argument("-o", "--output", metavar="KERNEL.py", help="write the tuned NKI kernel here")
    p.add_argument("--save-schedule", metavar="FILE", help="write the tuned schedule text here")
    p.add_argument("--no-cache", action="store_true", help="ignore and do not fill .tilec-cache/tune/")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


@command("tune", "search the schedule space with the performance model; write the best kernel", _tune_args)
def _tune_run(args: argparse.Namespace) -> int:
    from tilec.tune.api import DEFAULT_BUDGET, summary_text, tune

    budget = args.budget if args.budget is not None or args.time is not None else DEFAULT_BUDGET
    result = tune(args.program, parse_defines(args.defines) or None, budget=budget, time_s=args.time,
                  seed=args.seed, jobs=args.jobs, progress=not args.quiet, use_cache=not args.no_cache)
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
    p.add_argument("--kernel", help="the kernel function in FILE.py")
    p.add_argument("--inputs", metavar="IN.npz",
                   help="input arrays named after the kernel's parameters (else taken in parameter order)")
    p.add_argument("--shape", action="append", metavar="[NAME=]D0xD1..[:DTYPE]",
                   help="a random input (repeat; unnamed ones go in parameter order), e.g. 128x25600:float16")
    p.add_argument("--arg", action="append", metavar="NAME=VALUE", help="a scalar keyword argument, e.g. pool_size=2")
    p.add_argument("-D", dest="defines", action="append", metavar="NAME=VALUE", help="a size of a .tl program")
    p.add_argument("--schedule", help="a schedule file replacing the .tl program's own (e.g. from tilec tune)")
    p.add_argument("--target", help="modelled NeuronCore, trn2 or trn1 (default: the kernel's platform target)")
    p.add_argument("--html", metavar="OUT.html", help="timeline picture (default <name>.timeline.html)")


@command("profile", "estimate a kernel's latency with the Trainium2 model; print the summary, write the timeline",
         _profile_args)
def _profile_run(args: argparse.Namespace) -> int:
    import pathlib

    from tilec.perf.api import estimate, write_timeline
    from tilec.perf.report import line_report, tl_line_map

    path = pathlib.Path(args.file)
    if not path.exists():
        raise TilecError(f"no such file: {args.file}")
    if path.suffix == ".tl":
        trace, kernel_source = _profile_trace_tl(path, parse_defines(args.defines), args.schedule)
    elif args.schedule:
        raise TilecError("--schedule applies to .tl programs", hint="profile the .tl program with --schedule, or "
                                                                     "the kernel file alone")
    else:
        trace, kernel_source = _profile_trace_py(path, args)
    est = estimate(trace, args.target or trace.target or "trn2")
    print(est.summary_text(), end="")
    tl_map = tl_line_map(kernel_source) or None  # generated kernels (.tl or their .py) carry `# tl:LINE` marks
    print(line_report(est, tl_map), end="")
    html = args.html or str(path.with_suffix("")) + ".timeline.html"
    try:
        write_timeline(est, html, tl_map)
    except OSError as err:
        raise TilecError(f"cannot write {html}: {err.strerror or err}",
                         hint="give --html a writable path in an existing directory") from None
    print(f"timeline written to {html}")
    return 0


def _profile_trace_py(path, args: argparse.Namespace):
    import inspect

    from tilec.nki import api as nki_api

    if not args.kernel:
        raise TilecError("profiling a .py file needs --kernel NAME", hint="e.g. --kernel vector_add_stream")
    if bool(args.inputs) == bool(args.shape):
        raise TilecError("give the inputs as --inputs IN.npz or as --shape ... (one of them)")
    kernel = nki_api.load_kernel_file(str(path), args.kernel)
    params = list(inspect.signature(getattr(kernel, "func", kernel)).parameters)
    if args.inputs:
        inputs = _by_parameter(_load_npz(args.inputs), params)
    else:
        inputs = nki_api.random_inputs(dict(_profile_shape(text, params, i) for i, text in enumerate(args.shape)))
    inputs.update(_scalar_args(args.arg))
    _, trace = nki_api.run_file(str(path), args.kernel, inputs)
    return trace, path.read_text()


def _by_parameter(arrays: dict, params: list[str]) -> dict:
    """Arrays named after the kernel's parameters stay so; otherwise they are taken in parameter order."""
    if set(arrays) <= set(params):
        return arrays
    if len(arrays) > len(params):
        raise TilecError(f"{len(arrays)} input arrays for {len(params)} kernel parameters ({', '.join(params)})")
    return dict(zip(params, arrays.values()))


def _profile_shape(text: str, params: list[str], index: int) -> tuple[str, tuple[tuple[int, ...], str]]:
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


def _profile_trace_tl(path, defines: dict[str, int], schedule: str | None = None):
    from tilec import compile_file
    from tilec.lang.api import random_inputs

    compiled = compile_file(str(path), defines or None, schedule)
    _, trace = compiled.run_traced(**random_inputs(compiled.program, seed=0))  # cast to the declared dtypes there
    return trace, compiled.source


# ---- compiler (issue 4): compile, explain ----------------------------------------------------------------------


def _compile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="the .tl program")
    p.add_argument("-o", "--output", help="write the NKI kernel here (default: print it)")
    p.add_argument("-D", dest="defines", action="append", metavar="NAME=VALUE", help="size of a symbol")
    p.add_argument("--schedule", help="a schedule file (directives, one per line) replacing the program's own")
    p.add_argument("--dump-ir", metavar="STAGE|all", help="print the IR after a pipeline stage (or all of them)")


@command("compile", "compile a .tl program to an NKI kernel (Python module)", _compile_args)
def run_compile(args: argparse.Namespace) -> int:
    from tilec.compiler.api import STAGES, compile_file

    if args.dump_ir and args.dump_ir != "all" and args.dump_ir not in STAGES:
        raise TilecError(f"unknown IR stage {args.dump_ir!r}", hint="stages: " + ", ".join(STAGES) + ", all")
    compiled = compile_file(args.program, parse_defines(args.defines) or None, args.schedule)
    if args.dump_ir:
        for name, text in compiled.stages.items():
            if args.dump_ir in ("all", name):
                print(f"=== {name} ===\n{text}")
    if args.output:
        _write_text(args.output, compiled.source)
        print(f"wrote {args.output} (kernel {compiled.kernel_name})", file=sys.stderr)
    elif not args.dump_ir:
        print(compiled.source, end="")
    return 0


def _explain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", help="the .tl program")
    p.add_argument("-D", dest="defines", action="append", metavar="NAME=VALUE", help="size of a symbol")
    p.add_argument("--schedule", help="a schedule file replacing the program's own")


@command("explain", "show what the compiler does with a program: operations, schedule, buffers, memory use",
         _explain_args)
def run_explain(args: argparse.Namespace) -> int:
    from tilec.compiler.api import compile_file, explain

    print(explain(compile_file(args.program, parse_defines(args.defines) or None, args.schedule)), end="")
    return 0


# ---- entry point ---------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilec",
        description="Compile loop nests (.tl) to NKI kernels for AWS Trainium; run NKI kernels on a CPU interpreter;"
        " estimate their latency on a Trainium2 NeuronCore.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help, add_args, run in COMMANDS:
        p = sub.add_parser(name, help=help, description=help)
        add_args(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except TilecError as err:
        print(err.render(), file=sys.stderr)
        return 1
    except KernelError as err:
        print(err, file=sys.stderr)  # already "file:line: error: rule ..." with the tile, shape and a hint
        return 1
    except BrokenPipeError:  # e.g. `tilec explain PROG.tl | head`: the reader left early, nothing went wrong here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit-time flush cannot fail again
        return 1
    except InternalError as err:  # a compiler bug, caught by an IR verifier: say so plainly, no traceback
        print(f"internal compiler error: {err}\n  this is a bug in tilec, not in your program; please report it with"
              " the program and its -D sizes (TILEC_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        if os.environ.get("TILEC_TRACEBACK"):
            raise
        return 2


if __name__ == "__main__":
    sys.exit(main())
