"""What a set of programs exercises, in terms the fuzzer must cover: grammar rules and literal tokens, functions,
directives, and the compiler's operation kinds (with their epilogues and layouts) and row chains.

    constructs(text)        -> {"rule:add", "ASSIGN_OP:max=", "call:exp", ...}   (from the parse tree)
    schedule_constructs(s)  -> {"rule:key_arg", "directive:tile", ...}
    op_features(program)    -> {"op:conv", "op:conv+pool.maximum", "op:rowchain", ...}   (lower + select)
    expected()              -> everything the grammar, the function table and the directives define

The expected sets are read from their single sources (grammar/tilec.lark, tilec/lang/functions.py, the compiler's
directive phases), so a construct added there and not generated fails tests/fuzz/test_coverage.py.
"""
from __future__ import annotations

import re

from lark import Token, Tree

from tilec.lang.parser import GRAMMAR, _lark

LITERAL_TERMINAL = re.compile(r'^([A-Z][A-Z_]*):\s*("[^"]*"(?:\s*\|\s*"[^"]*")*)\s*(?://.*)?$', re.M)


def grammar_constructs() -> set[str]:
    """Every rule (or alias) that shows in a parse tree, and every alternative of a terminal made of literals."""
    out = set()
    for rule in _lark().rules:
        name = str(rule.alias or rule.origin.name)
        if name.startswith("_") or (rule.options.expand1 and not rule.alias):
            continue
        out.add(f"rule:{name}")
    for name, alts in LITERAL_TERMINAL.findall(GRAMMAR.read_text()):
        out |= {f"{name}:{lit}" for lit in re.findall(r'"([^"]*)"', alts)}
    return out


def _literal_terminals() -> set[str]:
    return {name for name, _ in LITERAL_TERMINAL.findall(GRAMMAR.read_text())}


def _walk(tree: Tree) -> set[str]:
    out, literal = set(), _literal_terminals()
    for sub in tree.iter_subtrees():
        out.add(f"rule:{sub.data}")
        if sub.data == "call":
            out.add(f"call:{sub.children[0]}")
        if sub.data == "directive":
            out.add(f"directive:{sub.children[0]}")
        for ch in sub.children:
            if isinstance(ch, Token) and ch.type in literal:
                out.add(f"{ch.type}:{ch}")
    return out


def _parse(text: str, start: str) -> Tree:
    lark = _lark()
    lark.options.postlex.file, lark.options.postlex.source = "<coverage>", text
    return lark.parse(text if text.endswith("\n") else text + "\n", start=start)


def constructs(text: str) -> set[str]:
    return _walk(_parse(text, "start")) | ({"comment"} if "#" in text else set())


def schedule_constructs(text: str) -> set[str]:
    return _walk(_parse(text, "schedule_file"))


def op_features(program) -> set[str]:
    """The compiler's operations for a program (its default selection), or {} when it rejects the program."""
    from tilec.compiler.build_conv import is_convolution
    from tilec.compiler.build_rowchain import row_chains
    from tilec.compiler.lower import lower
    from tilec.compiler.ops import ColumnReduceOp, ConvOp, EltwiseOp, PoolOp, ReduceOp, TransposeOp
    from tilec.compiler.select import select
    from tilec.errors import TilecError

    try:
        ops = select(lower(program.kernel, program.sizes), program)
    except TilecError:
        return set()
    out = set()
    for op in ops:
        if isinstance(op, ConvOp):
            base = "op:conv" if is_convolution(op) else "op:matmul"
            extras = [f"bias-{op.bias_role}" if op.bias else "", "relu" if op.relu else "",
                      f"pool.{op.pool.op}" if op.pool else "", "ck" if op.w_layout == "ck" else "",
                      "strided" if op.stride != (1, 1) else ""]
        elif isinstance(op, PoolOp):
            base, extras = f"op:pool.{op.pool.op}", ["scaled" if op.pool.scale != 1.0 else ""]
        elif isinstance(op, TransposeOp):
            base, extras = "op:transpose", ["batched" if dict(op.dims).get("B", 1) > 1 else ""]
        elif isinstance(op, ColumnReduceOp):
            base, extras = f"op:reduce-columns.{op.op}", ["scaled" if op.scale != 1.0 else ""]
        elif isinstance(op, ReduceOp):
            base = f"op:reduce-rows.{op.op}"
            extras = ["scaled" if op.scale != 1.0 else "", "expr" if op.expr is not None else ""]
        elif isinstance(op, EltwiseOp):
            base = "op:eltwise"
            extras = ["columns" if op.columns else "", "rows" if op.rows else "", "fused" if op.fused else ""]
        else:
            base, extras = f"op:{type(op).__name__}", []
        out |= {base} | {f"{base}+{e}" for e in extras if e}
    if any(len(chain) > 1 for chain in row_chains(ops, set())):
        out.add("op:rowchain")
    return out


def expected() -> set[str]:
    from tilec.compiler.directives import PHASES
    from tilec.lang.functions import FUNCTIONS

    return grammar_constructs() | {f"call:{f}" for f in FUNCTIONS} | {f"directive:{d}" for d in PHASES}
