"""The compiler pipeline: one flat list of named passes, each printable by name (`--dump-ir STAGE|all`).

The IR verifier runs after every pass that produces loop-nest IR; a failure is an InternalError (a compiler bug).
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass, replace
from typing import AbstractSet, Callable

from tilec.compiler.op_scope import scoped_parts
from tilec.compiler import build_attention, build_depthwise, build_mbblock, build_mlp, conv_chain, fusers, ir, \
    passes, placement, pool_chain, stem_chain
from tilec.compiler.build_conv import build_conv, conv_loop_vars
from tilec.compiler.store_regions import stores_in_place
from tilec.compiler.unit_copies import unit_copies_dropped
from tilec.compiler.pair_tiles import skew_inner_tiles, skew_row_tiles
from tilec.compiler import rules, rules_colragged, rules_copy
from tilec.compiler.rules_pool import build_pool, pool as pool_prims
from tilec.compiler.lower_tiles import (colreduce_nest, copy_nest, eltwise_nest, lower_tiles, permute_between,
                                       reduce_nest, transpose_nest)
from tilec.compiler.build_reduce import build_reduce, resident, short_rows
from tilec.compiler.build_colreduce import build_column_reduce, extreme_note
from tilec.compiler.build_rowchain import row_chains
from tilec.compiler.build_util import used_consts
from tilec.compiler.rules_colreduce import terms_before_pairs
from tilec.compiler.codegen import emit
from tilec.compiler.dma_merge import merge_block_dmas
from tilec.compiler.lower import lower, print_comps
from tilec.compiler.named import name_sizes, size_consts
from tilec.compiler.names import NameAllocator, program_names, sanitised, unique
from tilec.compiler import nest as level_a
from tilec.compiler.nest import Kernel as Nest, lower_nest, print_nest, verify_nest
from tilec.compiler.primitives import UNROLL_MAX
from tilec.compiler.tensorize import match
from tilec.compiler.directives import (ChainChoice, ReaderBuffers, SharedTiles, apply_schedule, op_for, operand_of,
                                       to_hbm)
from tilec.compiler.ir import DTYPE_BYTES
from tilec.compiler.schedule import (ConvPlan, EltwisePlan, ReducePlan, default_plan, default_transpose,
                                     once, plan_directives, print_plans, print_schedule)
from tilec.compiler.ops import ColumnReduceOp, ConvOp, EltwiseOp, PoolOp, ReduceOp, TransposeOp
from tilec.compiler.select import print_ops, select
from tilec.compiler.squeeze import squeeze
from tilec.compiler.schedule import fmt_directive, inner_pool_plan, sbuf_budget
from tilec.compiler.fusers import AHEAD, AHEAD_TILES
from tilec.compiler.compute_at import inline_compute_at, inline_reduced_temporaries
from tilec.compiler.dma_streams import columns_ahead, cut_apart, loads_on_sync
from tilec.compiler.rewrites import rewritten_with
from tilec.compiler.unsupported import reject_unsupported
from tilec.compiler.verify import verify
from tilec.errors import Span, TilecError
from tilec.lang import syntax as sx
from tilec.target import Target, compiling, target as get_target

STAGES = ("nest", "lower", "select", "schedule", "loops", "hoist", "unroll", "legalise", "squeeze", "merge", "allocate")


@dataclass(frozen=True)
class Result:
    stages: dict[str, str]
    kernel: ir.Kernel
    kernels: dict[str, ir.Kernel]  # the loop-nest IR after each IR pass, for testing passes by meaning
    ops: tuple
    plans: tuple
    source: str
    target: Target
    nest: Nest  # level A, before instruction selection
    chains: tuple[fusers.Chain, ...] = ()  # the parts built fused: the fuser's kind and the op names, in order
    unfused: tuple[str, ...] = ()  # convs the schedule placed in HBM (`place conv, hbm`): their pool reads it back
    placed: tuple[tuple[str, bool, str], ...] = ()  # conv -> conv intermediates: (tensor, on chip, why)


class SbufOverflow(TilecError):
    """The kernel needs more SBUF than the target has (_check_capacity); `smaller` are the directives that halve the
    bands of every conv of the default schedule (empty when none can be halved)."""
    smaller: tuple[sx.Directive, ...] = ()


BAND_RETRIES = 3  # halvings of the convs' default bands tried when the default schedule overflows SBUF


def compile_program(program, directives: tuple[sx.Directive, ...] | None = None, nki: str | None = None,
                    target: Target | str | None = None) -> Result:
    """`nki`: the NKI API version the kernel source is written for (codegen.NKI_VERSIONS; None: the default). A
    default schedule (no directives given or written) whose kernel overflows SBUF is compiled again with its
    convs' bands halved, up to BAND_RETRIES times (each conv picks its default band alone: two convs in one kernel
    may not fit together, audit13_two_convs_sbuf); the directives used are the kernel's schedule."""
    with compiling(get_target(target)):  # target.compiled(), which the builders' work splits read
        return _compile_retried(program, directives, nki, target)


def _compile_retried(program, directives: tuple[sx.Directive, ...] | None, nki: str | None,
                     target: Target | str | None) -> Result:
    try:
        return _compile_program(program, directives, nki, target)
    except SbufOverflow as err:
        if directives is not None or program.kernel.schedule:
            raise
        first, tried = err, err.smaller
    for _ in range(BAND_RETRIES):
        if not tried:
            break
        try:
            return _compile_program(program, tried, nki, target)
        except SbufOverflow as err:
            tried = err.smaller
    return _op_scoped(first, program, directives, nki, target)


def _op_scoped(first: SbufOverflow, program, directives: tuple[sx.Directive, ...] | None, nki: str | None,
               target: Target | str | None) -> Result:
    """The last resort of a default schedule over the SBUF budget: each op's buffers in a scope of their own
    (op_scope.py; a SwiGLU FFN's three weights), else the first overflow's error."""
    try:
        return _compile_program(program, directives, nki, target, op_scopes=True)
    except SbufOverflow:
        raise first from None


