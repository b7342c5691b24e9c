"""`compute_at T, C.v` for an element-wise producer: T's statement (`T[i, j] = f(X[i, j])`, or a transpose `At[i, k]
= A[k, i]`) is computed inside its consumer C, at the element C reads, so T never goes to HBM. At the source level
that is T's expression substituted for each read of T in C's statement (C's loop variables for T's), and T's
statement and declaration dropped; the rules then compute it per tile of C (golden: compute_at/*.txt):

    T[i, j] = exp(X[i, j])                   s[i] = 0
    s[i] = 0; s[i] += T[i, j]        ->      s[i] += exp(X[i, j])           (a reduction of an expression)
    At[i, k] = A[k, i]
    C[i, j] += At[i, k] * B[k, j]    ->      C[i, j] += A[k, i] * B[k, j]   (the matmul reads A contraction-major)

Region: each iteration of C's loops reads one element of T at plain loop variables, so T is computed once per
element C reads, without recomputation, whichever of C's loops that index T is named (the tile loops the rules make
from them carry it). Refused, each a located error saying why and what to write instead: T an output of the kernel
(it is stored anyway), a loop of C that does not index T (T would be recomputed
for each of its iterations), a read of T at other than plain loop variables (a window: overlapping regions), and a
statement between T and C that writes what T reads. A directive on any other producer (a conv into its pool, a
producer with several readers) is left to directives.apply_fusion.

By default (no directive naming T) the same is done where it only gains: a temporary whose one reader reduces it
(a row or column sum of an expression of whole reads, a matmul of a transposed operand) is not stored
(inline_reduced_temporaries).
A temporary stored in a narrower dtype than f32 is rounded where it is read (`bf16(exp(X[i, j]))`), as its store
rounded it."""
from __future__ import annotations

from dataclasses import replace

from tilec.compiler.exprs import accesses, fmt_expr
from tilec.compiler.lower import rename_vars
from tilec.compiler.rewrite import leaves, perfect_nest, resolved, written
from tilec.errors import TilecError
from tilec.lang import syntax as sx


def inline_compute_at(program, directives: tuple[sx.Directive, ...]):
    """(the program with each element-wise producer a `compute_at` names inlined into its consumer, the directives
    left for the schedule)."""
    left: list[sx.Directive] = []
    for d in directives:
        new = _inlined(program, d) if d.name == "compute_at" else None
        if new is None:
            left.append(d)
        else:
            program = new
    return program, tuple(left)


def _producer(kernel: sx.Kernel, name: str) -> tuple[int, list[sx.Loop], sx.Assign] | None:
    """The top-level element-wise statement that alone writes `name`, each loop indexing its output once."""
    tops = [i for i, top in enumerate(kernel.body) if name in written(top)]
    if len(tops) != 1:
        return None
    loops, st = perfect_nest(kernel.body[tops[0]])
    if not isinstance(st, sx.Assign) or st.op != "=" or st.target.tensor != name:
        return None
    out = [ix.id if isinstance(ix, sx.Name) else None for ix in st.target.indices]
    if sorted(v for v in out if v) != sorted(lp.var for lp in loops) or None in out:
        return None
    return tops[0], loops, st


def _inlined(program, d: sx.Directive):
    """The program with the directive's producer inlined, or None when it names no element-wise producer and a
    consumer loop (a conv's `compute_at conv, Y.i`, `compute_at T, root`: directives.py's business)."""
    if len(d.args) != 2 or not all(isinstance(a, sx.Ref) for a in d.args):
        return None
    what, where = d.args
    assert isinstance(what, sx.Ref) and isinstance(where, sx.Ref)
    kernel = program.kernel
    found = _producer(kernel, what.parts[0]) if len(what.parts) == 1 else None
    if found is None or len(where.parts) != 2:
        return None
    at, loops, st = found
    name, (consumer, var) = st.target.tensor, where.parts
    if name in kernel.outputs:
        raise TilecError(f"{name} is an output of the kernel: it is stored anyway, and computed inside {consumer} "
                         "it would be computed twice", d.span, f"remove the directive, or compute {name} into a "
                         f"temporary for {consumer} to read")
    readers = [i for i, top in enumerate(kernel.body) if any(name in _reads(s) for s, _ in leaves(top))]
    mine = [i for i in readers if consumer in written(kernel.body[i])]
    if not mine:
        raise TilecError(f"{consumer} does not read {name}: there is nothing to compute {name} at", where.span,
                         f"name a statement that reads {name}: " + ", ".join(sorted(
                             t for i in readers for t in written(kernel.body[i]))) if readers else "")
    if len(readers) > 1:  # several readers: where T goes is the placement's choice (directives.apply_fusion says)
        return None
    top = kernel.body[mine[0]]
    _check_reads(top, name, consumer, var, where, d)
    _check_between(kernel, at, mine[0], st, d)
    return resolved(program, _rewritten(kernel, at, mine[0], loops, st, program.tensors))


def _reads(st) -> set[str]:
    if not isinstance(st, sx.Assign):
        return set()
    return {a.tensor for a in accesses(st.value)} | {a.tensor for ix in st.target.indices for a in accesses(ix)}


def _line(top: sx.Stmt) -> int:
    return next(s for s, _ in leaves(top)).span.line


