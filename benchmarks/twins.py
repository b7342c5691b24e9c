"""Forms the compiler refused until session 9 beside their plain twins: model latency of each default schedule.

    python benchmarks/twins.py            # f32 and bf16
    python benchmarks/twins.py --dtype bf16

Each row pairs such a program (a negated contraction, relu of the stationary operand, also contraction-major, a
constant factor on a contraction with a column or a row bias, torch's depthwise weights [C*M, 1, 3, 3], a broadcast
column alone) with its plain twin (same sizes, the sign, the relu, the factor or the unit index replaced by the
ordinary form; a column's twin is a constant fill of the same output: both only store): the new form should cost
about what the twin costs (the sign or factor on the eviction is free, but a row bias after a factor takes a ScalarE
eviction before its VectorE add; the stationary's relu runs on the regions each load writes or in the transposes'
evictions; a column alone is one activation per tile after the (P, 1) column; a one-element column, `c[m]` with
M = 1, is copied to every partition once and the output flattened onto the partitions; a reversed read, gaps14,
costs its twin's DMAs: rows reversed by the load, columns read backwards by the engine, a summed loop turned
around; a reduction's reversed kept loop reverses its result, a copy of N elements). µs from tilec's performance
model (never measured).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from families import model_us  # noqa: E402
from tilec.target import target as get_target  # noqa: E402

MATMUL = """\
kernel mm(A: f32[M, K], B: f32[K, N], b: f32[M]) -> Y
  default M = 512, K = 1024, N = 512
  C: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = b[i]
    for k in 0..K:
      C[i, j] += {update}
  for i in 0..M, j in 0..N:
    Y[i, j] = relu(C[i, j])
"""
MATMUL_T = """\
kernel mt(A: f32[K, M], B: f32[K, N], b: f32[M]) -> Y
  default M = 512, K = 1024, N = 512
  C: f32[M, N]
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = b[i]
    for k in 0..K:
      C[i, j] += {update}
  for i in 0..M, j in 0..N:
    Y[i, j] = relu(C[i, j])
"""
ROW_BIAS = """\
kernel mr(A: f32[M, K], B: f32[K, N], b: f32[N]) -> C
  default M = 512, K = 1024, N = 512
  C: f32[M, N]
  for i in 0..M, j in 0..N:
    C[i, j] = b[j]
    for k in 0..K:
      C[i, j] += {update}
"""
DW_MULT = """\
kernel dm(X: f32[N, C, H, W], Wt: f32[{wshape}]) -> Y
  default N = 1, C = 64, M = 2, H = 58, W = 58
  Y: f32[N, C * M, H - 2, W - 2]
  for n in 0..N, c in 0..C, m in 0..M, y in 0..H - 2, x in 0..W - 2:
    Y[n, c*M + m, y, x] = 0
    for r in 0..3, s in 0..3:
      Y[n, c*M + m, y, x] += X[n, c, y + r, x + s] * Wt[{widx}]
"""
COLUMN = """\
kernel col(A: f32[M, N], c: f32[M]) -> Y
  default M = 1024, N = 2048
  Y: f32[M, N]
  for i in 0..M, j in 0..N:
    Y[i, j] = {expr}
"""
UNIT = """\
kernel col(A: f32[N, M, P], c: f32[M]) -> Y
  default N = 4096, M = 1, P = 64
  Y: f32[N, M, P]
  for n in 0..N, m in 0..M, p in 0..P:
    Y[n, m, p] = {expr}
"""
FLIP = """\
kernel flip(A: f32[N, M], B: f32[N, M]) -> Y
  default N = 2048, M = 1024
  Y: f32[N, M]
  for i in 0..N, j in 0..M:
    Y[i, j] = {expr}
"""
ROWSUM = """\
kernel rs(A: f32[N, M]) -> s
  default N = 2048, M = 1024
  s: f32[N]
  for i in 0..N:
    s[i] = 0
    for j in 0..M:
      s[i] += {read}
"""
PAIRS = (
    ("relu(b - A.B) (negated product)", MATMUL.format(update="-(A[i, k] * B[k, j])"),
     MATMUL.format(update="A[i, k] * B[k, j]")),
    ("relu(A) . B (stationary relu)", MATMUL.format(update="relu(A[i, k]) * B[k, j]"),
     MATMUL.format(update="A[i, k] * B[k, j]")),
    ("relu(A[k, i]) . B (contraction-major)", MATMUL_T.format(update="relu(A[k, i]) * B[k, j]"),
     MATMUL_T.format(update="A[k, i] * B[k, j]")),
    ("0.5 * A.B + b[i] (constant factor)", MATMUL.format(update="0.5 * A[i, k] * B[k, j]"),
     MATMUL.format(update="A[i, k] * B[k, j]")),
    ("A.B * 2 + b[j] (factor, row bias)", ROW_BIAS.format(update="A[i, k] * B[k, j] * 2"),
     ROW_BIAS.format(update="A[i, k] * B[k, j]")),
    ("depthwise x2, W[C*M, 1, 3, 3] (torch)", DW_MULT.format(wshape="C * M, 1, 3, 3", widx="c*M + m, 0, r, s"),
     DW_MULT.format(wshape="C * M, 3, 3", widx="c*M + m, r, s")),
    ("Y = 2 * c[i] + 1 (column alone)", COLUMN.format(expr="2 * c[i] + 1"), COLUMN.format(expr="2.5")),
    ("Y = c[i] (column alone)", COLUMN.format(expr="c[i]"), COLUMN.format(expr="2.5")),
    ("2*c[m] + 1, M = 1 (1-element column)", UNIT.format(expr="2 * c[m] + 1"), UNIT.format(expr="2.5")),
    ("A[N-1-i, j] + B (flip rows, gaps14)", FLIP.format(expr="A[N - 1 - i, j] + B[i, j]"),
     FLIP.format(expr="A[i, j] + B[i, j]")),
    ("A[i, M-1-j] + B (flip columns)", FLIP.format(expr="A[i, M - 1 - j] + B[i, j]"),
     FLIP.format(expr="A[i, j] + B[i, j]")),
    ("s[i] += A[i, M-1-j] (summed flip)", ROWSUM.format(read="A[i, M - 1 - j]"), ROWSUM.format(read="A[i, j]")),
    ("s[i] += A[N-1-i, j] (result reversed)", ROWSUM.format(read="A[N - 1 - i, j]"), ROWSUM.format(read="A[i, j]")),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=("f32", "bf16"), action="append")
    args = ap.parse_args()
    tgt = get_target(None)
    print(f"{'form':38} {'dtype':5} {'new µs':>9} {'twin µs':>9} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtype or ["f32", "bf16"]:
            for what, new, twin in PAIRS:
                got = []
                for i, text in enumerate((new, twin)):
                    path = pathlib.Path(tmp) / f"p{i}.tl"
                    path.write_text(text.replace("f32[", f"{dtype}["))
                    got.append(model_us(path, {}, tgt)[0])
                a, b = got
                ratio = f"{a / b:6.2f}" if isinstance(a, float) and isinstance(b, float) else "     -"
                show = [f"{x:9.1f}" if isinstance(x, float) else x[:40] for x in got]
                print(f"{what:38} {dtype:5} {show[0]:>9} {show[1]:>9} {ratio}")


if __name__ == "__main__":
    main()
