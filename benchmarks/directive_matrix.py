"""Issue 10's directives tried on every statement of the audit15 programs (tests/programs/audit15/, at the sizes of
tests/compiler/test_audit15_programs.py), as a user tries them after `tilec explain`: each directive alone, and the
outcome of each attempt:

    works    accepted, the kernel differs from the default one, and the interpreter matches the NumPy formula
    works01  the same, but only the NKI 0.1 form differs (`unroll`: in 0.6 every loop is a `range`, unrolled when
             traced, so a static range prints as the default does)
    refused  a TilecError located at the directive's line
    same     accepted and the kernel is the default one (a directive silently ignored)
    wrong    accepted, and the interpreter does not match NumPy
    noloc    a TilecError without a location;  internal: any other exception

    python benchmarks/directive_matrix.py               # the table and the totals
    python benchmarks/directive_matrix.py --list        # every attempt with its outcome and message
    python benchmarks/directive_matrix.py --reasons     # the refusals counted by directive x op kind x reason

Per statement OP (named by its target) with loops v_first .. v_last: `tile OP.v_last, 64`, `tile OP.v_first, 64`,
`split OP.v_first, 2`, `reorder OP, <its loops reversed>`, `unroll OP.v_first`, `unroll OP.v_last`, and for each
tensor X it reads: `buffers X, 1` and `buffers X, 3` (inputs), `compute_at X, OP.v_first` and `place X, hbm|sbuf`
(temporaries). core19's matrix (docs/notes/core19.md) had the columns tile (v_last), split, reorder, compute_at,
place and buffers (3).
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import pathlib
import re
import sys


ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tilec.compiler.api import compile_loaded, read_schedule  # noqa: E402
from tilec.errors import TilecError  # noqa: E402
from tilec.lang import api as lang  # noqa: E402

_spec = importlib.util.spec_from_file_location("audit15_programs",
                                               ROOT / "tests" / "compiler" / "test_audit15_programs.py")
assert _spec and _spec.loader
programs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(programs)

FOR = re.compile(r"^(\s*)for (.*):\s*$")
STMT = re.compile(r"^(\s*)(\w+)\[[^\]]*\]\s*(=|\+=|max=|min=)\s*(.*)$")
COLUMNS = ("tile", "tile_p", "split", "reorder", "unroll", "unroll_f", "buffers1", "buffers", "compute_at", "place")


def statements(text: str) -> list[tuple[str, list[str], set[str]]]:
    """(target, enclosing loop variables in order, tensors read) per statement of a .tl text (merged by target)."""
    stack: list[tuple[int, list[str]]] = []
    out: dict[str, tuple[list[str], set[str]]] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if m := FOR.match(line):
            stack.append((indent, [part.split(" in ")[0].strip() for part in m.group(2).split(",")]))
        elif (m := STMT.match(line)) and stack:
            loops = [v for _, vs in stack for v in vs]
            old = out.get(m.group(2), ([], set()))
            longest = loops if len(loops) > len(old[0]) else old[0]
            out[m.group(2)] = (longest, old[1] | set(re.findall(r"(\w+)\[", m.group(4))))
    return [(t, loops, reads) for t, (loops, reads) in out.items()]


def attempts(text: str, inputs: set[str]) -> list[tuple[str, str, str]]:
    """(column, directive, the statement it is tried on) for every statement of the program."""
    found = []
    for op, loops, reads in statements(text):
        found += [("tile", f"tile {op}.{loops[-1]}, 64", op), ("tile_p", f"tile {op}.{loops[0]}, 64", op),
                  ("split", f"split {op}.{loops[0]}, 2", op),
                  ("reorder", f"reorder {op}, {', '.join(loops[::-1])}", op),
                  ("unroll", f"unroll {op}.{loops[0]}", op), ("unroll_f", f"unroll {op}.{loops[-1]}", op)]
        for x in sorted(reads - {op}):
            if x in inputs:
                found += [("buffers1", f"buffers {x}, 1", op), ("buffers", f"buffers {x}, 3", op)]
            else:
                found += [("compute_at", f"compute_at {x}, {op}.{loops[0]}", x), ("place", f"place {x}, hbm", x),
                          ("place", f"place {x}, sbuf", x)]
    return list({(c, d): (c, d, o) for c, d, o in found}.values())


def code(source: str) -> str:
    """A kernel's code without its module docstring (which lists the schedule's directives)."""
    return source.split('"""', 2)[-1]


def outcome(name: str, directive: str, default: tuple[str, str]) -> tuple[str, str]:
    program = lang.load(programs.PROGRAMS / f"{name}.tl", programs.CASES[name][0])
    try:
        compiled = compile_loaded(program, read_schedule(directive), "0.6")
    except TilecError as e:
        located = e.span is not None and e.span.line == 1
        return ("refused" if located else "noloc"), str(e).splitlines()[0]
    except Exception as e:  # noqa: BLE001 (the matrix reports it)
        return "internal", f"{type(e).__name__}: {e}"
    changed = "works" if code(compiled.source) != default[0] else "works01" \
        if code(compile_loaded(program, read_schedule(directive), "0.1").source) != default[1] else ""
    if not changed:
        return "same", ""
    given, exact = programs.inputs(name, program)
    got = compiled.run(**given)
    bad = programs.beyond_tolerance(name, program, got, exact)
    if bad:
        return "wrong", bad[0]
    return changed, ""


