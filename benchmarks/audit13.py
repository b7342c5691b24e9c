"""Programs a new user writes next to issue 13's families (tests/programs/audit13/: a pool with padding 2, a dilated
strided conv, a ResNet downsampling conv, a stride-2 depthwise, odd channel counts, a bias, scale or clamp written as
its own statement, a 5-D permute, ...): the default schedule's model time beside the floor, as benchmarks/families.py
prints it (same floor, same columns; batch 1 and 8 where the program has a batch size N).

    python benchmarks/audit13.py                     # every program, batch 1 and 8
    python benchmarks/audit13.py conv_s2_pad1 gmp    # some programs (file stems)
    python benchmarks/audit13.py --dtype bf16 --batch 8

Correctness of the same programs in f32, f16 and bf16 is tests/compiler/test_families_dtypes.py (NumPy formulas).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import families  # noqa: E402
from tilec.target import target as get_target  # noqa: E402

FOLDER = ROOT / "tests" / "programs" / "audit13"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("programs", nargs="*", help="file stems of tests/programs/audit13/ (default: all)")
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default: 1 and 8)")
    parser.add_argument("--dtype", choices=sorted(families.BYTES), default="f32", help="dtype of every tensor")
    parser.add_argument("--target", default="trn2", help="the modelled NeuronCore (tilec.target.TARGETS)")
    args = parser.parse_args(argv)
    paths = sorted(FOLDER.glob("*.tl"))
    unknown = set(args.programs) - {p.stem for p in paths}
    if unknown:
        parser.error(f"unknown programs {sorted(unknown)}; known: {', '.join(p.stem for p in paths)}")
    chosen = [p for p in paths if not args.programs or p.stem in args.programs]
    tgt = get_target(args.target)
    rows: list[families.Row] = []
    start = time.time()
    saved = families.FOLDER
    families.FOLDER = FOLDER  # families.measure reads the program text from its FOLDER
    try:
        with tempfile.TemporaryDirectory(prefix="tilec-audit13-") as tmp:
            for path in chosen:
                family = families.Family(path.name, families.describe(path)[:48], {})
                for batch in args.batch or [1, 8]:
                    row = families.measure(family, batch, False, args.dtype, tgt, pathlib.Path(tmp))
                    if row is not None:
                        rows.append(row)
    finally:
        families.FOLDER = saved
    print(f"audit13 programs on the {tgt.name} model, {args.dtype} ({time.time() - start:.0f} s)")
    print(families.table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
