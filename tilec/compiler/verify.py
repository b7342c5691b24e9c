"""The IR verifier, run after every pass: a broken invariant is a compiler bug (InternalError), never the user's.

Checks: every index variable is bound by an enclosing loop; every buffer is defined before use and in scope, and
no two different buffers share a name; every index stays inside its buffer; on-chip tiles have <= 128 partitions;
matmul stationary <= 128x128, moving free size <= 512, the accumulator fits one 2 KiB PSUM bank; DMAs never touch
PSUM; only the HBM side of a DMA is permuted (by an order of its sliced axes); <= 8 PSUM banks live; SBUF bytes per
partition within the compiler's budget; a PSUM accumulator's first matmul (NKI 0.6: accumulate=False) covers what
the later matmuls of its chain add to, where their views are static; every trip count and dimension printed by name
reads declared constants and evaluates to its number.
All limits come from the Target (tilec/target.py) the kernel is compiled for.

PSUM tiles over one bank (fid12): both NKI versions forbid them on NeuronCore-v2/v3. NKI 0.1 (v2.26.1):
programming_model.rst TC#2 ("For tiles in PSUM, the F dimension size must not exceed nki.tile_size.psum_fmax ==
512"), nki_direct_allocation_guide.rst "Known Limitations" 3 ("A PSUM tile cannot cross bank boundaries"),
nki.compiler.psum.alloc ("a physical PSUM tile cannot span multiple PSUM banks"). NKI 0.6 (v2.32.0):
get-started/about/tiling-overview.rst TC#2 (psum_bank_fmax == 512, "per PSUM bank per partition, in FP32
elements", nki.language tile_size), migration/index.rst ("The allocation for PSUM tensors must start at the
beginning of each bank"; its example is a (128, 1024) bf16 tile: 2 KiB, one bank). A matmul's output fits one bank
(ISA6 nc_matmul "Tile size": moving <= 512 on NC-v2/-v3, "matching the maximum number of float32 elements per PSUM
bank"; only NC-v4 writes up to 8 banks). An engine instruction may stream up to 4K elements per partition from PSUM
(trainium_inferentia2_arch.rst, Vector/Scalar Engine), i.e. across banks, but its operand is one tile, so NKI
cannot express that on trn1/trn2: the limit is the tile's bytes (a 1024-column bf16 tile is one bank, legal).
"""
from __future__ import annotations

from tilec.compiler.ir import (Act, Aff, Alloc, Binary, Block, Buf, Copy, Dma, Identity, Kernel, Loop, Matmul, Reduce,
                               Reshape, Scalar, Sl, Stmt, Transpose, View, views, walk, window_axes,
                               window_shape)
from tilec.compiler.build_util import printed_sizes
from tilec.compiler.named import evaluate
from tilec.compiler.schedule import sbuf_budget
from tilec.errors import InternalError
from tilec.target import Target, target as get_target


def verify(k: Kernel, stage: str, target: Target | None = None) -> None:
    _Verifier(k, stage, get_target(target)).run()