def _check_reads(top: sx.Stmt, name: str, consumer: str, var: str, where: sx.Ref, d: sx.Directive) -> None:
    """Every read of the producer in the consumer's nest is at plain loop variables, and loop `var` is one of them."""
    around: set[str] = set()
    for s, lps in leaves(top):
        around |= set(lps)
        for a in (accesses(s.value) if isinstance(s, sx.Assign) else []):
            if a.tensor != name:
                continue
            if not all(isinstance(ix, sx.Name) and ix.id in lps for ix in a.indices):
                raise TilecError(f"{consumer} reads {name} at `{fmt_expr(a)}`, not at its loop variables (a "
                                 "shifted or windowed read): compute_at of an element-wise producer is compiled for "
                                 "reads at the consumer's loop variables, one element per iteration", d.span,
                                 f"remove the directive ({name} is stored once and read back)")
            if var in lps and var not in {ix.id for ix in a.indices if isinstance(ix, sx.Name)}:
                loops = ", ".join(f"{consumer}.{ix.id}" for ix in a.indices if isinstance(ix, sx.Name))
                raise TilecError(f"`{fmt_expr(a)}` does not depend on loop {var} of {consumer}: computed at {var}, "
                                 f"{name} would be computed again for each of its iterations", where.span,
                                 f"name a loop that indexes {name}: {loops}")
    if var not in around:
        raise TilecError(f"{consumer} has no loop `{var}`", where.span,
                         f"its loops are: {', '.join(sorted(around))}")


def _check_between(kernel: sx.Kernel, at: int, use: int, st: sx.Assign, d: sx.Directive) -> None:
    """No statement between the producer and its consumer writes a tensor the producer reads."""
    reads = {a.tensor for a in accesses(st.value)}
    for top in kernel.body[at + 1:use]:
        hit = reads & written(top)
        if hit:
            x = sorted(hit)[0]
            raise TilecError(f"line {_line(top)} writes {x} between {st.target.tensor} (line {st.span.line}) and its "
                             f"consumer: computed inside the consumer, {st.target.tensor} would read the new {x}",
                             d.span, "remove the directive, or move the consumer before that line")


def _rewritten(kernel: sx.Kernel, at: int, use: int, loops: list[sx.Loop], st: sx.Assign, tensors: dict
               ) -> sx.Kernel:
    name = st.target.tensor
    dtype = tensors[name].dtype
    own = [ix.id for ix in st.target.indices if isinstance(ix, sx.Name)]

    def value(a: sx.Access) -> sx.Expr:
        if a.tensor != name:
            return a
        e = rename_vars(st.value, {v: ix.id for v, ix in zip(own, a.indices) if isinstance(ix, sx.Name)})
        exact = dtype == "f32" or isinstance(st.value, sx.Access) and tensors[st.value.tensor].dtype == dtype
        return e if exact else sx.Call(dtype, (e,), a.span)  # T's store rounds its elements: so does the read

    def stmt(s: sx.Stmt) -> sx.Stmt:
        if isinstance(s, sx.Loop):
            return replace(s, body=tuple(stmt(c) for c in s.body))
        return replace(s, value=sx.map_reads(s.value, value))

    body = [stmt(top) if i == use else top for i, top in enumerate(kernel.body) if i != at]
    decls = tuple(dc for dc in kernel.decls if dc.name != name)
    return replace(kernel, body=tuple(body), decls=decls)


def inline_reduced_temporaries(program, directives: tuple[sx.Directive, ...]):
    """The default of `compute_at T, s.i` where it only gains: a temporary computed element-wise (`T[i, j] =
    exp(X[i, j] - 1)`) whose one reader reduces it (`s[i] += T[i, j]`, read at its loop variables) is reduced as an
    expression, without the HBM round trip; a temporary a directive names keeps its own statement."""
    named = {p for d in directives for a in d.args if isinstance(a, sx.Ref) for p in a.parts[:1]}
    while True:
        kernel = program.kernel
        for name, t in program.tensors.items():
            if t.kind != "temp" or name in named or name in kernel.outputs:
                continue
            found = _producer(kernel, name)
            if found is None:
                continue
            at, loops, st = found
            if not _reads_every_loop(st, loops):  # a broadcast read: reduce_split would store the terms again
                continue
            readers = [i for i, top in enumerate(kernel.body) if any(name in _reads(s) for s, _ in leaves(top))]
            if len(readers) != 1 or readers[0] < at or not _reduces_plainly(kernel.body[readers[0]], name):
                continue
            if not isinstance(st.value, sx.Access) and _contracts(kernel.body[readers[0]], name):
                continue  # a matmul operand is a read (a transpose inlines; `h = X * 3 + 0.25` stays a tensor)
            reads = {a.tensor for a in accesses(st.value)}
            if any(reads & written(top) for top in kernel.body[at + 1:readers[0]]):
                continue
            program = resolved(program, _rewritten(kernel, at, readers[0], loops, st, program.tensors))
            break
        else:
            return program


def _reads_every_loop(st: sx.Assign, loops: list[sx.Loop]) -> bool:
    """Whether each read of the statement is indexed by all of its loops, plainly (`X[i, j]`, `A[k, i]`)."""
    want = sorted(lp.var for lp in loops)
    return all(sorted(ix.id for ix in a.indices if isinstance(ix, sx.Name)) == want and len(a.indices) == len(want)
               for a in accesses(st.value))


def _contracts(top: sx.Stmt, name: str) -> bool:
    """Whether a reduction update of the nest multiplies `name` by another read (a contraction's form)."""
    return any(isinstance(s, sx.Assign) and s.op == "+=" and isinstance(s.value, sx.BinOp) and s.value.op == "*"
               and name in {a.tensor for a in accesses(s.value)} and len(accesses(s.value)) == 2
               for s, _ in leaves(top))


def _reduces_plainly(top: sx.Stmt, name: str) -> bool:
    """Whether the nest's reads of `name` are all in reduction updates, each at plain loop variables."""
    for s, lps in leaves(top):
        for a in (accesses(s.value) if isinstance(s, sx.Assign) else []):
            if a.tensor == name and (s.op == "=" or not all(isinstance(ix, sx.Name) and ix.id in lps
                                                              for ix in a.indices)):
                return False
    return True