def kind(compiled, name: str) -> str:
    """The kind of the op writing tensor `name` in the default kernel (its fused part's kind when fused)."""
    chain = next((c.kind for c in compiled.result.chains if name in c.members), "")
    op = next((o for o in compiled.result.ops if o.out == name), None)
    what = {"ColumnReduceOp": "column sum", "ReduceOp": "row reduction", "TransposeOp": "transpose",
            "ConvOp": "conv", "PoolOp": "pool"}.get(type(op).__name__, "")
    if type(op).__name__ == "EltwiseOp":
        what = "copy" if op.copy else "element-wise, broadcast" if op.layout else "element-wise, flat"
    return f"{what} in a {chain}" if chain else what or "-"


# the refusals' reasons, by a phrase of their message (the first that occurs); "nothing would change" ones first
REASONS = (
    ("no-op: one iteration to unroll", "has one iteration: nothing to unroll"),
    ("no-op: NKI's rotation already (buffers 3)", "already keeps several in flight"),
    ("no-op: one free tile, any order", "give one free tile"),
    ("no-op: the rule's order already", "is the order the rule compiles"),
    ("no-op: through HBM already", "goes through HBM without the directive too"),
    ("no-op: on chip already (a fused chain)", "stays on chip without the directive"),
    ("no-op: staged once (a broadcast operand)", "has no buffer setting"),
    ("tile larger than the data", "is more than the"),
    ("tile wider than a partition's data", "is wider than the"),
    ("on chip or not: the compiler's choice", "is the compiler's choice"),
    ("reduced tiles outside the row tiles", "cannot go outside its"),
    ("an outer loop taken one at a time", "are taken one at a time outside its tiles"),
    ("a flattened run swapped", "cannot be ordered"),
    ("flattened data: no order", "its loops are flattened in memory order"),
    ("the rule fixes its order", "has a fixed loop order"),
    ("split: a reduction's tiles are its DMAs", "is not compiled: a reduction's tiles are its DMAs"),
    ("split: a broadcast layout's tiles are its DMAs", "a split of them is not compiled"),
    ("split: N tiles do not divide", "does not divide them"),
    ("split: not compiled for this kind", "cannot be split here"),
    ("buffers: several statements of one fused part read it", "its tiles are that part's"),
    ("buffers: several statements read it", "`buffers` sets the tiles of one statement"),
    ("buffers: nothing multi-buffered", "has no multi-buffered input"),
    ("tile does not divide", "does not divide"),
    ("loop merged into an axis", "is merged with"),
    ("unroll: not a tile loop", "can be unrolled"),
    ("a builder of its own", "cannot apply to"),
    ("an outer loop of the layout", "is an outer loop of"),
    ("tile: not a loop of the layout", "only the reduced loops and the kept loops"),
    ("no such tensor", "no computation or schedulable tensor"),
)


def reason(message: str) -> str:
    """The reason a refusal gives (REASONS), or its first 80 characters."""
    text = message.split("error: ", 1)[-1]
    return next((label for label, phrase in REASONS if phrase in text), text[:80])


LETTER = {"works": "w", "works01": "u", "refused": "r", "same": "s", "wrong": "X", "noloc": "N", "internal": "I"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="every attempt with its outcome and message")
    ap.add_argument("--reasons", action="store_true", help="the refusals by directive x op kind x reason")
    ap.add_argument("names", nargs="*", help="program stems (default: all)")
    args = ap.parse_args()
    totals: collections.Counter = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    per_column: dict[str, collections.Counter] = {c: collections.Counter() for c in COLUMNS}
    print("| program | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for name in args.names or sorted(programs.CASES):
        path = programs.PROGRAMS / f"{name}.tl"
        program = lang.load(path, programs.CASES[name][0])
        compiled = [compile_loaded(program, read_schedule(""), nki) for nki in ("0.6", "0.1")]
        default = tuple(code(c.source) for c in compiled)
        cells: dict[str, collections.Counter] = {c: collections.Counter() for c in COLUMNS}
        for column, directive, op in attempts(path.read_text(), {t.name for t in program.inputs}):
            result, message = outcome(name, directive, default)
            cells[column][result] += 1
            per_column[column][result] += 1
            totals[result] += 1
            if args.list:
                print(f"  {name}: {directive}: {result} {message}", file=sys.stderr)
            if result == "refused":
                reasons[(directive.split()[0], kind(compiled[0], op), reason(message))] += 1
        row = [" ".join(f"{LETTER[k]}{n}" for k, n in sorted(c.items())) or "-" for c in cells.values()]
        print(f"| {name} | " + " | ".join(row) + " |", flush=True)
    print()
    for column, c in per_column.items():
        print(f"{column}: " + ", ".join(f"{k} {n}" for k, n in sorted(c.items())))
    print("total: " + ", ".join(f"{k} {n}" for k, n in sorted(totals.items())))
    if args.reasons:
        print("\n| refused | directive | op kind | reason |\n|---|---|---|---|")
        for (directive, what, why), n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"| {n} | {directive} | {what} | {why} |")


if __name__ == "__main__":
    main()