class _Verifier:
    def __init__(self, k: Kernel, stage: str, target: Target) -> None:
        self.k, self.stage, self.t = k, stage, target

    def fail(self, msg: str) -> None:
        raise InternalError(f"IR verifier after `{self.stage}`: {msg}")

    def run(self) -> None:
        self.consts = dict(self.k.consts)
        scope = {b.name: b for b in (*self.k.params, *self.k.outputs)}
        self.named = dict(scope)  # every buffer name of the kernel: one name, one buffer (names.py)
        self.body(self.k.body, {}, scope, 0, 0)
        self.chain_starts()
        self.named_sizes()

    def define(self, b: Buf) -> None:
        if self.named.setdefault(b.name, b) != b:
            self.fail(f"two different buffers are named {b.name}: {self.named[b.name]} and {b}")

    def body(self, stmts: tuple[Stmt, ...], loops: dict[str, int], scope: dict[str, Buf], sbuf: int, psum: int
             ) -> None:
        scope = dict(scope)
        flat = list(_inline(stmts))
        last = _last_uses(flat)
        live_psum: set[str] = set()  # PSUM tiles allocated here and still used later in this body
        for i, s in enumerate(flat):
            if isinstance(s, Loop):
                if s.var in loops:
                    self.fail(f"loop variable {s.var} shadows an enclosing loop")
                if s.extent < 1:
                    self.fail(f"loop {s.var} has extent {s.extent}")
                self.body(s.body, {**loops, s.var: s.extent}, scope, sbuf, psum)
            elif isinstance(s, Alloc):
                rebound = scope.get(s.buf.name)
                if rebound is not None and (rebound.memory != "psum" or s.buf.name in live_psum):
                    # the name is rebound: the tile it named is unreachable from here on
                    sbuf, psum = self.release(rebound, sbuf, psum)
                    live_psum.discard(s.buf.name)
                sbuf, psum = self.alloc(s.buf, sbuf, psum)
                self.define(s.buf)
                scope[s.buf.name] = s.buf
                if s.buf.memory == "psum":
                    live_psum.add(s.buf.name)
            elif isinstance(s, Reshape):
                self.reshape(s, scope)
                self.define(s.buf)
                scope[s.buf.name] = s.buf
            else:
                self.op(s, loops, scope)
            for name in [n for n in live_psum if last.get(n, -1) <= i]:  # a PSUM tile dies at its last use, as
                live_psum.discard(name)  # the NKI allocator (and the interpreter's capacity check) free it
                sbuf, psum = self.release(scope[name], sbuf, psum)

    def release(self, b: Buf, sbuf: int, psum: int) -> tuple[int, int]:
        if b.memory == "psum":
            return sbuf, psum - 1
        return (sbuf - b.bytes_per_partition(), psum) if b.memory == "sbuf" else (sbuf, psum)

    def alloc(self, b: Buf, sbuf: int, psum: int) -> tuple[int, int]:
        if b.memory == "hbm":
            return sbuf, psum
        t = self.t
        if b.shape[0] > t.pmax:
            self.fail(f"{b.name} has {b.shape[0]} partitions (> {t.pmax})")
        if len(b.shape) < 2:
            self.fail(f"on-chip tile {b.name} needs at least 2 dimensions")
        size = b.bytes_per_partition()
        if b.memory == "psum":
            if size > t.psum_bank_bytes:
                self.fail(f"PSUM tile {b.name} is {size} bytes per partition (> one {t.psum_bank_bytes}-byte bank: a "
                          "PSUM tile cannot cross bank boundaries, see the module docstring)")
            psum += 1
            if psum > t.psum_banks:
                self.fail(f"{psum} PSUM tiles live at {b.name} (> {t.psum_banks} banks)")
            return sbuf, psum
        sbuf += size
        if sbuf > sbuf_budget(t):
            self.fail(f"SBUF use reaches {sbuf} bytes per partition at {b.name} (> {sbuf_budget(t)})")
        return sbuf, psum

    def reshape(self, s: Reshape, scope: dict[str, Buf]) -> None:
        if s.base.name not in scope:
            self.fail(f"reshape of unknown buffer {s.base.name}")
        n = m = 1
        for d in s.base.shape:
            n *= d
        for d in s.buf.shape:
            m *= d
        if n != m:
            self.fail(f"reshape {s.base.name} {s.base.shape} -> {s.buf.shape} changes the element count")

    def op(self, s: Stmt, loops: dict[str, int], scope: dict[str, Buf]) -> None:
        operands = views(s)
        for v in operands:
            self.view(v, loops, scope)
            if (v.perm or v.blocks) and not (isinstance(s, Dma) and v.buf.memory == "hbm"):
                self.fail(f"{type(s).__name__} operand {v.buf.name} ({v.buf.memory}) is permuted or blocked: only "
                          "the HBM side of a DMA may be")
        if isinstance(s, Dma):
            if "psum" in (s.dst.buf.memory, s.src.buf.memory):
                self.fail("a DMA touches PSUM")
            if _count(s.dst) != _count(s.src):
                self.fail(f"DMA {s.dst.buf.name} <- {s.src.buf.name} moves {_count(s.src)} elements into "
                          f"{_count(s.dst)}")
        elif isinstance(s, Matmul):
            self.matmul(s)
        elif isinstance(s, Transpose):
            tp, shp = self.t.instr("nc_transpose"), s.src.shape()
            if s.engine == "pe" and (s.dst.buf.memory not in tp.writes or len(shp) != 2
                                     or shp[0] > tp.limit("p") or shp[1] > tp.limit("f")):
                self.fail(f"PE transpose {s.src.buf.name} {shp} must be <= {tp.limit('p')}x{tp.limit('f')} into "
                          f"{'/'.join(tp.writes)}")
        elif isinstance(s, (Copy, Act, Binary, Scalar, Reduce)):
            self.elementwise(s, operands)
        elif isinstance(s, Identity):
            shp = s.dst.shape()
            if s.dst.buf.memory != "sbuf" or len(shp) != 2 or shp[0] != shp[1] or shp[0] > self.t.pmax:
                self.fail(f"identity {s.dst.buf.name} {shp} must be a square SBUF tile of at most {self.t.pmax} "
                          "partitions (affine_select writes SBUF only)")
        if isinstance(s, Reduce) and s.op in ("bn_stats", "bn_aggr"):
            self.stats(s)
        elif isinstance(s, Reduce) and s.window:
            self.window_reduce(s)
        elif isinstance(s, Reduce) and not (len(s.src.shape()) == 2 and s.dst.shape() == (s.src.shape()[0], 1)
                                          or len(s.src.shape()) == 3 and s.dst.shape() == s.src.shape()[:2]):
            self.fail(f"tensor_reduce {s.src.buf.name} {s.src.shape()} -> {s.dst.buf.name} {s.dst.shape()} must "
                      f"fold a 2-D tile into a (P, 1) column, or the last axis of a (P, G, F) tile into (P, G)")

    def window_reduce(self, s: Reduce) -> None:
        """A window Reduce (ir.window_shape): src's last axis a whole number of windows long, dst its shape with
        the windows' axis folded, an add/max/min, at most the target's free dimensions in the access pattern."""
        shape = window_shape(s.src, s.window)
        if not shape or s.op not in ("add", "maximum", "minimum"):
            self.fail(f"window reduce.{s.op} {s.window} of {s.src.buf.name} {s.src.shape()}: the last axis must be "
                      "(o - 1) * step + taps long and the op add, maximum or minimum")
        elif window_axes(s.src, s.window, s.dst.shape()) is None or s.dst.shape()[0] != shape[0]:
            self.fail(f"window reduce of {s.src.buf.name} {shape} writes {s.dst.buf.name} {s.dst.shape()}, not "
                      f"{shape[:-1]}")
        elif len(shape) - 1 > self.t.ap_free_dims:
            self.fail(f"window reduce of {s.src.buf.name} reads {len(shape) - 1} free dimensions, more than an "
                      f"access pattern's {self.t.ap_free_dims}")

    def stats(self, s: Reduce) -> None:
        """bn_stats: a (P, <= bn_stats_fmax) tile into the 6 values (P, 6) of its statistics; bn_aggr: (P, 3k)
        triples into (P, 2), the mean and the variance; both on VectorE, fp32 results [NISA bn_stats, bn_aggr]."""
        ins = self.t.instr(s.op)
        src, dst = s.src.shape(), s.dst.shape()
        if s.dst.buf.memory not in ins.writes or s.src.buf.memory not in ins.reads or len(src) != 2 or len(dst) != 2:
            self.fail(f"{s.op} reads a 2-D {'/'.join(ins.reads)} tile into a 2-D {'/'.join(ins.writes)} tile")
        elif s.op == "bn_stats" and (src[1] > ins.limit("f") or dst[1] != 6):
            self.fail(f"bn_stats of {s.src.buf.name} {src} must read at most {ins.limit('f')} elements per "
                      f"partition into 6 ({s.dst.buf.name} {dst})")
        elif s.op == "bn_aggr" and (src[1] % 3 or dst[1] != 2):
            self.fail(f"bn_aggr of {s.src.buf.name} {src} must read (count, mean, variance * count) triples into "
                      f"(mean, variance) ({s.dst.buf.name} {dst})")
        elif s.dst.buf.dtype != "f32":
            self.fail(f"{s.op} writes fp32 statistics, not {s.dst.buf.dtype} ({s.dst.buf.name})")

    def chain_starts(self) -> None:
        """The first matmul into a PSUM allocation overwrites (accumulate=False: NKI 0.6, and zeroed PSUM accumulated
        onto is undefined on NeuronCore-v2/v3); a later matmul of the chain adding outside its region would add onto
        uninitialised PSUM. Checked for views without loop variables (a region placed by a loop starts afresh). A
        matmul whose region is disjoint from every region started before starts one of its own (codegen06 makes it
        overwrite: two sums in one PSUM tile). A matmul marked `start` overwrites its region whatever the tile held
        (a PSUM tile reused for a new sum); only such a matmul may begin a sum in a tile allocated without zeros
        (NKI 0.1 accumulates `+=` onto what the tile holds: zeros from nl.zeros, or garbage)."""
        first: dict[str, list[tuple[tuple[int, int], ...] | None]] = {}
        zeroed: dict[str, bool] = {}
        for s in walk(self.k.body):
            if isinstance(s, Alloc) and s.buf.memory == "psum":
                first.pop(s.buf.name, None)  # a new allocation starts a new chain
                zeroed[s.buf.name] = s.zero
            elif isinstance(s, Matmul):
                box = static_box(s.acc)
                name = s.acc.buf.name
                starts = first.setdefault(name, [])
                if s.start:
                    starts.append(box)
                    continue
                if not starts or box is not None and all(b is not None and disjoint(box, b) for b in starts):
                    if not zeroed.get(name, True):
                        self.fail(f"a matmul begins a sum in {name}, allocated without zeros: it must start it "
                                  "(overwrite: ir.Matmul.start)")
                    starts.append(box)
                    continue
                if box is not None and all(b is not None and not _inside(box, b) for b in starts):
                    self.fail(f"a matmul adds to {name}{list(box)} outside the regions its chain's first matmuls "
                              f"overwrite {[list(b) for b in starts if b is not None]}: uninitialised PSUM")

    def matmul(self, s: Matmul) -> None:
        mm = self.t.instr("nc_matmul")  # acc[m, n] += stat[k, m] * mov[k, n]
        st, mv, acc = s.stationary.shape(), s.moving.shape(), s.acc.shape()
        if (s.acc.buf.memory not in mm.writes or s.stationary.buf.memory not in mm.reads
                or s.moving.buf.memory not in mm.reads):
            self.fail(f"matmul reads {'/'.join(mm.reads)} and accumulates into {'/'.join(mm.writes)}")
        if len(st) != 2 or st[0] > mm.limit("k") or st[1] > mm.limit("m"):
            self.fail(f"matmul stationary {st} exceeds {mm.limit('k')}x{mm.limit('m')}")
        free = _prod(mv[1:])
        if mv[0] != st[0] or free > mm.limit("n"):
            self.fail(f"matmul moving {mv} does not match stationary {st} or exceeds {mm.limit('n')} free elements")
        if acc[0] != st[1] or _prod(acc[1:]) != free:
            self.fail(f"matmul accumulator {acc} does not hold stationary {st} x moving {mv}")

    def elementwise(self, s: Stmt, views: list[View]) -> None:
        shapes = {v.shape()[0] for v in views}
        if len(shapes) != 1:
            self.fail(f"{type(s).__name__} operands have different partition counts {sorted(shapes)}")
        if any(v.buf.memory == "hbm" for v in views):
            self.fail(f"{type(s).__name__} reads or writes HBM")
        if isinstance(s, Binary) and s.a.buf.memory == "psum" and s.b.buf.memory == "psum":
            self.fail("tensor_tensor with two PSUM operands")
        if isinstance(s, Binary) and s.scale0 != 1.0 and s.engine:
            self.fail("scalar_tensor_tensor (a tensor_tensor with a scaled operand) runs on VectorE only")
        if isinstance(s, (Copy, Binary, Scalar)) and s.engine:
            self.engine(s, views)
        narrow = [v for v in ((s.value, s.value1) if isinstance(s, Scalar) else (s.scale,) if isinstance(s, Act)
                              else ()) if isinstance(v, View) and v.buf.dtype != "f32"]
        if narrow:  # (passes.fp32_operands copies them)
            self.fail(f"{type(s).__name__} reads {narrow[0].buf.name} ({narrow[0].buf.dtype}) as its per-partition "
                      "operand, which must be float32")

    def engine(self, s: "Copy | Binary | Scalar", views: list[View]) -> None:
        """An instruction put on a named engine: one its engine= accepts on this target, with an ALU op that engine
        runs, and operands that engine can reach (GpSimdE: SBUF only)."""
        name = {Copy: "tensor_copy", Binary: "tensor_tensor", Scalar: "tensor_scalar"}[type(s)]
        ins = self.t.instr(name)
        if s.engine not in ins.engines:
            self.fail(f"{name} on the {s.engine} engine; {self.t.name} runs it on {', '.join(ins.engines)}")
        ops = ins.ops_on(s.engine)
        if ops is not None and not isinstance(s, Copy) and s.op not in ops:
            self.fail(f"{name} {s.op} on the {s.engine} engine, which runs only {', '.join(ops)}")
        if s.engine == "gpsimd" and any(v.buf.memory == "psum" for v in views):
            self.fail(f"{name} on the gpsimd engine touches PSUM")

    def view(self, v: View, loops: dict[str, int], scope: dict[str, Buf]) -> None:
        if v.buf.name not in scope or scope[v.buf.name] != v.buf:
            self.fail(f"buffer {v.buf.name} used out of scope")
        if len(v.idx) != len(v.buf.shape):
            self.fail(f"{v.buf.name} indexed with {len(v.idx)} indices, has {len(v.buf.shape)} dims")
        slices = sum(isinstance(i, Sl) for i in v.idx)
        if v.perm and sorted(v.perm) != list(range(slices)):
            self.fail(f"{v.buf.name} permuted by {v.perm}, not an order of its {slices} sliced axes")
        reach = {axis: 0 for axis, _, _ in v.blocks}  # how far the blocks shift the region along each axis
        for axis, count, step in v.blocks:
            if not 0 <= axis < len(v.idx) or count < 1 or step < 1:
                self.fail(f"{v.buf.name} blocks ({axis}, {count}, {step}): not an axis, or an empty or backward block")
            reach[axis] += (count - 1) * step
        for dim, (i, n) in enumerate(zip(v.idx, v.buf.shape)):
            start = i.start if isinstance(i, Sl) else i
            self.names(start, i)
            lo, hi = self.range(start, loops)
            last = hi + ((i.size - 1) * i.step if isinstance(i, Sl) else 0) + reach.get(dim, 0)
            if lo < 0 or last >= n:
                self.fail(f"{v.buf.name} dim {dim} index range [{lo}, {last}] outside [0, {n})")

    def names(self, start: Aff, i) -> None:
        """A named constant in an index must exist and stand for the value it replaces."""
        named = [(t.name, t.coef) for t in start.terms if t.name]
        if isinstance(i, Sl) and i.name:
            named.append((i.name, i.size))
        for name, value in named:
            if self.consts.get(name) != value:
                self.fail(f"index uses constant {name} = {value}, the kernel defines {self.consts.get(name)}")

    def named_sizes(self) -> None:
        """A trip count or dimension printed by name (named.py) must read declared constants only and evaluate to
        its number: codegen prints the name, the model and the interpreter use the number."""
        for x in printed_sizes(self.k.body):
            try:
                value = evaluate(x.text, self.consts)
            except (KeyError, ValueError, SyntaxError, ZeroDivisionError) as err:
                self.fail(f"size {x} is printed as `{x.text}`, which the kernel's constants do not define ({err!r})")
            if value != x:
                self.fail(f"size {x} is printed as `{x.text}`, which is {value} with the kernel's constants")

    def range(self, x: Aff, loops: dict[str, int]) -> tuple[int, int]:
        lo = hi = x.const
        for t in x.terms:
            if t.var not in loops:
                self.fail(f"index variable {t.var} is not bound by an enclosing loop")
            span = t.coef * (loops[t.var] - 1)
            lo, hi = lo + min(0, span), hi + max(0, span)
        return lo, hi


