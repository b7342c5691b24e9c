"""Issue 10's programs (the scheduling core's proof set) at 4096-class sizes: how far the default schedule is from
the floor.

    python benchmarks/core.py                 # every program
    python benchmarks/core.py softmax         # some programs
    python benchmarks/core.py --tiny          # small sizes (seconds: a check that every row runs)

The programs are benchmarks/core/*.tl: softmax, layernorm and rmsnorm written as several statements, an element-wise
op whose broadcast operands carry constants, a batched transpose, a column sum and max, a mean and a min over a
middle axis, an NCHW -> NHWC permute and sums of squares and of squared differences (one statement each), at
4096 x 4096 elements (16 Mi) and, for some, at other realistic shapes (long rows, a short middle axis).
The columns are those of benchmarks/families.py (whose floor and model functions this reuses):
floor = max(TensorE FLOP floor, DMA byte floor) without start-up, run = the model's latency without its start-up,
ratio = run / floor (issue 10's goal: <= 1.5 for each row). Model estimates, never measurements.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from families import Family, Row, row_at, table  # noqa: E402
from tilec.target import target as get_target  # noqa: E402

FOLDER = ROOT / "benchmarks" / "core"
ROW_TINY, LONG = dict(M=8, N=24), dict(M=1024, N=16384)
ROWS = (dict(M=2048, N=8192), dict(M=1024, N=16384), dict(M=512, N=32768))  # hidden sizes LLMs run (16 Mi each)
NORMS = (("softmax", "softmax over rows (4 statements)"), ("layernorm", "layernorm (5 statements)"),
         ("rmsnorm", "rmsnorm (3 statements)"))


def _rows() -> tuple[tuple[Family, dict[str, int]], ...]:
    """Each row chain at 4096 x 4096 and at long rows (8192, 16384, 32768), in f32 and in bf16."""
    out: list[tuple[Family, dict[str, int]]] = []
    for name, what in NORMS:
        for dtype, suffix in (("f32", ""), ("bf16", "_bf16")):
            out.append((Family(f"{name}{suffix}.tl", f"{what}, {dtype}", ROW_TINY), {}))
            out += [(Family(f"{name}{suffix}.tl", f"{name}, rows of {sizes['N']}, {dtype}", ROW_TINY), sizes)
                    for sizes in ROWS]
    return tuple(out)


PROGRAMS: tuple[tuple[Family, dict[str, int]], ...] = _rows() + (  # (program, sizes other than its default line's)
    (Family("broadcast.tl", "2*X[i, j] + b[j] - 0.5*c[i]", ROW_TINY), {}),
    (Family("broadcast.tl", "the same, rows of 16384", ROW_TINY), LONG),
    (Family("batched_transpose.tl", "batched transpose", dict(B=2, M=8, N=12)), {}),
    (Family("column_sum.tl", "column sum", ROW_TINY), {}),
    (Family("column_max.tl", "column max", ROW_TINY), {}),
    (Family("column_max_bf16.tl", "column max, bf16", ROW_TINY), {}),
    (Family("middle_mean.tl", "mean over a middle axis", dict(A=2, B=8, C=24)), {}),
    (Family("middle_min.tl", "min over a middle axis from Y0", dict(A=2, B=8, C=24)), {}),
    (Family("middle_mean.tl", "the same, 64 x 64 x 4096", dict(A=2, B=8, C=24)), dict(A=64, B=64, C=4096)),
    (Family("nchw_to_nhwc.tl", "permute NCHW -> NHWC", dict(N=1, C=8, H=3, W=5)), {}),
) + tuple((Family(f"{name}{suffix}.tl", f"{what}, {dtype}", ROW_TINY), {})  # one statement each
          for name, what in (("row_ssd", "sum of (A - B)^2 over rows"), ("column_ssd", "sum of (A - B)^2 over columns"),
                             ("column_sumsq", "sum of A^2 over columns"))
          for dtype, suffix in (("f32", ""), ("bf16", "_bf16")))


def measure(program: Family, sizes: dict[str, int], tiny: bool, tgt) -> Row:
    return row_at(program, 1, FOLDER / program.program, dict(program.tiny) if tiny else sizes, tgt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("programs", nargs="*", help="program names (default: all), e.g. softmax")
    parser.add_argument("--tiny", action="store_true", help="small sizes, for a quick check that every row runs")
    parser.add_argument("--target", default="trn2", help="the modelled NeuronCore (tilec.target.TARGETS)")
    args = parser.parse_args(argv)
    names = [p.program[:-3] for p, _ in PROGRAMS]
    unknown = set(args.programs) - set(names)
    if unknown:
        parser.error(f"unknown programs {sorted(unknown)}; known: {', '.join(names)}")
    tgt = get_target(args.target)
    start = time.time()
    rows = [measure(p, sizes, args.tiny, tgt) for p, sizes in PROGRAMS
            if not args.programs or p.program[:-3] in args.programs]
    tiny = ", tiny sizes" if args.tiny else ""
    print(f"issue-10 programs on the {tgt.name} model{tiny} ({time.time() - start:.0f} s)")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
