"""The differential oracle: one program/schedule pair through reference, formula, compiler and interpreter.

    check(text, schedule, formula) -> Verdict(cls, stage, message)

Classes (the fuzzer counts them; every class but OK and REJECTED is a bug to fix):
    ok             the kernel's outputs match the reference evaluator within `tilec.tolerance`
    rejected       a clean TilecError with file:line:col (a program or schedule the compiler does not support)
    wrong          numbers differ beyond the tolerance (or NaN/inf on one side only)
    internal       a traceback, InternalError, IR verifier failure, or a kernel the interpreter refuses
                   (a generated kernel that breaks a hardware rule is the compiler's bug, not the user's)
    noloc          a TilecError without file:line:col
    ref-disagree   the reference evaluator differs from the family's NumPy formula
    hang           (set by the fuzzer's supervisor: the pair did not finish within its time limit)
    invalid        the generator wrote a program the checker rejects (a bug in the generator)
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tilec.errors import InternalError, KernelError, TilecError
from tilec.lang import api as lang
from tilec.tolerance import check_outputs, error_bounds, program_budget, scale_of, tolerance, worst

CLASSES = ("ok", "rejected", "wrong", "internal", "noloc", "ref-disagree", "hang", "invalid")
BUGS = ("wrong", "internal", "noloc", "ref-disagree", "hang", "invalid")


@dataclass(frozen=True)
class Verdict:
    cls: str
    stage: str = ""  # load | reference | formula | knobs | compile | run | compare
    message: str = ""

    @property
    def bug(self) -> bool:
        return self.cls in BUGS

    def line(self) -> str:
        return f"{self.cls} [{self.stage}] {self.message}".strip()


def _error(stage: str, err: BaseException) -> Verdict:
    if isinstance(err, TilecError):
        if err.span is None:
            return Verdict("noloc", stage, err.message.splitlines()[0] if err.message else "")
        return Verdict("rejected", stage, f"{err.span!r}: {err.message.splitlines()[0]}")
    text = str(err).strip().splitlines()
    return Verdict("internal", stage, f"{type(err).__name__}: {text[0] if text else ''}"[:300])


def knob_schedule(default, rng: random.Random) -> str:
    """A random point of the tuner's own space around the program compiled with its default schedule (legal by the
    tuner's static checks if one of a few draws is), rendered as schedule text."""
    from tilec.tune.knobs import space_of

    space = space_of(default, default.result.target.name)
    point = space.random_point(rng)
    for _ in range(8):
        if space.check(point) is None:
            break
        point = space.random_point(rng)
    return space.render(point)


def raw_schedule(program, rng: random.Random) -> str:
    """1-4 directives of any kind over the program's tensors and loops, with values that may be illegal: the
    compiler must either apply them or reject them with a location."""
    from tilec.compiler.directives import PHASES
    from tilec.lang import syntax as sx

    nests: dict[str, list[str]] = {}

    def walk(stmt, loops: list[str]) -> None:
        if isinstance(stmt, sx.Loop):
            for s in stmt.body:
                walk(s, loops + [stmt.var])
        else:
            nests.setdefault(stmt.target.tensor, [])
            nests[stmt.target.tensor] += [v for v in loops if v not in nests[stmt.target.tensor]]

    for stmt in program.kernel.body:
        walk(stmt, [])
    ops = list(nests)
    tensors = list(program.tensors)
    lines = []
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(ops)
        loop = rng.choice(nests[op])
        kind = rng.choice(("tile",) + PHASES)  # every directive the compiler knows (tile twice as often)
        n = rng.choice([1, 2, 3, 4, 8, 16, 21, 32, 64, 96, 128, 256, 512])
        if kind in ("tile", "split"):
            arg = f"factor={n}" if rng.random() < 0.15 else str(n)  # the keyword form the grammar documents
            lines.append(f"{kind} {op}.{loop}, {arg}")
        elif kind == "reorder" and len(nests[op]) > 1:
            lines.append(f"reorder {op}, {', '.join(rng.sample(nests[op], rng.randint(2, len(nests[op]))))}")
        elif kind == "partition":
            lines.append(f"partition {op}.{loop}")
        elif kind == "place":
            lines.append(f"place {rng.choice(tensors)}, {rng.choice(['sbuf', 'hbm', 'psum'])}")
        elif kind == "hoist":
            lines.append(f"hoist {rng.choice(tensors)}, {rng.choice(['root', f'{op}.{loop}'])}")
        elif kind == "buffers":
            lines.append(f"buffers {rng.choice(tensors)}, {rng.choice([1, 2, 3, 4])}")
        elif kind == "unroll":
            lines.append(f"unroll {op}.{loop}")
        elif kind == "method":
            lines.append(f"method {op}, {rng.choice(['pe', 'dma'])}")
        elif kind == "compute_at":
            other = rng.choice(ops)
            lines.append(f"compute_at {op}, {rng.choice(['root', f'{other}.{rng.choice(nests[other])}'])}")
    return "\n".join(lines) + "\n"


def with_schedule(text: str, schedule: str) -> str:
    """The program with the directives as its own `schedule:` section (the grammar's last section)."""
    lines = [f"    {line}\n" for line in schedule.splitlines() if line.strip()]
    return text + "  schedule:\n" + "".join(lines) if lines else text