def disjoint(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    """Whether two boxes ([lo, hi) per dimension) share no element."""
    return any(hi <= b_lo or b_hi <= lo for (lo, hi), (b_lo, b_hi) in zip(a, b))


def _inside(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    return all(b_lo <= lo and hi <= b_hi for (lo, hi), (b_lo, b_hi) in zip(a, b))


def static_box(v: View) -> tuple[tuple[int, int], ...] | None:
    """[lo, hi) per dimension of a view whose indices use no loop variable (None otherwise)."""
    box = []
    for i in v.idx:
        start = i.start if isinstance(i, Sl) else i
        if start.terms:
            return None
        size = (i.size - 1) * i.step + 1 if isinstance(i, Sl) else 1
        box.append((start.const, start.const + size))
    return tuple(box)


def _last_uses(flat: list[Stmt]) -> dict[str, int]:
    """Each buffer's index of the last statement of `flat` that reads or writes it (nested ones count as their
    enclosing loop)."""
    last: dict[str, int] = {}
    for i, s in enumerate(flat):
        for x in walk((s,)):
            for v in views(x):
                last[v.buf.name] = i
    return last


def _inline(stmts: tuple[Stmt, ...]):
    """Blocks only group statements for reading; they are not scopes (loops are)."""
    for s in stmts:
        if isinstance(s, Block):
            yield from _inline(s.body)
        else:
            yield s


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _count(v: View) -> int:
    return _prod(v.shape())


def memory_summary(k: Kernel) -> list[tuple[str, str, str, int]]:
    """(buffer, memory, shape, bytes per partition) for every on-chip buffer, in program order."""
    seen, out = set(), []
    for s in walk(k.body):
        if isinstance(s, Alloc) and s.buf.name not in seen:
            seen.add(s.buf.name)
            size = s.buf.bytes_per_partition() if s.buf.memory != "hbm" else 0
            out.append((s.buf.name, s.buf.memory, f"{s.buf.dtype}{list(s.buf.shape)}", size))
    return out