def _compile_program(program, directives: tuple[sx.Directive, ...] | None, nki: str | None,
                     target: Target | str | None, op_scopes: bool = False) -> Result:
    directives = program.kernel.schedule if directives is None else directives
    given = (program, directives)
    program, directives = inline_compute_at(program, directives)  # `compute_at T, Y.i` of T = f(X) (compute_at.py)
    program = inline_reduced_temporaries(program, directives)  # `T = exp(X); s += T`: s += exp(X) (compute_at.py)
    program, directives = rewritten_with(program, tuple(directives))  # statements no rule maps, as ordinary ones over temporaries (rewrites.py)
    reject_unsupported(program.kernel)  # constructs only the reference evaluator runs yet (unsupported.py)
    program = name_sizes(program)  # sizes that remember their names: `SIZE_K // TILE_K` trip counts (named.py)
    tgt = get_target(target)
    dtypes = {name: t.dtype for name, t in program.tensors.items()}
    stages: dict[str, str] = {}
    # nest: the program as loops over buffers (level A), one to one, with a NumPy meaning (nest_eval.py); each
    # statement shows the instruction of the target's table it matches (tensorize.py)
    nest = lower_nest(program)
    verify_nest(nest)
    stages["nest"] = print_nest(nest, lambda s: str(match(s, tgt) or ""))
    # lower: loop nests -> tensor computations with concrete extents (what each statement computes)
    comps = lower(program.kernel, program.sizes)
    stages["lower"] = print_comps(comps)
    # select: recognise contractions, pools, transposes, element-wise; fuse relu/pool epilogues into convs
    ops = select(comps, program)
    stages["select"] = print_ops(ops)
    # schedule: the default plan per op, then every directive folded in (tile, split, reorder, partition,
    # compute_at/place, hoist, buffers, unroll, method), each checked for legality
    try:
        plans = apply_schedule(ops, tuple(directives), dtypes, tgt)
    except ChainChoice as e:
        raise _kept_on_chip(e, *given, tgt) from None
    except SharedTiles as e:
        return _shared_tiles(e, *given, nki, tgt)
    stages["schedule"] = ""  # (printed below, once the fused parts are known: the stages keep this order)
    planned = (ops, plans)
    # unfuse: a conv placed in HBM hands its pooling back to a separate op that reads the HBM copy
    unfused = tuple(op.name for op, plan in zip(ops, plans) if isinstance(op, ConvOp) and op.pool and
                    isinstance(plan, ConvPlan) and not plan.fused)
    ops, plans = unfuse(ops, plans, program)
    # loops: each op and its plan -> a tile-level loop nest over HBM/SBUF/PSUM buffers
    names = NameAllocator(program_names(program))  # derived names never collide with the user's
    scheduled = {_named_op(d, ops) for d in directives if d.args and isinstance(d.args[0], sx.Ref)}
    # `buffers X, 1` of an element-wise statement's operand: the statement is scheduled by its plan (no row chain)
    scheduled |= {op.name for d in directives if d.name == "buffers" for op in (op_for(d, ops),)
                  if type(op) in (EltwiseOp, ReduceOp, ColumnReduceOp)}
    chains: list[fusers.Chain] = []  # the parts built fused (their ops' own tiles do not apply)
    hbm = {name: ir.Buf(name, "hbm", t.dtype, t.shape) for name, t in program.tensors.items()}
    choices = placement.chain_choices(ops, plans, program.kernel.outputs, tuple(directives), hbm, tgt.name,
                                         sbuf_budget(tgt))
    try:
        kernel = build_kernel(program, ops, plans, names, scheduled, sbuf_budget(tgt), chains, tgt, choices,
                              op_scopes)
        _check_placed_apart(program, ops, plans, tuple(directives), scheduled, tgt, choices)
    except Unhonoured as e:  # located at the directive asking for what the op's builder does not do
        raise TilecError(*_unhonoured(e, ops, tuple(directives))) from None
    _check_capacity(kernel, tgt, program, ops, plans, tuple(directives))
    kernel = passes.fp32_operands(kernel)  # a narrow column read as a per-partition operand: its fp32 copy first
    kernel = stores_in_place(kernel)  # a temporary copied whole into a region: stored there (store_regions.py)
    kernel = unit_copies_dropped(kernel)  # a temporary copied whole, unit dimensions apart: a view (unit_copies.py)
    stages["loops"] = _checked(kernel, "loops", tgt)
    kernels = {"loops": kernel}
    # hoist: loads and allocations that do not depend on a loop move out of it (loop-invariant code motion), and a
    # loop's loads of an input's columns are gathered before it (dma_streams.columns_ahead), a loop's one add cut
    # between two engines when it both reads the loads and makes the stores (dma_streams.cut_apart), and a loop's
    # loads that the storing engine reads first triggered by the Sync engine (dma_streams.loads_on_sync)
    kernel = loads_on_sync(cut_apart(columns_ahead(passes.hoist(kernel)), tgt), tgt)
    stages["hoist"] = _checked(kernel, "hoist", tgt)
    kernels["hoist"] = kernel
    # unroll: the schedule's unrolled loops become static ranges (traced once per iteration)
    kernel = passes.unroll(kernel, unrolled_loops(ops, plans, names))
    stages["unroll"] = _checked(kernel, "unroll", tgt)
    kernels["unroll"] = kernel
    # legalise: affine loops whose iterations share a buffer (single-buffered schedules) become sequential
    kernel = passes.legalise(kernel)
    stages["legalise"] = _checked(kernel, "legalise", tgt)
    kernels["legalise"] = kernel
    # squeeze: tiles and compiler-made HBM views lose their dimensions of extent 1 (readable kernels, same code)
    kernel = squeeze(kernel)
    stages["squeeze"] = _checked(kernel, "squeeze", tgt)
    kernels["squeeze"] = kernel
    # merge: a loop of DMAs over blocks of partitions becomes one DMA (dma_merge.py)
    kernel = merge_block_dmas(kernel)
    stages["merge"] = _checked(kernel, "merge", tgt)
    kernels["merge"] = kernel
    # allocate: per-partition SBUF/PSUM budget of the final kernel (verified against the target's limits)
    stages["allocate"] = passes.allocation_report(kernel, sbuf_budget(tgt), tgt.psum_banks, tgt.psum_bank_bytes)
    doc = _doc_lines(program, ops, plans, chains, tgt)
    fused = {name for c in chains for name in c.members} | _chained_pools(ops, choices)
    stages["schedule"] = _unit_columns(program, *planned, _depthwise_plans(program, *planned,
                                                                          print_plans(*planned, fused)))
    stages["schedule"] += "".join(fusers.chain_note(c, ops, program, tgt) + "\n" for c in chains)
    stages["schedule"] += build_mbblock.refusals(program, ops, scheduled, chains, tgt, placement.reads)
    stages["schedule"] += build_attention.refusals(program, ops, scheduled, chains, placement.reads)
    stages["schedule"] += build_mlp.refusals(program, ops, scheduled, chains, placement.reads, sbuf_budget(tgt))
    stages["schedule"] += _rule_lines(program, ops, plans, chains, tgt)
    source = emit(kernel, pathlib.Path(program.path).name, doc, _recompile_commands(program), nki=nki)
    placed = tuple((c.tensor, c.on_chip, c.why) for c in choices.values())
    return Result(stages, kernel, kernels, ops, plans, source, tgt, nest, tuple(chains), unfused, placed)


