"""Programs a new user writes next to issue 10's (tests/programs/audit15/: log-sum-exp, a 4-D softmax with a
temperature, gated RMSNorm, layernorm with a division between tensors, group norm, GELU's tanh form, every function
in one statement, softplus, column standardisation, reductions over axis 1 or 2 of NCHW, a per-sample MSE, a column
L1 distance, a middle-axis sum of squared differences, K^T per head, a cyclic 3-D permute, NHWC -> NCHW with a
scale, broadcasts along three axes, a broadcast clamp, a bf16 swish, a bf16 row range): the default schedule's model
time at the programs' realistic default sizes beside the floor, as benchmarks/core.py prints it (same floor, same
columns; issue 10's goal: ratio <= 1.5).

    python benchmarks/audit15.py                         # every program
    python benchmarks/audit15.py softplus channel_max    # some programs (file stems)
    python benchmarks/audit15.py --tiny                  # the tests' small sizes (a check that every row runs)

A program the compiler refuses prints its reason in the tilec column. Correctness of the same programs is
tests/compiler/test_audit15_programs.py (NumPy formulas). Model estimates, never measurements.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from families import Family, Row, describe, row_at, table  # noqa: E402
from tilec.target import target as get_target  # noqa: E402

FOLDER = ROOT / "tests" / "programs" / "audit15"
# the sizes tests/compiler/test_audit15_programs.py runs (more than one tile each), for --tiny
TINY: dict[str, dict[str, int]] = {
    "batch_mse": dict(B=3, M=200, N=300), "bcast3d": dict(A=3, B=200, C=300), "bcast_clamp": dict(M=300, N=700),
    "channel_max": dict(N=2, C=200, H=9, W=11), "column_l1": dict(M=300, N=700),
    "column_standardize": dict(M=300, N=700), "cyclic_permute": dict(A=5, B=130, C=200),
    "funcs_mix": dict(M=300, N=700), "gelu_tanh": dict(M=300, N=700), "groupnorm": dict(N=2, G=5, L=1000),
    "height_mean": dict(N=2, C=200, H=9, W=11), "keys_transpose": dict(B=2, H=3, S=200, D=72),
    "layernorm_nogain": dict(M=300, N=700), "logsumexp_rows": dict(M=300, N=700),
    "middle_ssd": dict(A=3, B=200, C=300), "nhwc_to_nchw_scale": dict(N=2, H=5, W=7, C=200),
    "rmsnorm_gated": dict(M=300, N=600), "rowrange_bf16": dict(M=300, N=700),
    "softmax_heads": dict(B=2, H=3, S=130, T=300), "softplus": dict(M=300, N=700),
    "swish_bcast": dict(M=300, N=700),
}


def measure(path: pathlib.Path, tiny: bool, tgt) -> Row:
    family = Family(path.name, describe(path)[:56], TINY[path.stem])
    return row_at(family, 1, path, TINY[path.stem] if tiny else {}, tgt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("programs", nargs="*", help="file stems of tests/programs/audit15/ (default: all)")
    parser.add_argument("--tiny", action="store_true", help="the tests' small sizes (seconds)")
    parser.add_argument("--target", default="trn2", help="the modelled NeuronCore (tilec.target.TARGETS)")
    args = parser.parse_args(argv)
    paths = sorted(FOLDER.glob("*.tl"))
    unknown = set(args.programs) - {p.stem for p in paths}
    if unknown:
        parser.error(f"unknown programs {sorted(unknown)}; known: {', '.join(p.stem for p in paths)}")
    tgt = get_target(args.target)
    start = time.time()
    rows = [measure(p, args.tiny, tgt) for p in paths if not args.programs or p.stem in args.programs]
    tiny = ", tiny sizes" if args.tiny else ""
    print(f"audit15 programs on the {tgt.name} model{tiny} ({time.time() - start:.0f} s)")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
