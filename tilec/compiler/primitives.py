"""Scheduling primitives on level-A IR (compiler/nest.py): each is `Kernel -> Kernel`, checks its own legality
with one-line checks, and raises a TilecError (at the directive's span when given) saying what to change.
tests/compiler/test_primitives.py evaluates every primitive before and after (nest_eval) and keeps before/after
and error goldens (tests/golden/compiler/primitives/).

    split(k, "i", 4)          for i in serial(16): S(i)  ->  for i_o in serial(4): for i_i in serial(4): S(4*i_o + i_i)
    reorder(k, "j", "i")      for i: for j: S  ->  for j: for i: S          (a perfect nest; see _check_reorder)
    unroll(k, "r")            for r in serial(3)  ->  for r in unrolled(3)
    partition(k, "i")         for i in serial(128)  ->  for i in partition(128)     (extent <= target partitions)
    stage(k, "A", "i", "sbuf")  inside loop i: alloc A_sbuf, copy the region of A the body reads, read it instead
    compute_at(k, "T", "i")   the nest computing T moves under loop i, computing the region one iteration reads
    reverse_compute_at(k, "e", "i")  the consumer nest at loop e moves under loop i of its producer, after it,
                              computing what one iteration of i has finished (a reduction's epilogue per row tile)
    buffers(k, "A_sbuf", 2)   an on-chip buffer allocated inside a loop gets 2 copies in flight
    bind_expr(k, "s", "p", "T")  a reduction's expression computed into an on-chip tile T over the nest at p first,
                              then reduced from T (Exo's bind_expr: the tile the reduce instruction reads)
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from tilec.compiler import named
from tilec.compiler.ir import Aff, Term
from tilec.compiler.nest import (Access, Alloc, Assign, Buffer, Const, Expr, Index, Kernel, Load, Loop, Op, Stmt,
                                 Update, fmt_access, loads, map_loads, walk)
from tilec.errors import Span, TilecError
from tilec.target import Target, target as get_target

UNROLL_MAX = 64  # iterations one unrolled loop may have: each becomes straight-line code in the kernel
BUFFERS_MAX = 4  # copies of one buffer in flight: more only adds SBUF pressure once loads overlap compute


def _fail(message: str, span: Span | None, hint: str = "") -> TilecError:
    return TilecError(message, span, hint)


def _parse_ref(ref: str) -> tuple[str, int | None]:
    """`j` -> ("j", None); `j#1` -> ("j", 1): the second loop named j in program order (as Exo names them)."""
    var, _, nth = ref.partition("#")
    return var, int(nth) if nth.isdigit() else None


def find_loop(k: Kernel, ref: str, span: Span | None = None) -> Loop:
    var, nth = _parse_ref(ref)
    loops = [s for s in walk(k.body) if isinstance(s, Loop) and s.var == var]
    if nth is not None and nth < len(loops):
        return loops[nth]
    if len(loops) != 1 or nth is not None:
        known = ", ".join(sorted({s.var for s in walk(k.body) if isinstance(s, Loop)}))
        if len(loops) > 1:
            raise _fail(f"{len(loops)} loops are named `{var}`", span,
                        f"name one by its position: {', '.join(f'{var}#{i}' for i in range(len(loops)))}")
        raise _fail(f"no loop `{ref}`", span, f"loops: {known}")
    return loops[0]


def _splice(body: tuple[Stmt, ...], repl: Callable[[Stmt], tuple[Stmt, ...] | None]) -> tuple[Stmt, ...]:
    """The body with every statement s for which repl(s) gives statements replaced by them (found at any depth;
    the replacements are not searched again)."""
    out: list[Stmt] = []
    for s in body:
        new = repl(s)
        if new is not None:
            out += new
        elif isinstance(s, Loop):
            out.append(replace(s, body=_splice(s.body, repl)))
        else:
            out.append(s)
    return tuple(out)


def _replace_loop(body: tuple[Stmt, ...], target: Loop, fn) -> tuple[Stmt, ...]:
    """The body with the loop `target` (found by identity) replaced by fn(target)."""
    return _splice(body, lambda s: (fn(s),) if s is target else None)


def with_loop_many(k: Kernel, target: Loop, new: tuple[Stmt, ...]) -> Kernel:
    """k with loop `target` replaced by the statements `new`."""
    return replace(k, body=_splice(k.body, lambda s: new if s is target else None))


def _with_loop(k: Kernel, loop: Loop, fn) -> Kernel:
    return replace(k, body=_replace_loop(k.body, loop, fn))


# ---- substitution of a loop variable by an affine expression -------------------------------------------------------


def _subst_aff(a: Aff, var: str, by: Aff) -> Aff:
    coef = sum(t.coef for t in a.terms if t.var == var)
    if not coef:
        return a
    name = next((t.name for t in a.terms if t.var == var), "")
    at = next(n for n, t in enumerate(a.terms) if t.var == var)
    rest = tuple(t for t in a.terms if t.var != var)
    # a named coefficient survives: `i_o*TILE` with i_o = 4*bi + ai gives bi*(4*128) and ai*TILE; the new terms
    # take the old one's place (outer loops first, as the kernel reads)
    scaled = tuple(Term(t.var, t.coef * coef, t.name if coef == 1 else name if t.coef == 1 else "")
                   for t in by.terms)
    return Aff(rest[:at] + scaled + rest[at:], a.const + coef * by.const)


def _subst_access(a: Access, var: str, by: Aff) -> Access:
    return replace(a, index=tuple(_subst_aff(i, var, by) for i in a.index))  # a padded read keeps its fill


def _subst_expr(e: Expr, var: str, by: Aff) -> Expr:
    if isinstance(e, Load):  # replace() keeps each node's span (the lines of the instructions made from it)
        return replace(e, access=_subst_access(e.access, var, by))
    if isinstance(e, Index):
        return Index(_subst_aff(e.aff, var, by))
    if isinstance(e, Op):
        return replace(e, args=tuple(_subst_expr(x, var, by) for x in e.args))
    return e


def _subst(body: tuple[Stmt, ...], var: str, by: Aff) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            out.append(replace(s, body=_subst(s.body, var, by)))
        elif isinstance(s, (Assign, Update)):
            out.append(replace(s, dst=_subst_access(s.dst, var, by), expr=_subst_expr(s.expr, var, by)))
        else:
            out.append(s)
    return tuple(out)


# ---- the primitives ------------------------------------------------------------------------------------------------


def split(k: Kernel, var: str, factor: int, span: Span | None = None, outer: str = "", inner: str = "",
          name: str = "", note: str = "") -> Kernel:
    """`i` -> `i_o, i_i` with i = factor*i_o + i_i. Before/after (golden: primitives/split.txt):

        for i in serial(256):                    for i_o in serial(2):
          Y[i, j] = X[i, j] + 1                    for i_i in serial(128):
                                                     Y[i_o*128 + i_i, j] = X[i_o*128 + i_i, j] + 1

    `outer`/`inner` name the new loops (default i_o, i_i); `name` is the constant the factor stands for in the
    kernel (TILE_F: `t*TILE_F`), and the outer loop's comment then says "(tiles of TILE_F)" unless `note` is given.
    """
    loop = find_loop(k, var, span)
    var = loop.var
    if factor <= 0 or loop.extent % factor:
        divisors = [d for d in range(1, loop.extent + 1) if loop.extent % d == 0]
        raise _fail(f"split {var}, {factor}: {factor} does not divide the extent {loop.extent} of loop {var}", span,
                    f"use a divisor of {loop.extent}: {', '.join(map(str, divisors[:12]))}")
    factor = named.name(factor, name) if name else factor  # the outer trip count reads `SIZE_M // TILE` (named.py)
    outer, inner = outer or f"{var}_o", inner or f"{var}_i"
    for new in (outer, inner):
        if any(isinstance(s, Loop) and s.var == new for s in walk(k.body)):
            raise _fail(f"split {var}: a loop named {new} exists already", span, "split each loop once")
    by = Aff((Term(outer, factor, name), Term(inner)), 0)
    outer_note = note or (f"{loop.note} (tiles of {name})" if name and loop.note else loop.note)

    def rebuild(s: Loop) -> Loop:
        whole = s.extent if s.extent == factor else factor  # one outer step: the inner loop is all of s (its name)
        inner_loop = Loop(inner, whole, _subst(s.body, var, by), s.kind, s.line, s.note)
        return Loop(outer, s.extent // factor, (inner_loop,), "serial", s.line, outer_note)

    return _with_loop(k, loop, rebuild)


def _stores(body: tuple[Stmt, ...]) -> list[Assign | Update]:
    return [s for s in walk(body) if isinstance(s, (Assign, Update))]


def _check_reorder(loops: list[Loop], span: Span | None) -> None:
    """Legal when every iteration of the permuted loops touches its own elements: each store writes through an
    index that uses every permuted loop (spatial), or is an associative update (+=, max=, min=: a reduction loop may
    move), and no statement reads a buffer the nest writes at another element."""
    names = {lp.var for lp in loops}
    stores = _stores(loops[-1].body)
    written = {s.dst.buf: s.dst for s in stores}
    for s in stores:
        used = {t.var for i in s.dst.index for t in i.terms}
        if isinstance(s, Assign) and not names <= used:
            missing = ", ".join(sorted(names - used))
            raise _fail(f"reorder: `{s.dst.buf}` is assigned in every iteration of {missing} (the last one wins), "
                        f"so the order of those loops matters", span,
                        "split the statement off into its own nest first")
        for a in loads(s.expr):
            if a.buf in written and a != written[a.buf]:
                raise _fail(f"reorder: the nest reads {a.buf} at another element than it writes it, a dependence "
                            f"between iterations", span, "reorder only loops whose iterations are independent")



def reorder(k: Kernel, *order: str, span: Span | None = None) -> Kernel:
    """Permute a perfect nest into `order`, outermost first: `reorder(k, "j", "i")` on `for i: for j: S` gives
    `for j: for i: S` (golden: primitives/reorder.txt). The loops named must be nested directly in one another."""
    found = [find_loop(k, r, span) for r in order]
    order = tuple(lp.var for lp in found)
    tops = [lp for lp in found if all(o is lp or any(o is s for s in walk(lp.body)) for o in found)]
    if not tops:
        raise _fail(f"reorder {', '.join(order)}: the loops are not nested in one another", span,
                    "name loops of one nest")
    chain = [tops[0]]
    while len(chain) < len(order):
        body = chain[-1].body
        if len(body) != 1 or not isinstance(body[0], Loop) or not any(body[0] is lp for lp in found):
            raise _fail(f"reorder {', '.join(order)}: loops {', '.join(order)} are not a perfect nest (loop "
                        f"{chain[-1].var} holds more than the next of them)", span,
                        "name loops nested directly in one another")
        chain.append(body[0])
    _check_reorder(chain, span)
    by_var = {lp.var: lp for lp in chain}
    inner_body = chain[-1].body
    for var in reversed(order):
        inner_body = (replace(by_var[var], body=inner_body),)
    return _with_loop(k, chain[0], lambda _: inner_body[0])


IDENTITY = {"+=": 0.0, "max=": float("-inf"), "min=": float("inf")}


def fold_init(k: Kernel, buf: str, span: Span | None = None) -> Kernel:
    """A reduction's initial value folded into its reduce: the top-level nest `for i: s[i] = c` goes when the next
    nest updates s (`s[i] += ...`) and c is the update's identity (0 for +=, -inf for max=, inf for min=); the
    reduce instruction then writes its first result instead of combining it (tensorize's tensor_reduce):

        for i in serial(256):                       for i in serial(256):
          s[i] = 0                                    for j in serial(384):
        for i in serial(256):                           s[i] += A[i, j]
          for j in serial(384):
            s[i] += A[i, j]
    """
    for n, (init, nxt) in enumerate(zip(k.body, k.body[1:])):
        if not (isinstance(init, Loop) and isinstance(nxt, Loop)):
            continue
        sets = [s for s in walk((init,)) if isinstance(s, Assign)]
        ups = [s for s in walk((nxt,)) if isinstance(s, Update) and s.dst.buf == buf]
        if len(sets) == 1 and sets[0].dst.buf == buf and ups:
            value = sets[0].expr
            if not (isinstance(value, Const) and all(value.value == IDENTITY[u.op] for u in ups)):
                raise _fail(f"fold_init {buf}: its initial value is not the identity of {ups[0].op}", span,
                            "fold only an initial value the reduction starts from anyway")
            return replace(k, body=k.body[:n] + k.body[n + 1:])
    raise _fail(f"fold_init {buf}: no nest initialising {buf} before a nest updating it", span)


def unroll(k: Kernel, var: str, span: Span | None = None, copies: bool = False) -> Kernel:
    """`for r in serial(3)` -> `for r in unrolled(3)` (golden: primitives/unroll.txt). `copies=True` writes the
    iterations out: one loop `r` of one iteration per value, its body with r replaced by the value, in order
    (golden: primitives/unroll_copies.txt); the copies are loops `r#0`, `r#1`, .. for the primitives after it (a
    buffer staged in each copy is a buffer of its own, as a builder's `A_r0`, `A_r1`)."""
    loop = find_loop(k, var, span)
    var = loop.var
    if loop.extent > UNROLL_MAX:
        raise _fail(f"unroll {var}: {loop.extent} iterations is more than the {UNROLL_MAX} one unrolled loop may "
                    f"have", span, f"split {var} first and unroll the inner loop")
    if not copies:
        return _with_loop(k, loop, lambda s: replace(s, kind="unrolled"))
    if any(isinstance(s, Loop) and s.var == var and s is not loop for s in walk(k.body)):
        raise _fail(f"unroll {var}: another loop is named {var}, so its copies could not be told apart", span,
                    "name the loops apart first (split's outer= and inner=)")
    if any(isinstance(s, Alloc) for s in walk(loop.body)):
        raise _fail(f"unroll {var}: its body allocates a buffer; copies would allocate it several times", span,
                    "unroll before staging")
    made = tuple(Loop(var, 1, _subst(loop.body, var, Aff((), j)), "serial", loop.line, loop.note)
                 for j in range(loop.extent))
    return with_loop_many(k, loop, made)


def pair(k: Kernel, first: str, second: str, span: Span | None = None) -> Kernel:
    """Two sibling loops (`g#0`, `g#1`: copies of unroll(g, copies=True)) whose last statements are nests adding
    into the same element (`s[f] += X[p, f]`, `s[f] += Y[p, f]`, over loops of the same extents) become one loop:
    the first's statements, the second's before its nest, then one nest adding both, `s[f] += X[p, f] + Y[p, f]`
    (golden: primitives/pair.txt). Legal by the associativity of `+=`: both updates of the same element happen in
    the same iteration, and nothing reads it between them (the second loop's other statements are its staged
    copies); after it, bind_expr puts the pair's sum in a tile of its own (VectorE adds, TensorE sums the pair)."""
    a, b = find_loop(k, first, span), find_loop(k, second, span)
    where = _siblings(k.body, a, b)
    if where is None:
        raise _fail(f"pair {first}, {second}: the loops are not next to each other in one body", span,
                    "pair two consecutive copies of an unrolled loop")
    if a.extent != b.extent or a.var != b.var:
        raise _fail(f"pair {first}, {second}: the loops differ ({a.var} in {a.extent}, {b.var} in {b.extent})", span)
    na, nb = a.body[-1] if a.body else None, b.body[-1] if b.body else None
    ua, ub = _update_nest(na), _update_nest(nb)
    if ua is None or ub is None or not isinstance(na, Loop) or not isinstance(nb, Loop):
        raise _fail(f"pair {first}, {second}: each loop must end with a perfect nest of one `+=` update", span,
                    "pair the copies of a summed loop (a column sum's row tiles)")
    (chain_a, upd_a), (chain_b, upd_b) = ua, ub
    if [lp.extent for lp in chain_a] != [lp.extent for lp in chain_b] or upd_a.op != "+=" or upd_b.op != "+=":
        raise _fail(f"pair {first}, {second}: the nests are not `+=` updates over loops of the same extents", span)
    rename = dict(zip((lp.var for lp in chain_b), (lp.var for lp in chain_a)))
    expr_b = upd_b.expr
    for old, new in rename.items():
        expr_b = _subst_expr(expr_b, old, Aff((Term(new),)))
    dst_b = upd_b.dst
    for old, new in rename.items():
        dst_b = _subst_access(dst_b, old, Aff((Term(new),)))
    if dst_b != upd_a.dst:
        raise _fail(f"pair {first}, {second}: the nests update different elements ({fmt_access(upd_a.dst)}, "
                    f"{fmt_access(upd_b.dst)})", span)
    if any(x.buf == upd_a.dst.buf for x in loads(upd_a.expr) + loads(expr_b)) or \
            any(isinstance(s, (Assign, Update)) and s.dst.buf == upd_a.dst.buf for s in walk(b.body[:-1])):
        raise _fail(f"pair {first}, {second}: {upd_a.dst.buf} is read or written between the two updates", span)
    both: Stmt = replace(upd_a, expr=Op("+", (upd_a.expr, expr_b)))
    for lp in reversed(chain_a):
        both = replace(lp, body=(both,))
    merged = replace(a, body=a.body[:-1] + b.body[:-1] + (both,))
    return _with_pair(k, a, b, merged)


def _update_nest(s: Stmt | None) -> tuple[list[Loop], Update] | None:
    """(the loops, the update) of a perfect nest of one update; None otherwise."""
    chain: list[Loop] = []
    while isinstance(s, Loop):
        chain.append(s)
        s = s.body[0] if len(s.body) == 1 else None
    return (chain, s) if chain and isinstance(s, Update) else None


def _siblings(body: tuple[Stmt, ...], a: Loop, b: Loop) -> tuple[int, int] | None:
    for n, (x, y) in enumerate(zip(body, body[1:])):
        if x is a and y is b:
            return n, n + 1
    for s in body:
        if isinstance(s, Loop):
            found = _siblings(s.body, a, b)
            if found is not None:
                return found
    return None


def _with_pair(k: Kernel, a: Loop, b: Loop, merged: Loop) -> Kernel:
    """k with the loop `a` replaced by `merged` and the loop `b` removed."""
    return replace(k, body=_splice(k.body, lambda s: (merged,) if s is a else () if s is b else None))


def partition(k: Kernel, var: str, target: Target | str | None = None, span: Span | None = None,
              summed: bool = False) -> Kernel:
    """Bind loop `var` to the partitions (golden: primitives/partition.txt). Its extent must fit the target's
    partitions, and every store under it must use it (each partition computes its own elements), or, `summed`,
    every store is a `+=` update the partitions add up (a column sum: a ones matmul contracts them)."""
    t = get_target(target)
    loop = find_loop(k, var, span)
    var = loop.var
    if loop.extent > t.pmax:
        raise _fail(f"partition {var}: {loop.extent} iterations exceed the {t.pmax} partitions of {t.name}", span,
                    f"split {var}, {t.pmax} first and bind the inner loop")
    for s in _stores(loop.body):
        if summed and isinstance(s, Update) and s.op == "+=":
            continue
        if summed and not any(t_.var == var for i in s.dst.index for t_ in i.terms):
            raise _fail(f"partition {var}: the partitions of `{s.dst.buf}` are summed only by a `+=` update (a ones "
                        f"matmul adds them)", span, "bind a loop that indexes what the nest writes")
        if not any(t_.var == var for i in s.dst.index for t_ in i.terms):
            raise _fail(f"partition {var}: `{s.dst.buf}` is written by every partition (its index does not use "
                        f"{var})", span, "bind a loop that indexes what the nest writes")
    return _with_loop(k, loop, lambda s: replace(s, kind="partition"))


def stage(k: Kernel, buf: str, at: str, memory: str = "sbuf", target: Target | str | None = None,
          span: Span | None = None, name: str = "", dtype: str = "", near: bool = False,
          resident: bool = False) -> Kernel:
    """Exo's stage_mem / TVM's cache_read: inside loop `at`, copy the region of `buf` its body reads into a new
    on-chip buffer and read that instead (golden: primitives/stage.txt). The region is the box the body's affine
    reads cover over the loops inside `at`; it must fit the target's SBUF per partition. `at` "" stages once for
    the whole kernel (after its views); `name` and `dtype` name the copy and its type (default BUF_sbuf, BUF's
    type: a DMA converts on the way). `near`: the copy goes just before the first statement of the loop's body
    that reads `buf` rather than first (an epilogue's operand, loaded after the reduction before it).
    `resident`: the copy is allocated once for the whole kernel over everything the kernel reads of `buf` (after
    its views), and each iteration of `at` copies its region into its own part (loads never wait for a buffer)."""
    t = get_target(target)
    loop = find_loop(k, at, span) if at else Loop("", 1, k.body)
    where = f"loop {at}" if at else "the kernel"
    reads = [a for s in _stores(loop.body) for a in loads(s.expr) if a.buf == buf]
    if not reads:
        raise _fail(f"stage {buf} at {at}: the body of {where} does not read {buf}", span)
    if any(s.dst.buf == buf for s in _stores(loop.body)):
        raise _fail(f"stage {buf} at {at}: {where} also writes {buf}; a staged copy would go stale", span)
    inner = {s.var: s.extent for s in walk(loop.body) if isinstance(s, Loop)}
    box = region(reads, inner, f"stage {buf} at {at}", span, unit_loops=near)
    if _reversed_partitions(box, reads, inner):  # engines cannot read partitions backwards: the DMA reverses them
        box = replace(box, flip=True)
    source = k.buffers()[buf]
    _check_fits(box.shape, dtype or source.dtype, t, f"stage {buf} at {at}", span)
    staged = Buffer(name or f"{buf}_{memory}", memory, dtype or source.dtype, box.shape)
    line = next(s.line for s in _stores(loop.body) if any(a.buf == buf for a in loads(s.expr)))
    if resident and at and box.flip:
        raise _fail(f"stage {buf} at {at}, resident: {buf} is read with its partitions reversed", span,
                    "stage it per iteration instead")
    if resident and at:
        return _stage_resident(k, buf, loop, box, staged, line, t, span)
    copy = copy_nest(staged.name, buf, box, line, into=True)
    moved = relocate(loop.body, buf, staged.name, box)
    at_n = next(n for n, s in enumerate(loop.body) if any(a.buf == buf for x in _stores((s,)) for a in loads(x.expr))) \
        if near else 0
    new_body = moved[:at_n] + (Alloc(staged, line), copy) + moved[at_n:]
    if not at:  # after the kernel's views (all of them first: a view is a name, not a copy): the copy reads them
        views = tuple(s for s in k.body if _is_view(s))
        rest = tuple(s for s in new_body[2:] if not _is_view(s))
        return replace(k, body=views + new_body[:2] + rest)
    return _with_loop(k, loop, lambda s: replace(s, body=new_body))


def _reversed_partitions(box: "Region", reads: list[Access], inner: dict[str, int]) -> bool:
    """Whether every read indexes the copy's first dimension (its partitions) backwards: one inner loop with
    coefficient -1 there (`A_v[P - 1 - p, f]`)."""
    d = box.kept[0]
    moved = [[t for t in a.index[d].terms if t.var in inner and inner[t.var] > 1] for a in reads]
    return all(len(m) == 1 and m[0].coef == -1 for m in moved)


def _stage_resident(k: Kernel, buf: str, loop: Loop, box: "Region", staged: Buffer, line: int, t: Target,
                    span: Span | None) -> Kernel:
    """stage(.., resident=True): one buffer over the kernel's whole region of `buf`, each iteration of `loop`
    copying its own box into its part."""
    every = [a for s in _stores(k.body) for a in loads(s.expr) if a.buf == buf]
    loops = {s.var: s.extent for s in walk(k.body) if isinstance(s, Loop)}
    whole = region(every, loops, f"stage {buf} at {loop.var}", span)
    if whole.kept != box.kept or any(off.terms for off in whole.offsets):
        raise _fail(f"stage {buf} at {loop.var}, resident: the kernel's region of {buf} and the loop's keep other "
                    f"dimensions", span, "stage it per iteration instead")
    _check_fits(whole.shape, staged.dtype, t, f"stage {buf} at {loop.var}", span)
    staged = replace(staged, shape=whole.shape)
    part = Region(tuple(Aff(off.terms, off.const - w.const) for off, w in zip(box.offsets, whole.offsets)),
                  box.extents, box.kept)  # where the loop's box sits in the resident buffer
    names = {d: f"{buf}_c{n}" for n, d in enumerate(box.kept)}
    dst = Access(staged.name, tuple(part.offsets[d].plus(Aff((Term(names[d]),))) for d in box.kept))
    src = Access(buf, tuple(off.plus(Aff((Term(names[d]),))) if d in names else off
                            for d, off in enumerate(box.offsets)))
    copy: Stmt = Assign(dst, Load(src), line)
    for n, d in reversed(list(enumerate(box.kept))):
        copy = Loop(names[d], box.extents[d], (copy,), "partition" if n == 0 else "serial", line)
    k = _with_loop(k, loop, lambda s: replace(s, body=(copy,) + relocate(s.body, buf, staged.name, whole)))
    views = [n for n, s in enumerate(k.body) if isinstance(s, Alloc) and s.buf.view_of and s.buf.name == buf]
    at = views[0] + 1 if views else 0
    return replace(k, body=k.body[:at] + (Alloc(staged, line),) + k.body[at:])


@dataclass(frozen=True)
class Region:
    """The box of a buffer some accesses cover inside a loop: per dimension its first index (an affine function of
    the loops outside) and extent; `kept` are the dimensions a staged copy has (leading dimensions the inner loops
    do not move are left out while more than two remain: the copy's first dimension goes on the partitions)."""
    offsets: tuple[Aff, ...]
    extents: tuple[int, ...]
    kept: tuple[int, ...]
    flip: bool = False  # the copy's first (partition) dimension runs backwards over the buffer (a reversed read)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.extents[d] for d in self.kept)

    def local(self, a: Access) -> tuple[Aff, ...]:
        """An access of the buffer as an index of the staged copy."""
        out = []
        for d in self.kept:
            i, off = a.index[d], self.offsets[d]
            outer = {t.var for t in off.terms}
            at = Aff(tuple(t for t in i.terms if t.var not in outer), i.const - off.const)
            if self.flip and d == self.kept[0]:  # copy row c holds buffer row lo + n - 1 - c
                at = Aff(tuple(replace(t, coef=-t.coef) for t in at.terms), self.extents[d] - 1 - at.const)
            out.append(at)
        return tuple(out)


def region(accesses: list[Access], inner: dict[str, int], what: str, span: Span | None,
           unit_loops: bool = False) -> Region:
    """The Region the accesses cover over the loops `inner`. All accesses must move alike with the outer loops.
    `unit_loops`: a leading dimension moved only by inner loops of one iteration is left out too (an epilogue
    computed at a free tile reads its row of sums through such loops: stage_out)."""
    dims = len(accesses[0].index)
    padded = next((a for a in accesses if a.fill is not None), None)
    if padded is not None:
        raise _fail(f"{what}: {fmt_access(padded)} is a padded read; a staged region of it (a halo filled with "
                    f"{padded.fill:g}) is not built yet", span, "stage a buffer that is read without padding")
    for d in range(dims):
        outside = {tuple(t_ for t_ in a.index[d].terms if t_.var not in inner) for a in accesses}
        if len(outside) != 1:
            raise _fail(f"{what}: the accesses of {accesses[0].buf} move differently with the loops outside "
                        f"(dimension {d})", span, "stage at a loop where all reads share one region")
    lo = [min(_bound(a.index[d], inner, min) for a in accesses) for d in range(dims)]
    hi = [max(_bound(a.index[d], inner, max) for a in accesses) for d in range(dims)]
    extents = tuple(h - l_ + 1 for l_, h in zip(lo, hi))
    kept = list(range(dims))
    moves = (lambda v: inner.get(v, 1) > 1) if unit_loops else (lambda v: v in inner)  # noqa: E731
    while len(kept) > 2 and extents[kept[0]] == 1 and not any(moves(t.var) for a in accesses
                                                              for t in a.index[kept[0]].terms):
        kept.pop(0)
    return Region(tuple(lo_affs(accesses, inner)), extents, tuple(kept))


def _check_fits(shape: tuple[int, ...], dtype: str, t: Target, what: str, span: Span | None) -> None:
    per_partition = _elem_bytes(dtype) * _prod(shape[1:])
    if shape[0] > t.pmax or per_partition > t.sbuf_usable:
        raise _fail(f"{what}: the region {list(shape)} needs {shape[0]} partitions and {per_partition} bytes per "
                    f"partition; {t.name} has {t.pmax} and {t.sbuf_usable}", span,
                    "stage at a loop further inside, or split it first")


def copy_nest(staged: str, buf: str, box: Region, line: int, into: bool, prefix: str = "") -> Stmt:
    """`for c0 in partition: for c1, ..: staged[c0, c1, ..] = buf[o0 + c0, o1 + c1, ..]` over the region (the copy a
    stage makes: one DMA; its first dimension is the staged copy's partitions); `into=False` copies back."""
    names = {d: f"{prefix or buf}_c{n}" for n, d in enumerate(box.kept)}
    local = Access(staged, tuple(Aff((Term(names[d]),)) for d in box.kept))
    back = box.kept[0] if box.flip else -1  # a reversed copy: row c from buffer row lo + n - 1 - c
    whole = Access(buf, tuple(off.plus(Aff((Term(names[d], -1),), box.extents[d] - 1)) if d == back else
                              off.plus(Aff((Term(names[d]),))) if d in names else off
                              for d, off in enumerate(box.offsets)))
    copy: Stmt = Assign(local, Load(whole), line) if into else Assign(whole, Load(local), line)
    for n, d in reversed(list(enumerate(box.kept))):
        copy = Loop(names[d], box.extents[d], (copy,), "partition" if n == 0 else "serial", line)
    return copy


def lo_affs(reads: list[Access], inner: dict[str, int]) -> list[Aff]:
    """Per dimension, the lowest index the reads reach, as an affine function of the loops outside the stage."""
    out = []
    for d in range(len(reads[0].index)):
        a = reads[0].index[d]
        outer_terms = tuple(t for t in a.terms if t.var not in inner)
        low = min(_bound(r.index[d], inner, min) for r in reads)
        out.append(Aff(outer_terms, low))
    return out


def _bound(a: Aff, inner: dict[str, int], pick) -> int:
    """The lowest/highest value of the part of `a` that depends on the inner loops (plus its constant)."""
    value = a.const
    for t in a.terms:
        if t.var in inner:
            value += pick(0, t.coef * (inner[t.var] - 1))
    return value


def relocate(body: tuple[Stmt, ...], buf: str, staged: str, box: Region, reads: bool = True, writes: bool = False,
             lead: tuple[Aff, ...] = ()) -> tuple[Stmt, ...]:
    """The body with its reads (and/or writes) of `buf` redirected to the staged copy (`lead`: indices put before
    the copy's, e.g. the partition of a broadcast tile)."""
    def access(a: Access) -> Access:
        return Access(staged, lead + box.local(a)) if a.buf == buf else a

    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            out.append(replace(s, body=relocate(s.body, buf, staged, box, reads, writes, lead)))
        elif isinstance(s, (Assign, Update)):
            s = replace(s, expr=map_loads(s.expr, access)) if reads else s
            out.append(replace(s, dst=access(s.dst)) if writes else s)
        else:
            out.append(s)
    return tuple(out)


def _elem_bytes(dtype: str) -> int:
    return {"f32": 4, "f16": 2, "bf16": 2}[dtype]


def _prod(xs: tuple[int, ...]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def buffers(k: Kernel, buf: str, n: int, target: Target | str | None = None, span: Span | None = None) -> Kernel:
    """`n` copies of an on-chip buffer allocated inside a loop, so iteration k+1's load overlaps iteration k's
    compute (golden: primitives/buffers.txt). The meaning is unchanged; the copies must fit the target's SBUF."""
    t = get_target(target)
    allocs = [(s, lp) for lp in walk(k.body) if isinstance(lp, Loop) for s in lp.body
              if isinstance(s, Alloc) and s.buf.name == buf]
    if not allocs:
        raise _fail(f"buffers {buf}: no on-chip buffer {buf} is allocated inside a loop", span,
                    f"stage a region of {buf} at a loop first")
    alloc = allocs[0][0]
    if not 1 <= n <= BUFFERS_MAX:
        raise _fail(f"buffers {buf}, {n}: use 1 to {BUFFERS_MAX} copies", span)
    size = n * _elem_bytes(alloc.buf.dtype) * _prod(alloc.buf.shape[1:])
    if size > t.sbuf_usable:
        raise _fail(f"buffers {buf}, {n}: {n} copies need {size} bytes per partition; {t.name} has "
                    f"{t.sbuf_usable}", span, "use fewer copies or a smaller region")

    def visit(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        return tuple(replace(alloc, buffers=n) if s is alloc else replace(s, body=visit(s.body)) if isinstance(s, Loop)
                     else s for s in body)

    return replace(k, body=visit(k.body))


__all__ = ["split", "reorder", "unroll", "partition", "stage", "compute_at", "reverse_compute_at", "bind_expr",
           "buffers", "find_loop"]


def compute_at(k: Kernel, buf: str, at: str, span: Span | None = None) -> Kernel:
    """Move the nest that computes `buf` under the consumer loop `at`, computing there only the region of `buf` one
    iteration of `at` reads (TVM compute_at; overlapping regions are recomputed). Before/after (golden:
    primitives/compute_at.txt): `for i: T[i, j] = ...` then `for i: Y[i, j] = T[i, j] ...` becomes one loop i whose
    body first computes T[i, :], then Y[i, :].

    Legal when `buf` is an intermediate written by one top-level nest whose loops index its dimensions plainly,
    every read of `buf` is inside loop `at`, and that nest reads nothing written between it and `at`."""
    loop = find_loop(k, at, span)
    top = [s for s in k.body if isinstance(s, Loop)]
    producers = [s for s in top if any(st.dst.buf == buf for st in _stores((s,)))]
    if len(producers) != 1:
        raise _fail(f"compute_at {buf}: {buf} must be written by exactly one loop nest (found {len(producers)})", span)
    prod = producers[0]
    if any(o.name == buf for o in k.outputs):
        raise _fail(f"compute_at {buf}: {buf} is a kernel output; it must be stored whole", span,
                    "compute an intermediate at its consumer instead")
    consumer = next((s for s in top if s is loop or any(x is loop for x in walk(s.body))), None)
    if consumer is None or k.body.index(consumer) <= k.body.index(prod):
        raise _fail(f"compute_at {buf}: loop {at} is not in a nest after the one that computes {buf}", span)
    inside = [a for s in _stores(loop.body) for a in loads(s.expr) if a.buf == buf]
    everywhere = [a for s in _stores(k.body) for a in loads(s.expr) if a.buf == buf]
    if len(inside) != len(everywhere) or not inside:
        raise _fail(f"compute_at {buf}: {buf} is also read outside loop {at}", span,
                    f"compute it at a loop that holds every read of {buf}")
    between = k.body[k.body.index(prod) + 1:k.body.index(consumer)] + (consumer,)
    written = {s.dst.buf for s in _stores(tuple(between))}
    if any(a.buf in written for s in _stores((prod,)) for a in loads(s.expr)):
        raise _fail(f"compute_at {buf}: the nest computing {buf} reads a buffer written before loop {at}", span)
    region = _region(prod, buf, loop, inside, span)
    moved = _restrict(prod, region)
    body = tuple(s for s in k.body if s is not prod)
    return _with_loop(replace(k, body=body), loop, lambda s: replace(s, body=(moved,) + s.body))


def _region(prod: Loop, buf: str, loop: Loop, reads: list[Access], span: Span | None) -> dict[str, tuple[Aff, int]]:
    """Producer loop variable -> (first index, extent) of the part of `buf` one iteration of `loop` reads."""
    dst = _stores((prod,))[0].dst
    extents = {s.var: s.extent for s in walk((prod,)) if isinstance(s, Loop)}
    inner = {s.var: s.extent for s in walk(loop.body) if isinstance(s, Loop)}
    out: dict[str, tuple[Aff, int]] = {}
    for d, idx in enumerate(dst.index):
        if len(idx.terms) != 1 or idx.terms[0].coef != 1 or idx.const:
            raise _fail(f"compute_at {buf}: dimension {d} of {buf} is not indexed by a plain loop variable", span)
        var = idx.terms[0].var
        outside = {tuple(t for t in a.index[d].terms if t.var not in inner) for a in reads}
        if len(outside) != 1:
            raise _fail(f"compute_at {buf}: the reads of {buf} in loop {loop.var} move differently with the loops "
                        f"outside it (dimension {d})", span)
        lo = min(_bound(a.index[d], inner, min) for a in reads)
        hi = max(_bound(a.index[d], inner, max) for a in reads)
        out[var] = (Aff(next(iter(outside)), lo), min(hi - lo + 1, extents[var]))
    return out


def _restrict(prod: Loop, region: dict[str, tuple[Aff, int]]) -> Loop:
    """The producer nest over the region only: loop v of extent n becomes v_r over the region's extent, v := first +
    v_r in its body."""
    def visit(s: Stmt) -> Stmt:
        if not isinstance(s, Loop):
            return s
        body = tuple(visit(x) for x in s.body)
        if s.var not in region:
            return replace(s, body=body)
        first, extent = region[s.var]
        local = f"{s.var}_r"
        by = Aff(first.terms + (Term(local),), first.const)
        return Loop(local, extent, _subst(body, s.var, by), s.kind, s.line)

    return visit(prod)  # type: ignore[return-value]


def reverse_compute_at(k: Kernel, nest: str, at: str, span: Span | None = None) -> Kernel:
    """TVM's reverse_compute_at: the top-level nest at loop `nest` (a consumer) moves under loop `at` of the nest
    just before it (its producer), after what that loop's body computes, and computes only the part that reads the
    region one iteration of `at` has finished. Before/after (golden: primitives/reverse_compute_at.txt), a row sum
    and its scale:

        for i in serial(64):                       for i in serial(64):
          for j in serial(12):                       for j in serial(12):
            s[i] += A[i, j]                            s[i] += A[i, j]
        for i in serial(64):                         for i_r in serial(1):
          Y[i] = s[i] * 0.5                            Y[i + i_r] = s[i + i_r] * 0.5

    Legal when the consumer follows its producer (only nests touching other elements between them: the ragged last
    rows of a reduction cut apart), reads something the producer writes, indexes each dimension of those reads by a
    plain loop plus a constant (or a constant where the region is one element), and every loop of the producer from
    its top down to `at` indexes what the producer writes there (or runs once): an iteration of `at` then finishes
    its region, no later iteration adds to it (a reduction loop cannot be `at`)."""
    consumer = find_loop(k, nest, span)
    loop = find_loop(k, at, span)
    producer = next((s for s in k.body if isinstance(s, Loop) and (s is loop or any(x is loop for x in walk(s.body)))),
                    None)
    k = _views_first(k, consumer, producer)
    top = list(k.body)
    if not any(s is consumer for s in top):
        raise _fail(f"reverse_compute_at {nest}: loop {nest} is not the top of a nest", span,
                    "name the outermost loop of the consumer nest")
    where = next(i for i, s in enumerate(top) if s is consumer)
    pos = next((i for i, s in enumerate(top) if s is producer), where)
    between = [s for s in top[pos + 1:where] if not _is_view(s)]
    if producer is None or producer is consumer or pos >= where or \
            not all(isinstance(s, Loop) and _apart(s, consumer) for s in between):
        raise _fail(f"reverse_compute_at {nest}, {at}: the nest at {nest} does not follow the nest holding loop {at} "
                    f"(only nests touching other elements may come between)", span,
                    "compute a consumer at a loop of the nest just before it")
    chain = _path(producer, loop)
    written = {s.dst.buf for s in _stores(loop.body)}
    read = {a.buf for s in _stores((consumer,)) for a in loads(s.expr)}
    for lp in chain:  # (a temporary the consumer does not read need not be finished: a bound expression's tile)
        for s in (x for x in _stores(loop.body) if x.dst.buf in read):
            if lp.extent > 1 and not any(t.var == lp.var for i in s.dst.index for t in i.terms):
                raise _fail(f"reverse_compute_at {nest}, {at}: loop {lp.var} does not index {fmt_access(s.dst)}, so "
                            f"an iteration of {at} has not finished it (the loops over it still add to it)", span,
                            "compute the consumer at a loop outside the reduction loops")
    reads = [a for s in _stores((consumer,)) for a in loads(s.expr) if a.buf in written]
    if not reads:
        raise _fail(f"reverse_compute_at {nest}, {at}: the nest at {nest} reads nothing loop {at} computes", span)
    inner = {s.var: s.extent for s in walk(loop.body) if isinstance(s, Loop)}
    extents = {s.var: s.extent for s in walk((consumer,)) if isinstance(s, Loop)}
    out: dict[str, tuple[Aff, int]] = {}
    for a in reads:
        box = region([w.dst for w in _stores(loop.body) if w.dst.buf == a.buf], inner, f"reverse_compute_at {nest}",
                     span)
        for d, idx in enumerate(a.index):
            first, extent = box.offsets[d], box.extents[d]
            if not idx.terms and extent == 1 and first == Aff((), idx.const):
                continue  # a constant index of a dimension the region has one element of
            if len(idx.terms) != 1 or idx.terms[0].coef != 1 or idx.terms[0].var not in extents:
                raise _fail(f"reverse_compute_at {nest}, {at}: {fmt_access(a)} is not indexed by a plain loop of the "
                            f"consumer in dimension {d}", span, "compute at a consumer that reads its input plainly")
            var = idx.terms[0].var  # reads var + c: var runs from the region's first index - c
            first = Aff(first.terms, first.const - idx.const)
            if out.setdefault(var, (first, extent)) != (first, extent):
                raise _fail(f"reverse_compute_at {nest}, {at}: loop {var} reads two regions", span)
    moved = _restrict(consumer, out)
    body = tuple(s for s in k.body if s is not consumer)
    return _with_loop(replace(k, body=body), loop, lambda s: replace(s, body=s.body + (moved,)))


def _apart(a: Loop, b: Loop) -> bool:
    """Whether nests a and b touch disjoint elements wherever one of them writes (so their order may change): for
    every buffer one writes and the other accesses, the boxes their accesses cover over all their loops are apart in
    some dimension (a reduction's whole rows and its ragged last rows, cut apart)."""
    def boxes(n: Loop) -> tuple[dict[str, list[Access]], dict[str, list[Access]]]:
        ext = {s.var: s.extent for s in walk((n,)) if isinstance(s, Loop)}
        writes: dict[str, list] = {}
        reads: dict[str, list] = {}
        for s in _stores((n,)):
            writes.setdefault(s.dst.buf, []).append(_box(s.dst, ext))
            for r in loads(s.expr) + ([s.dst] if isinstance(s, Update) else []):
                reads.setdefault(r.buf, []).append(_box(r, ext))
        return writes, reads

    def meet(x: dict, y: dict) -> bool:
        return any(not any(hi1 < lo2 or hi2 < lo1 for (lo1, hi1), (lo2, hi2) in zip(p, q))
                   for buf in x.keys() & y.keys() for p in x[buf] for q in y[buf])

    (wa, ra), (wb, rb) = boxes(a), boxes(b)
    return not (meet(wa, wb) or meet(wa, rb) or meet(ra, wb))


def _box(a: Access, ext: dict[str, int]) -> list[tuple[int, int]]:
    """Per dimension, the lowest and highest index the access reaches over the loops `ext` (all of its loops)."""
    return [(_bound(i, ext, min), _bound(i, ext, max)) for i in a.index]


def _views_first(k: Kernel, consumer: Loop, producer: Loop | None) -> Kernel:
    """The HBM views declared just before the consumer moved before its producer nest (a view is a name for storage
    that exists anyway: the consumer may read it inside that nest)."""
    body = list(k.body)
    at = next(i for i, s in enumerate(body) if s is consumer) if any(s is consumer for s in body) else 0
    start = at
    while start > 0 and _is_view(body[start - 1]):
        start -= 1
    dest = next((i for i, s in enumerate(body[:start]) if s is producer), -1)
    if start == at or dest < 0:
        return k
    return replace(k, body=tuple(body[:dest] + body[start:at] + body[dest:start] + body[at:]))


def _is_view(s: Stmt) -> bool:
    return isinstance(s, Alloc) and bool(s.buf.view_of)


def _path(top: Loop, loop: Loop) -> list[Loop]:
    """The loops from `top` down to `loop`, both included."""
    if top is loop:
        return [top]
    for s in top.body:
        if isinstance(s, Loop) and (s is loop or any(x is loop for x in walk(s.body))):
            return [top] + _path(s, loop)
    return [top]


def bind_expr(k: Kernel, buf: str, at: str, name: str, target: Target | str | None = None,
              span: Span | None = None, suffix: str = "_x", dtype: str = "f32", merged: bool = False) -> Kernel:
    """Exo's bind_expr for a reduction: the perfect nest at loop `at` whose one statement updates `buf` with an
    expression becomes a nest computing the expression into a new on-chip buffer `name` (over the nest's
    loops, renamed V_x) and the same nest reducing that buffer (golden: primitives/bind_expr.txt):

        for i in serial(64):                        alloc T: sbuf f32[64, 12]
          for j in serial(12):                      for i_x in serial(64):
            s[i] += A[i, j] * B[i, j]                 for j_x in serial(12):
                                                        T[i_x, j_x] = A[i_x, j_x] * B[i_x, j_x]
                                                    for i in serial(64):
                                                      for j in serial(12):
                                                        s[i] += T[i, j]

    Legal when the nest is perfect with one update of `buf` whose value is not a plain read, the expression reads
    nothing the nest writes, and the buffer fits the target. `suffix` names the new loops (V_x; another suffix
    when a kernel binds several nests over loops of the same names: pairs of unrolled copies). `dtype` is the
    tile's (fp32 unless told: a column sum's terms keep the source's 16-bit dtype, which TensorE sums at its
    16-bit rate; golden: primitives/bind_expr_dtype.txt).

    `merged`: the nest's first two loops k, p (K and R) are the partitions of one tile, every read indexing them as
    `R*k + p` (o's stacked on the partitions, rules.colreduce): the expression is computed over one loop V_x of
    K*R partitions into a (K*R, ..) tile, and the reduction reads it at [R*k + p, ..] (golden:
    primitives/bind_expr_merged.txt)."""
    t = get_target(target)
    loop = find_loop(k, at, span)
    chain = [loop]
    while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], Loop):
        chain.append(chain[-1].body[0])
    body = chain[-1].body
    if len(body) != 1 or not isinstance(body[0], Update) or body[0].dst.buf != buf:
        raise _fail(f"bind_expr {buf} at {at}: the nest at {at} is not one update of {buf}", span,
                    "bind the expression of a reduction's innermost nest")
    upd = body[0]
    if isinstance(upd.expr, Load):
        raise _fail(f"bind_expr {buf} at {at}: the update reads {fmt_access(upd.expr.access)} already; there is no "
                    f"expression to compute first", span)
    if any(a.buf == buf for a in loads(upd.expr)):
        raise _fail(f"bind_expr {buf} at {at}: the expression reads {buf}, which the nest updates", span)
    taken = {s.var for s in walk(k.body) if isinstance(s, Loop)}
    if name in k.buffers() or any(f"{lp.var}{suffix}" in taken for lp in chain):
        raise _fail(f"bind_expr {buf} at {at}: the name {name} or a loop V{suffix} is taken", span)
    if dtype not in ("f32", "bf16", "f16"):
        raise _fail(f"bind_expr {buf} at {at}: the tile's dtype {dtype} is not an on-chip dtype", span,
                    "give dtype=f32, bf16 or f16")
    if merged:
        return _bind_merged(k, loop, chain, upd, name, suffix, dtype, t, span)
    shape = tuple(lp.extent for lp in chain)
    _check_fits(shape, dtype, t, f"bind_expr {buf} at {at}", span)
    tile = Buffer(name, "sbuf", dtype, shape)
    expr: Expr = upd.expr
    for lp in chain:
        expr = _subst_expr(expr, lp.var, Aff((Term(f"{lp.var}{suffix}"),)))
    compute: Stmt = Assign(Access(name, tuple(Aff((Term(f"{lp.var}{suffix}"),)) for lp in chain)), expr, upd.line)
    reduce: Stmt = replace(upd, expr=Load(Access(name, tuple(Aff((Term(lp.var),)) for lp in chain))))
    for lp in reversed(chain):
        compute = replace(lp, var=f"{lp.var}{suffix}", body=(compute,))
        reduce = replace(lp, body=(reduce,))
    return _with_bound(k, loop, Alloc(tile, upd.line), compute, reduce)


def _bind_merged(k: Kernel, loop: Loop, chain: list[Loop], upd: Update, name: str, suffix: str, dtype: str,
                 t: Target, span: Span | None) -> Kernel:
    """bind_expr(.., merged=True): see bind_expr."""
    where = f"bind_expr {upd.dst.buf} at {loop.var}"
    if len(chain) < 2:
        raise _fail(f"{where}, merged: the nest has one loop; merged takes its first two (k, p) as the partitions",
                    span)
    kv, pv = chain[0].var, chain[1].var
    K, R = chain[0].extent, chain[1].extent
    one = f"{kv}{suffix}"

    def merge(a: Access) -> Access:
        hits = [n for n, i in enumerate(a.index) if any(x.var in (kv, pv) for x in i.terms)]
        i = a.index[hits[0]] if len(hits) == 1 else None
        coefs = {x.var: x.coef for x in i.terms if x.var in (kv, pv)} if i is not None else {}
        if i is None or coefs != {kv: R, pv: 1} or len([x for x in i.terms if x.var in (kv, pv)]) != 2:
            raise _fail(f"{where}, merged: {fmt_access(a)} does not read the partitions as {R}*{kv} + {pv}", span,
                        f"merge the dims of the view first (merge_dims), so the read is [{R}*{kv} + {pv}, ..]")
        rest = tuple(x for x in i.terms if x.var not in (kv, pv))
        return replace(a, index=a.index[:hits[0]] + (Aff((Term(one),) + rest, i.const),) + a.index[hits[0] + 1:])
    expr = map_loads(upd.expr, merge)
    for lp in chain[2:]:
        expr = _subst_expr(expr, lp.var, Aff((Term(f"{lp.var}{suffix}"),)))
    shape = (K * R,) + tuple(lp.extent for lp in chain[2:])
    _check_fits(shape, dtype, t, where, span)
    tile = Buffer(name, "sbuf", dtype, shape)
    compute: Stmt = Assign(Access(name, (Aff((Term(one),)),) + tuple(Aff((Term(f"{lp.var}{suffix}"),))
                                                                    for lp in chain[2:])), expr, upd.line)
    rows = Aff((Term(kv, R), Term(pv)))
    reduce: Stmt = replace(upd, expr=Load(Access(name, (rows,) + tuple(Aff((Term(lp.var),)) for lp in chain[2:]))))
    for lp in reversed(chain[2:]):
        compute = replace(lp, var=f"{lp.var}{suffix}", body=(compute,))
    compute = replace(chain[0], var=one, extent=K * R, body=(compute,))
    for lp in reversed(chain):
        reduce = replace(lp, body=(reduce,))
    return _with_bound(k, loop, Alloc(tile, upd.line), compute, reduce)


def _with_bound(k: Kernel, loop: Loop, alloc: Alloc, compute: Stmt, reduce: Stmt) -> Kernel:
    """The kernel with the nest at `loop` replaced by the tile's allocation, its computing nest and the reduction."""

    def visit(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        for s in body:
            if s is loop:
                out += [alloc, compute, reduce]
            else:
                out.append(replace(s, body=visit(s.body)) if isinstance(s, Loop) else s)
        return tuple(out)
    return replace(k, body=visit(k.body))