def _chained_pools(ops: tuple, choices: dict) -> set[str]:
    """The pools a conv -> pool chain builds with their conv (placement.pool_choice): a directive of their own
    would build them alone, so explain prints their plans as comments."""
    return {ops[c.producer + 1].name for c in choices.values() if c.on_chip and isinstance(ops[c.producer + 1], PoolOp)}


def _named_op(d: sx.Directive, ops: tuple) -> str:
    """The name a directive schedules: its first argument, or the conv of `hoist X, conv.k` whose operand X is
    (X's own producer, a copy or a fused temporary, stays as the default builds it)."""
    first = d.args[0]
    assert isinstance(first, sx.Ref)  # (the caller takes directives naming something first)
    conv = operand_of(d, ops, first.parts[0])
    return first.parts[0] if conv is None else conv.name


def _depthwise_plans(program, ops: tuple, plans: tuple, printed: str) -> str:
    """The printed plans, with the plan line of each depthwise conv that the default depthwise kernel builds replaced
    by the plan that kernel uses (build_depthwise.describe); its directives stay (they select that kernel)."""
    hbm = {name: ir.Buf(name, "hbm", t.dtype, t.shape) for name, t in program.tensors.items()}
    lines = printed.splitlines()
    for op, plan in zip(ops, plans):
        if isinstance(op, ConvOp) and isinstance(plan, ConvPlan):  # (describe: [] unless the depthwise kernel)
            described = build_depthwise.describe(op, plan, hbm)
            at = next((i for i, line in enumerate(lines) if line.startswith(f"# {op.name}: ")), None)
            if described and at is not None:
                lines[at:at + 1] = described + [f"#   (the general path's plan: {lines[at][len(op.name) + 4:]})"]
    return "\n".join(lines) + "\n"


def _check_capacity(kernel: ir.Kernel, target: Target, program, ops=(), plans=(),
                    directives: tuple[sx.Directive, ...] = ()) -> None:
    """Too much SBUF is the schedule's (or the problem size's) fault, not a compiler bug: say what to change, at
    the statement whose buffer is the largest."""
    sbuf, budget = passes.peak_usage(kernel.body)[0], sbuf_budget(target)
    if sbuf > budget:
        biggest = max(passes.allocations(kernel), key=lambda b: b.bytes_per_partition())
        line = next((s.line for s in ir.walk(kernel.body) if isinstance(s, ir.Alloc) and s.buf == biggest), 0)
        err = SbufOverflow(f"the kernel needs {sbuf // 1024} KiB of SBUF per partition, {target.name} has "
                         f"{budget // 1024} KiB usable (largest buffer: {biggest.name}, "
                         f"{biggest.bytes_per_partition() // 1024} KiB)",
                         _line_span(program, line), "use smaller bands (split OP.y, N / split OP.x, N) or prepare "
                                                    "the weights per out-channel tile (hoist W, OP.k)")
        err.smaller = _halved_bands(ops, plans, directives)
        raise err