def check_formula(program, ref: dict, formula: Callable | None, inputs: dict) -> Verdict | None:
    """The reference evaluator against the family's NumPy formula (float64 from the rounded inputs)."""
    if formula is None:
        return None
    env = {t.name: np.asarray(inputs[t.name], np.float32).astype(lang.NP_DTYPES[t.dtype]).astype(np.float64)
           for t in program.inputs}
    try:
        want = formula(env)
    except Exception as err:  # a formula that cannot run is the generator's bug, reported as such
        return Verdict("invalid", "formula", f"{type(err).__name__}: {err}")
    budget = program_budget(program)
    bounds = error_bounds(program, inputs, "formula")  # the float64 formula differs at every fp32 operation
    for name, got in ref.items():
        if name not in want:
            continue
        dtype = program.tensors[name].dtype
        expect = np.asarray(want[name], np.float64).astype(lang.NP_DTYPES[dtype])
        acc_len, _ = budget[name]
        err, tol = worst(got, expect, tolerance(dtype, acc_len, scale_of(expect)) + bounds[name])
        if not err <= tol:
            return Verdict("ref-disagree", "formula", f"{name}: |reference - formula| {err:.3g} > {tol:.3g}")
    return None


@dataclass
class Prepared:
    """One program, loaded and evaluated once for all the schedules tried on it: its inputs, the reference
    outputs, and (on demand) its compilation with the default schedule, which the tuner's space is built around."""
    text: str
    program: object = None
    inputs: dict | None = None
    ref: dict | None = None
    verdict: Verdict | None = None  # set when the program fails before any schedule (load, reference, formula)
    bounds: dict | None = None  # tilec.tolerance.error_bounds of the outputs (once per program)
    target: str | None = None  # the generation compiled for (tilec.target; None: the default) and run under
    _default: object = None

    def default(self):
        if self._default is None:
            from tilec.compiler.api import compile_loaded

            try:
                self._default = compile_loaded(self.program, None, target=self.target)
            except BaseException as err:  # kept, so every schedule kind of this program sees the same failure
                self._default = err
        if isinstance(self._default, BaseException):
            raise self._default
        return self._default


def prepare(text: str, formula: Callable | None = None, seed: int = 0, target: str | None = None) -> Prepared:
    prep = Prepared(text, target=target)
    try:
        prep.program = lang.load(text)
    except TilecError as err:
        prep.verdict = Verdict("invalid", "load", err.message)
        return prep
    except Exception as err:
        prep.verdict = _error("load", err)
        return prep
    program = prep.program
    try:
        prep.inputs = {k: v.astype(lang.NP_DTYPES[program.tensors[k].dtype])
                       for k, v in lang.random_inputs(program, seed).items()}
        prep.ref = lang.evaluate(program, prep.inputs)
        prep.bounds = error_bounds(program, prep.inputs)
    except Exception as err:
        prep.verdict = _error("reference", err)
        return prep
    prep.verdict = check_formula(program, prep.ref, formula, prep.inputs)
    return prep


def check(text: str, schedule: str | None, formula: Callable | None = None, seed: int = 0,
          schedule_kind: str = "given", target: str | None = None) -> tuple[Verdict, str | None]:
    """Run one pair; returns the verdict and the schedule text actually used (None: the program's own).
    schedule_kind: given (use `schedule`) | default | knobs | raw (draw one with `seed`); target: the generation
    compiled for and run under (None: the default)."""
    return check_prepared(prepare(text, formula, seed, target), schedule, seed, schedule_kind)


def check_prepared(prep: Prepared, schedule: str | None, seed: int = 0,
                   schedule_kind: str = "given") -> tuple[Verdict, str | None]:
    """One schedule on a prepared program (see `check`); `seed` draws the schedule."""
    rng = random.Random(seed)
    if prep.verdict is not None:
        return prep.verdict, schedule
    program, text = prep.program, prep.text
    if schedule_kind == "knobs":
        try:
            schedule = knob_schedule(prep.default(), rng)
        except Exception as err:
            v = _error("knobs", err)
            return (v if v.cls != "rejected" else Verdict("rejected", "knobs", v.message)), None
    elif schedule_kind == "raw":
        schedule = raw_schedule(program, rng)
    elif schedule_kind == "default":
        schedule = None
    try:
        from tilec.compiler.api import compile_loaded

        if schedule is not None and rng.random() < 0.2:
            compiled = compile_loaded(lang.load(with_schedule(text, schedule)), None, target=prep.target)
        elif schedule is None:
            compiled = prep.default()  # compiled once per program (the tuner's space starts from it too)
        else:
            directives = lang.parse_schedule(schedule, "<schedule>") if schedule is not None else None
            compiled = compile_loaded(program, directives, target=prep.target)
    except (TilecError, InternalError, Exception) as err:
        return _error("compile", err), schedule
    try:
        out = compiled.run(**prep.inputs)
    except (KernelError, TilecError, Exception) as err:
        v = _error("run", err)
        if v.cls == "rejected":  # a TilecError raised while running a kernel tilec generated: not the user's
            v = Verdict("internal", "run", v.message)
        return v, schedule
    bad_out = check_outputs(program, out, prep.ref, bounds=prep.bounds)
    if bad_out:
        return Verdict("wrong", "compare", "; ".join(bad_out)), schedule
    return Verdict("ok"), schedule