def _halved_bands(ops, plans, directives: tuple[sx.Directive, ...]) -> tuple[sx.Directive, ...]:
    """`directives` plus, for each conv whose band of output rows can shrink, `split CONV.y, N` with N the largest
    divisor of its output rows (a multiple of a fused pool's window rows) at most half its band; () when no band
    can shrink."""
    extra = []
    for op, plan in zip(ops, plans):
        if not isinstance(op, ConvOp) or not isinstance(plan, ConvPlan) or "y" not in dict(op.vars):
            continue
        wy = op.pool.wy if op.pool else 1
        fits = [d for d in range(1, plan.band // 2 + 1) if op.dim("Ho") % d == 0 and d % wy == 0]
        if fits:
            extra.append(sx.Directive("split", (sx.Ref((op.name, dict(op.vars)["y"])), max(fits))))
    if not extra:
        return ()
    named = {(d.name, d.args[0].parts) for d in extra if isinstance(d.args[0], sx.Ref)}
    kept = tuple(d for d in directives if not (d.args and isinstance(d.args[0], sx.Ref)
                                               and (d.name, d.args[0].parts) in named))
    return kept + tuple(extra)


def _line_span(program, line: int) -> Span:
    """The whole of source line `line` (the kernel header when the line is unknown)."""
    lines = program.source.splitlines()
    line = line if 0 < line <= len(lines) else program.kernel.span.line
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    col = len(text) - len(text.lstrip()) + 1
    return Span(program.path, line, col, line, len(text) + 1, program.source)


def _checked(kernel: ir.Kernel, stage: str, target: Target) -> str:
    verify(kernel, stage, target)
    return ir.print_ir(kernel)


def unfuse(ops: tuple, plans: tuple, program) -> tuple[tuple, tuple]:
    out_ops, out_plans = [], []
    dtypes = {name: t.dtype for name, t in program.tensors.items()}
    for op, plan in zip(ops, plans):
        if isinstance(op, ConvOp) and isinstance(plan, ConvPlan) and op.pool and not plan.fused:
            conv = replace(op, out=op.name, pool=None, fused=())
            shape = program.tensors[op.name].shape
            dims = (("B", shape[0] * shape[1]), ("H", shape[2]), ("W", shape[3]))
            pool_vars = tuple((role[5:], var) for role, var in op.vars if role.startswith("pool_"))
            pool = PoolOp(f"{op.out}", op.out, op.name, dims, op.pool, pool_vars, False, op.line, op.span)
            out_ops += [conv, pool]
            out_plans += [replace(plan, fused=True), default_plan(pool, dtypes)]
        else:
            out_ops.append(op)
            out_plans.append(plan)
    return tuple(out_ops), tuple(out_plans)


def build_kernel(program, ops: tuple, plans: tuple, names: NameAllocator, scheduled: AbstractSet[str] = frozenset(),
                 budget: int = 0, chains: list | None = None, target: Target | None = None,
                 choices: dict[int, placement.ChainChoice] | None = None, op_scopes: bool = False) -> ir.Kernel:
    """Each op by its builder; a run of row ops with the default schedule (softmax, layernorm, ...) as one fused
    row chain when its tiles fit `budget` (build_rowchain.py). `op_scopes`: each op's statements in a scope of
    their own when the kernel is over `budget` (op_scope.py; the last resort of _compile_retried)."""
    hbm = {name: ir.Buf(name, "hbm", t.dtype, t.shape) for name, t in program.tensors.items()}
    signature = {name: ir.Buf(name, "hbm", hbm[name].dtype, shape) for name, shape in program.views.items()}
    views = [ir.Reshape(ir.Buf(names.fresh(f"{name}_v"), "hbm", hbm[name].dtype, hbm[name].shape), base,
                        program.tensors[name].span.line) for name, base in signature.items()]
    hbm.update({r.base.name: r.buf for r in views})  # the program's tensor is the view (view_split.py)
    params = tuple(signature.get(p.name, hbm[p.name]) for p in program.kernel.params)
    outputs = tuple(signature.get(o, hbm[o]) for o in program.kernel.outputs)
    parts = _parts(program, ops, plans, names, hbm, scheduled, budget, chains if chains is not None else [],
                   get_target(target), {} if choices is None else choices)
    stored = {n for group, _, _ in parts for n in group}
    body: list[ir.Stmt] = list(views)
    for name, t in program.tensors.items():
        if t.kind == "temp" and name in stored:
            body.append(ir.Alloc(hbm[name], line=t.span.line))  # an intermediate that really goes through HBM
    consts: dict[str, int] = {}
    for _, op_consts, stmts in parts:
        consts.update(op_consts)
    body += [s for _, _, stmts in parts for s in stmts]
    if op_scopes and passes.peak_usage(tuple(body))[0] > budget:  # each op's buffers in a scope (op_scope.py)
        body = scoped_parts(body[:len(body) - sum(len(p) for _, _, p in parts)], [p for _, _, p in parts],
                            names.fresh)
    # the program's sizes the kernel prints by name (SIZE_K), first: the tile constants are read against them
    sizes = used_consts(body, size_consts(program))
    return ir.Kernel(program.kernel.name, params, outputs, tuple(body), tuple(sizes + list(consts.items())))


def _parts(program, ops: tuple, plans: tuple, names: NameAllocator, hbm: dict, scheduled: AbstractSet[str], budget: int,
           fused: list, target: Target, choices: dict) -> list[tuple[set[str], list, list]]:
    """(tensors written to HBM, consts, statements) per op or fused row chain, in program order."""
    chains = {c[0]: c for c in row_chains(ops, scheduled)} if budget else {}
    site = fusers.Site(program, ops, hbm, names, scheduled, budget, target, chains, lambda o: _fresh(names, o))
    out: list[tuple[set[str], list, list]] = []
    skip: set[int] = set()
    prefixes: set[str] = set()
    for i, (op, plan) in enumerate(zip(ops, plans)):
        if i in skip:
            continue
        part = fusers.fuse(site, i)  # the fused builders, in order (fusers.py)
        if part is not None:
            out.append(_named(part.written, part.built, part.out, len(ops), prefixes))
            skip |= part.covers
            fused.append(part.chain)
            continue
        if i in choices:
            chained = _conv_chain(choices, i, ops, plans, hbm, names, prefixes, budget, program)
            if chained is not None:
                out.append(chained)
                skip.add(i + 1)
                continue
        builders: dict[type, Callable[..., tuple]] = {
            ConvOp: build_conv, PoolOp: build_pool, TransposeOp: _scheduled(program, target),
            EltwiseOp: _scheduled(program, target), ReduceOp: build_reduce, ColumnReduceOp: build_column_reduce}
        if type(op) is ReduceOp and reduce_rule(op, plan, program, target) is not None or \
                type(op) is ColumnReduceOp and colreduce_rule(op, plan, program, target) is not None:
            built = _scheduled(program, target)(op, plan, hbm, _fresh(names, op))
        elif type(op) is ColumnReduceOp and (op.dim("R") % plan.parts or op.dim("F") % plan.free):
            raise Unhonoured(op.name, rules_colragged.refusal(op, plan), "tile")
        elif isinstance(op, PoolOp) and "K" in dict(op.dims) and plan != inner_pool_plan(op):
            raise Unhonoured(op.name, "it pools axes with dimensions after them, which a builder of its own "
                                      "lays out (build_pool_axes.py); it takes no directives yet", "any")
        elif type(op) is ReduceOp and any(plan_settings(plan)):
            raise Unhonoured(op.name, "its rows are scheduled by a builder of its own (short rows, several per "
                                      "partition), which has no such loop or tile")
        elif type(op) is ColumnReduceOp and any(plan_settings(plan)):
            raise Unhonoured(op.name, "it is scheduled by a builder of its own (a maximum or minimum, or a layout "
                                      "the column rule does not take), which has no such loop or tile")
        elif isinstance(op, TransposeOp) and op.steps:  # each step names its buffers apart (a view per step)
            built = _build_steps(op, plan, program, target, hbm, lambda k, op=op: _fresh(names, op, k))
        else:
            built = builders[type(op)](op, plan, hbm, _fresh(names, op))
        out.append(_named({op.out}, built, op.out, len(ops), prefixes))
    return out


def _conv_chain(choices: dict, i: int, ops: tuple, plans: tuple, hbm: dict, names: NameAllocator,
                prefixes: set[str], budget: int, program) -> tuple[set[str], list, list] | None:
    """A conv -> conv chain built with its intermediate in SBUF (conv_chain.py), if placement chose (or the
    schedule forced) it and the built chain fits the SBUF budget; None: built op by op through HBM (the choice
    then says why). A forced placement that cannot be honoured is the schedule's located error."""
    choice: placement.ChainChoice = choices[i]
    producer, consumer = ops[i], ops[i + 1]
    name = choice.tensor
    if choice.forced == "sbuf" and not choice.on_chip:
        raise TilecError(f"{name} cannot stay in SBUF: {choice.why}", choice.span,
                         f"remove the directive, or write `place {name}, hbm`")
    if not choice.on_chip:
        return None
    taken = set(prefixes)

    def rename(consts: list, stmts: list, out: str) -> tuple[list, list]:
        _, named_consts, named_stmts = _named(set(), (consts, stmts), out, len(ops), taken)
        return named_consts, named_stmts
    if isinstance(consumer, PoolOp) and choice.phases:  # the stem's conv -> max pool in row phases
        consts, stmts = stem_chain.build(producer, stem_chain.plan(plans[i]), consumer, hbm, _fresh(names, producer),
                                         _fresh(names, consumer), rename)
    elif isinstance(consumer, PoolOp):  # conv -> overlapping window pool (pool_chain.py)
        pp, qp = pool_chain.plans(producer, plans[i], consumer, plans[i + 1])
        consts, stmts = pool_chain.build(producer, pp, consumer, qp, hbm, _fresh(names, producer),
                                         _fresh(names, consumer), choice.store, rename)
    else:
        pplan, cplan, kind = conv_chain.chain_plans(producer, plans[i], consumer, plans[i + 1], hbm)
        consts, stmts = conv_chain.build_chain(producer, pplan, consumer, cplan, kind, hbm, _fresh(names, producer),
                                               _fresh(names, consumer), choice.store, rename)
    need = passes.peak_usage(tuple(stmts))[0]
    if need > budget:
        why = (f"{choice.why}; but the chain needs {need // 1024} KiB of SBUF per partition with one image of "
               f"{name} on chip (two in flight), more than the {budget // 1024} KiB budget")
        if choice.forced == "sbuf":
            raise TilecError(f"{name} cannot stay in SBUF: {why}", choice.span,
                             f"remove the directive, or write `place {name}, hbm`")
        choices[i] = replace(choice, on_chip=False, why=why + f": {name} goes through HBM")
        return None
    prefixes |= taken
    stored = ({name} if choice.store else set()) | {consumer.out}
    return stored, consts, stmts


class Unhonoured(TilecError):
    """An op's builder cannot do what its plan's `unroll` / `buffers X, 1` ask (compile_program locates it at the
    first directive of that kind, `unroll` or `buffers`, or of either)."""

    def __init__(self, op: str, why: str, kind: str = "") -> None:
        super().__init__(why)
        self.op = op
        self.kind = kind


def _apply_unrolls_checked(op, nest: Nest, prims: list, target: Target) -> Nest:
    """rules.apply, the `unroll_tiles` of the plan's `unroll` last (rules_base.settings puts them there) and only
    after their loops are checked: how many tiles a loop runs through is known once the rule has split the nest
    (a column sum's grouped or wide tiles), so one iteration, or more than UNROLL_MAX, is refused at the directive."""
    unrolls = [p for p in prims if p.name == "unroll_tiles"]
    try:
        k = rules.apply(nest, [p for p in prims if p.name != "unroll_tiles"], target)
    except TilecError as err:
        if err.span is not None or getattr(op, "span", None) is None:
            raise
        # a primitive of the op's own rule that has no directive line to blame: the op's statement is the place
        # (fuzz seed 138006046: a flipped read of a chain, "reshape: ... is reversed", had no location)
        raise TilecError(f"the compiler cannot map `{op.out}` to Trainium engines: {err.message}", op.span,
                         err.hint or "compute the reversed or reshaped read into a tensor of its own first") from None
    for p in unrolls:
        trips = max((lp.extent for lp in level_a.walk(k.body) if isinstance(lp, level_a.Loop) and
                     lp.var.split("@")[0] == p.args[0]), default=1)
        if trips == 1:
            raise Unhonoured(op.name, f"its tile loop `{p.args[0]}` has one iteration: nothing to unroll", "unroll")
        if trips > UNROLL_MAX:
            raise Unhonoured(op.name, f"its tile loop `{p.args[0]}` has {trips} iterations, more than the "
                                      f"{UNROLL_MAX} one unrolled loop may have (larger tiles: `tile`)", "unroll")
    return rules.apply(k, unrolls, target)


def plan_settings(plan) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(unroll, single) of an element-wise or row-reduction plan; ((), ()) for other plans."""
    if isinstance(plan, (EltwisePlan, ReducePlan)):
        return plan.unroll, plan.single
    return (), ()


def _unhonoured(e: Unhonoured, ops: tuple, directives: tuple) -> tuple:
    """(message, span, hint) at the first `unroll`/`buffers` directive of op `e.op`."""
    kinds = (e.kind,) if e.kind not in ("", "any") else ("unroll", "buffers")  # "any": the op's first directive
    d = next(d for d in directives if (e.kind == "any" or d.name in kinds) and op_for(d, ops).name == e.op)
    return (f"`{d.name}` cannot apply to {e.op}: {e.message}", d.span, "remove the directive")




def _scheduled(program, target: Target):
    """The builder of an op scheduled on level A: its nest, the rule's primitives (with the plan's parameters),
    applied, then lowered to level B (rules.py, lower_tiles.py)."""
    def build(op, plan, hbm: dict, fresh) -> tuple[list, list]:
        nest, prims = scheduled_nest(op, plan, program, target)
        rows = rules_copy.row_blocks(nest, hbm, fresh, target) if getattr(op, "copy", False) else None
        if rows is not None:  # a padded copy with whole rows on the partitions (level B, rules_copy.py)
            return rows
        unroll, single = plan_settings(plan)
        if unroll and not any(p.name == "unroll_tiles" for p in prims) or \
                single and not any(p.name == "single" for p in prims):
            raise Unhonoured(op.name, "the layout its rule chose for these sizes has no such loop or tile (rows "
                                      "several per partition; a column sum's row tiles loaded in groups, each in a "
                                      "buffer of its own)")
        scheduled = _apply_unrolls_checked(op, nest, prims, target)
        verify_nest(scheduled, f"the schedule of {op.name}")
        built = lower_tiles(scheduled, prims, hbm, fresh, target)
        if type(op) is ColumnReduceOp:  # a group's terms before its pair adds (rules_colreduce.py)
            return terms_before_pairs(built)
        if type(op) is EltwiseOp and not plan.single:  # (one buffer: no pairs of tiles in flight)
            # the next tile's loads issued before this tile's work and stores (pair_tiles.py); failing that (a
            # broadcast layout's free tiles inside its partition tiles), the next partition tile's (on the model
            # audit15 bcast_clamp 1.09x -> 1.04x, gaps15 batch_embedding 2.49x -> 2.15x)
            paired = skew_row_tiles(built, sbuf_budget(target), fresh, var="t", tile_const="TILE_F", note=AHEAD,
                                    min_tiles=AHEAD_TILES)
            if not paired and not plan.unroll:  # (an unrolled partition loop stays the loop the user unrolled)
                paired = skew_row_tiles(built, sbuf_budget(target), fresh, var="pt", tile_const="TILE_P", note=AHEAD,
                                        min_tiles=4)
            if not paired and not plan.unroll:  # a loop of tiles inside the other one: paired there (core22)
                paired = skew_inner_tiles(built, sbuf_budget(target), fresh, "t", "TILE_F", AHEAD, 4) or \
                    skew_inner_tiles(built, sbuf_budget(target), fresh, "pt", "TILE_P", AHEAD, 4)
            if paired and "t" in plan.unroll:  # `unroll`: the loop of pairs is the free tiles' loop now
                return paired[0], list(passes.unroll_stmts(tuple(paired[1]), {"t"}))
            return paired or built
        return built
    return build


def _check_placed_apart(program, ops: tuple, plans: tuple, directives: tuple, scheduled: AbstractSet[str],
                        target: Target, choices: dict) -> None:
    """`place T, hbm` (`compute_at T, root`) of an element-wise or reduction T that other statements read: the
    directive names T, so T is built alone, stored and read back (directives.apply_fusion). Where no fused part
    takes T without the directive, it went through HBM already and the kernel would not change: refused at the
    directive's line (a directive is never silently ignored)."""
    for d in directives:
        op = next((o for o in ops if d.args and isinstance(d.args[0], sx.Ref) and o.name == d.args[0].parts[0]), None)
        if not to_hbm(d) or op is None or type(op) not in (EltwiseOp, ReduceOp, ColumnReduceOp):
            continue
        if any(_names(x, op, ops) for x in directives if x is not d):
            continue  # another directive builds T alone anyway
        chains: list[fusers.Chain] = []
        build_kernel(program, ops, plans, NameAllocator(program_names(program)), set(scheduled) - {op.name},
                     sbuf_budget(target), chains, target, choices)
        if not any(op.name in c.members for c in chains):
            raise TilecError(f"{op.out} goes through HBM without the directive too (built alone, stored, read back "
                             f"by its readers): `{d.name}` would leave the kernel as it is", d.span,
                             "remove the directive (`tilec explain` shows where each tensor goes)")


def _kept_on_chip(e: ChainChoice, program, directives: tuple, target: Target) -> TilecError:
    """`place T, sbuf` / `compute_at T, Y.i` of T a fused part keeps on chip without the directive: it would leave
    the kernel as it is (refused saying so); otherwise the directive's own refusal (T goes through HBM)."""
    key = lambda d: (d.name, d.args, d.span)  # noqa: E731 (the directive as written, rewrites aside)
    others = tuple(d for d in directives if key(d) != key(e.directive))
    if len(others) == len(directives):
        return e
    try:
        chains = compile_program(program, others, None, target).chains
    except TilecError:
        return e  # (another directive is refused: the schedule's first error stands)
    chain = next((c for c in chains if e.op.name in c.members), None)
    if chain is None:
        return e
    d = e.directive
    return TilecError(f"{e.op.out} stays on chip without the directive: the {chain.kind} of "
                      f"{', '.join(chain.members)} computes it per tile of its readers, so `{d.name}` would leave the "
                      "kernel as it is", d.span, f"remove the directive; `place {e.op.out}, hbm` builds {e.op.name} "
                                                 f"alone and stores {e.op.out}")


def _shared_tiles(e: SharedTiles, program, directives: tuple, nki: str | None, target: Target) -> Result:
    """`buffers X, n` of X several statements read: when one fused part computes all of them, it loads each tile
    of X once for all (its builder's buffers, no setting), which the refusal names; when each reader is built
    apart and loads its own tiles of X, the directive sets them all (one copy a reader, each checked as
    `buffers X, n` of that statement alone); otherwise e stands."""
    d = e.directive
    others = tuple(x for x in directives if (x.name, x.args, x.span) != (d.name, d.args, d.span))
    try:
        chains = compile_program(program, others, None, target).chains
    except TilecError:
        raise e from None  # (another directive is refused: the schedule's first error stands)
    names = [op.name for op in e.readers]
    if not any(set(names) & set(c.members) for c in chains):
        each = tuple(ReaderBuffers(d.name, d.args, d.span, reader=name) for name in names)
        return compile_program(program, others + each, nki, target)
    chain = next((c for c in chains if set(names) <= set(c.members)), None)
    if chain is None:
        raise e from None
    x = d.args[0].parts[0] if isinstance(d.args[0], sx.Ref) else "?"
    raise TilecError(f"{x} is read by {' and '.join(names)}, which the {chain.kind} of {', '.join(chain.members)} "
                      f"computes together from the tiles of {x} it loads: its tiles are that part's (no buffer "
                      "setting), and `buffers` sets the tiles of one statement's operand", e.span,
                      f"remove the directive; a statement reading {x} alone takes `buffers {x}, 1`")


def _names(d: sx.Directive, op, ops: tuple) -> bool:
    """Whether directive d schedules op by its plan: it names op, or it is `buffers X, 1` of op's operand."""
    if d.args and isinstance(d.args[0], sx.Ref) and d.args[0].parts[0] == op.name:
        return True
    return d.name == "buffers" and op_for(d, ops) is op


def _build_steps(op: TransposeOp, plan, program, target: Target, hbm: dict, fresh: Callable) -> tuple[list, list]:
    """A permute of several steps: its HBM intermediates allocated, then each step scheduled by the transpose rule
    and lowered; a later step's constants carry its number (STEP2_TILE), as the steps' blocks may differ."""
    between = permute_between(op, program)
    hbm = {**hbm, **{n: ir.Buf(n, "hbm", b.dtype, b.shape) for n, b in between.items()}}
    consts: list = []
    stmts: list = [ir.Alloc(hbm[n], line=op.line) for n in between]
    for k, (nest, prims) in enumerate(step_nests(op, plan, program, target)):
        scheduled = rules.apply(nest, prims, target)
        verify_nest(scheduled, f"the schedule of step {k + 1} of {op.name}")
        step_consts, step_stmts = lower_tiles(scheduled, prims, hbm, fresh(k), target)
        if k:
            step_stmts = passes.rename_consts(step_stmts, f"STEP{k + 1}_")
            step_consts = [(f"STEP{k + 1}_{n}", v) for n, v in step_consts]
        consts += step_consts
        stmts += step_stmts
    return consts, stmts


def step_nests(op: TransposeOp, plan, program, target: Target) -> list[tuple[Nest, list]]:
    """Each step's level-A nest and its primitives: the first transpose follows `plan` (the op's directives), the
    other transposes their default plans with the same method; a DMA step is a copy (rules.copy)."""
    between = permute_between(op, program)
    elem = DTYPE_BYTES[program.tensors[op.src].dtype]
    out: list[tuple[Nest, list]] = []
    first = True
    for k, step in enumerate(op.steps):
        if isinstance(step, EltwiseOp):
            nest = copy_nest(step, program, between)
            prims = rules.copy(nest, target)
        else:
            nest = transpose_nest(step, program, between)
            p = plan if first else replace(default_transpose(step.dim("M"), step.dim("N"), elem), method=plan.method)
            prims, first = rules.transpose(nest, target, p), False
        assert prims is not None, f"no rule applies to step {k + 1} of {op.name}"
        out.append((nest, prims))
    return out


def reduce_rule(op: ReduceOp, plan, program, target: Target) -> tuple[Nest, list] | None:
    """A row reduction's nest and the reduce rule's primitives (rules.reduce), except for short rows (several per
    partition: build_reduce)."""
    nest = reduce_nest(op, program)
    if nest is None:
        return None
    grouped = short_rows([op], plan)
    prims = rules.reduce(nest, target, plan, grouped, grouped is not None and resident([op], grouped[1] * op.dim("F")))
    return None if prims is None else (nest, prims)


def colreduce_rule(op: ColumnReduceOp, plan, program, target: Target) -> tuple[Nest, list] | None:
    """A column sum's nest and the column rule's primitives (rules.colreduce), for the plain steps it takes."""
    nest = colreduce_nest(op, program)
    prims = None if nest is None else rules.colreduce(nest, target, plan)
    return None if nest is None or prims is None else (nest, prims)


def scheduled_nest(op, plan, program, target: Target) -> tuple[Nest, list]:
    """An op's level-A nest and the primitives its rule writes for `plan` (of a permute of several steps: its
    first step's; step_nests gives them all)."""
    if type(op) is ReduceOp or isinstance(op, ColumnReduceOp):
        found = colreduce_rule(op, plan, program, target) if isinstance(op, ColumnReduceOp) else \
            reduce_rule(op, plan, program, target)
        assert found is not None, f"no rule applies to {op.name}"
        return found
    if isinstance(op, TransposeOp) and op.steps:
        return step_nests(op, plan, program, target)[0]
    if isinstance(op, TransposeOp):
        nest, prims = transpose_nest(op, program), rules.transpose(transpose_nest(op, program), target, plan)
    elif op.copy:  # crop, shift, a part of a concatenation, nearest upsampling (select_copy.py)
        nest = copy_nest(op, program)
        prims = rules.copy(nest, target)
    else:
        nest, prims = eltwise_nest(op, program), rules.eltwise(eltwise_nest(op, program), target, plan)
    assert prims is not None, f"no rule applies to {op.name}"
    return nest, prims


def _unit_columns(program, ops: tuple, plans: tuple, text: str) -> str:
    """The schedule text with the plan of a one-element column alone (rules.unit_column_alone) replaced by what the
    rule does instead: its default plan puts the column's one element on one partition; the rule lays the data out
    itself (its primitives follow, under the rule's line), so no directive reproduces it."""
    for op, plan in zip(ops, plans):
        if isinstance(op, EltwiseOp) and not op.copy and rules.unit_column_alone(eltwise_nest(op, program), plan):
            old = "".join(line + "\n" for line in [f"# {op.name}: {plan}"] +
                          [fmt_directive(d) for d in plan_directives(op, plan)])
            text = text.replace(old, f"# {op.name}: a one-element column alone: rules.eltwise lays it out itself "
                                     f"(the leading loops on the partitions), not by the plan {plan}\n", 1)
    return text


def _rule_lines(program, ops: tuple, plans: tuple, chains: list[fusers.Chain], target: Target) -> str:
    """The primitives each rule-scheduled op's plan expands to (what `explain` shows under its directives)."""
    in_chain = {name for c in chains for name in c.members}
    out = []
    for op, plan in zip(ops, plans):
        if isinstance(op, (EltwiseOp, TransposeOp)) and op.name not in in_chain:
            rule = "transpose" if isinstance(op, TransposeOp) else "copy" if op.copy else "eltwise"
            if isinstance(op, TransposeOp) and op.steps:
                first = next(s for s in op.steps if isinstance(s, TransposeOp))
                for k, (step, (_, prims)) in enumerate(zip(op.steps, step_nests(op, plan, program, target))):
                    src = step.inputs[0] if isinstance(step, EltwiseOp) else step.src
                    how = "rules.copy writes its DMAs as" if isinstance(step, EltwiseOp) else \
                        f"rules.transpose expands {'its plan' if step is first else 'its default plan'} into"
                    out += [f"# {op.name}, step {k + 1} of {len(op.steps)} ({step.out} = permute of {src}): {how}"]
                    out += [f"#   {p}" for p in prims]
                continue
            nest, prims = scheduled_nest(op, plan, program, target)
            rows = rules_copy.row_blocks_note(nest, target) if rule == "copy" else None
            if rows is not None:  # built on level B (rules_copy.row_blocks), not by these primitives
                out += [f"# {op.name} (line {op.line}): rules_copy.row_blocks builds it: {rows}"]
                continue
            head = f"# {op.name} (line {op.line}): rules.copy writes its schedule as" if rule == "copy" else \
                f"# {op.name}: rules.{rule} expands its plan into"  # a copy has no plan (no parameters)
            out += [head] + [f"#   {p}" for p in prims]
        elif type(op) is ReduceOp and op.name not in in_chain and reduce_rule(op, plan, program, target) or \
                type(op) is ColumnReduceOp and op.name not in in_chain and colreduce_rule(op, plan, program, target):
            out += [f"# {op.name}: rules.{'reduce' if type(op) is ReduceOp else 'colreduce'} expands its plan into"]
            out += [f"#   {p}" for p in scheduled_nest(op, plan, program, target)[1]]
        elif type(op) is ColumnReduceOp and op.op != "add":
            out += extreme_note(op, plan, program.tensors[op.src].dtype)
        elif isinstance(op, PoolOp):  # (a pool fused into a conv is part of its ConvOp, not an op here)
            out += [f"# {op.name}: rules_pool.pool expands its plan into"]
            dts = (program.tensors[op.src].dtype, program.tensors[op.out].dtype)  # (PSUM or not: rules_pool)
            out += [f"#   {p}" for p in pool_prims(op.windowed(), plan, dts)]
    return "".join(line + "\n" for line in out)


def _named(stored: set[str], built: tuple, out: str, n_ops: int, prefixes: set[str]) -> tuple[set[str], list, list]:
    """The op's constants prefixed with its output's name when the kernel has several ops (Y_TILE_P)."""
    op_consts, stmts = built
    op_consts = used_consts(stmts, op_consts)
    if n_ops > 1:
        prefix = _const_prefix(out, prefixes)
        stmts = passes.rename_consts(stmts, prefix)
        op_consts = [(prefix + n, v) for n, v in op_consts]
    return stored, op_consts, stmts


def _const_prefix(out: str, taken: set[str]) -> str:
    """`Y_` for the constants of the op writing Y: an identifier (Unicode as Python reads it, `x²` -> `X2_`), and
    distinct per op (outputs `y` and `Y` would otherwise share `Y_TILE`)."""
    base = sanitised(out).upper()
    base = base if f"{base}_TILE".isidentifier() else "OP"
    return unique(base, taken) + "_"


def _fresh(names: NameAllocator, op, step: int = 0):
    """The name allocator as seen by one op (or one step of a permute of several): its own derived names are
    stable, other ops get other ones."""
    owner = f"{type(op).__name__}:{op.out}" + (f":{step}" if step else "")
    return lambda base: names.fresh(base, owner)


def unrolled_loops(ops: tuple, plans: tuple, names: NameAllocator) -> set[str]:
    """The loop variables (as built) of the accumulation loops each conv's schedule unrolls."""
    found: set[str] = set()
    for op, plan in zip(ops, plans):
        if isinstance(op, ConvOp):
            loops = conv_loop_vars(op, _fresh(names, op))
            found |= {loops[role] for role in plan.unroll}
    return found


def _recompile_commands(program) -> dict[str, str]:
    """Per input: `tilec compile -D N=... -D C=...` over the size symbols of its shape, in order of appearance."""
    def walk(e, symbols: list[str]) -> None:
        if isinstance(e, sx.Name) and e.id in program.sizes and e.id not in symbols:
            symbols.append(e.id)
        for child in (getattr(e, "lhs", None), getattr(e, "rhs", None), getattr(e, "x", None)):
            if child is not None:
                walk(child, symbols)

    commands = {}
    for p in program.kernel.params:
        symbols: list[str] = []
        for d in p.type.shape:
            walk(d, symbols)
        commands[p.name] = " ".join(["tilec compile"] + [f"-D {name}=..." for name in symbols])
    return commands


def _doc_lines(program, ops, plans, chains: list[fusers.Chain], target: Target | None = None) -> list[str]:
    lines = ["Schedule (directives; `tilec explain` shows the plan):", ""]
    in_chain = {name for c in chains for name in c.members}
    seen: set[str] = set()
    for op, plan in zip(ops, plans):
        if op.name not in in_chain:
            lines += ["    " + line for line in once(print_schedule(plan_directives(op, plan)).splitlines(), seen)]
    lines += ["    " + fusers.chain_note(c, ops, program, get_target(target)) for c in chains]
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(program.sizes.items()))
    return lines + ["", f"Sizes: {sizes}"]
