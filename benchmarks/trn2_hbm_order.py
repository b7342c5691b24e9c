"""A hardware measurement for whoever has a Trn2: do DMAs writing disjoint elements of one HBM tensor wait for each
other? It decides the performance model's HBM dependence rule (tilec/perf/deps.py; docs/notes/model8.md says why the
documentation does not settle it).

    python benchmarks/trn2_hbm_order.py                      # here: run every kernel on tilec's interpreter, check
                                                             # it against NumPy, print the model under both rules
    python benchmarks/trn2_hbm_order.py --hardware           # on a trn2 instance with neuronxcc (SDK 2.21-2.26):
                                                             # check each kernel's output, then time it
    python benchmarks/trn2_hbm_order.py --hardware --profile DIR
                                                             # also write NEFF + NTFF profiles of rows_* / blocks_*
    python benchmarks/trn2_hbm_order.py --nki06 [--hardware] # the NKI 0.6 kernels (SDK 2.29+, `import nki`):
                                                             # hardware timing is the median wall time of --iters
                                                             # calls (host overhead included; no nki.benchmark in
                                                             # 0.6): profile with `neuron-explorer capture` instead
    options: --bands N (default 16) --free F (default 128: x is (128, 2F) fp32) --iters N (default 100)
             --kernels one_affine,rows_affine,...

The kernels are benchmarks/kernels/hbm_order.py (its docstring says what each one stores) and, for --nki06,
hbm_order_nki06.py (the same stores, Python range loops: one row per kind, no _affine/_seq). Reading the hardware
table (p50 of nc_latency, us; compare the _affine rows with each other, then the _seq rows):

    rows ~ blocks, both well below overwrite   DMAs are ordered by the elements they touch (per access pattern):
                                               set HBM_RULE = "pattern" in tilec/perf/deps.py (what-if numbers of
                                               that rule: TILEC_MODEL_HBM_DEPS=pattern python benchmarks/families.py)
    rows ~ overwrite, blocks well below        ordered by byte range (the model's rule today): keep "range"
    blocks ~ overwrite, tensors well below     ordered per tensor: the model is optimistic; it needs a "tensor" rule
    all four ~ equal                           the stores are serialised anyway (one queue, or the issue cost
                                               dominates): the rule does not matter at this size; repeat with
                                               --free 512 and --free 16 before concluding
    roundtrip output wrong                     a load of an HBM intermediate does not wait for the stores that wrote
                                               it: a correctness bug that tilec's kernels through HBM would hit

"well below" means by more than the run-to-run spread (run the table twice). The per-band cost of a wait is about
one DMA's issue-to-completion time (the model: ~2 us), so with 16 bands the difference is tens of us. The profile
(neuron-profile view -n file.neff -s profile.ntff) answers it directly: in rows_*, does the second dma trigger of a
band wait on the semaphore of the first one's queue?
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import trn2_probe as probe  # noqa: E402

KERNEL_FILE = ROOT / "benchmarks" / "kernels" / "hbm_order.py"
KERNEL_FILE06 = ROOT / "benchmarks" / "kernels" / "hbm_order_nki06.py"
KINDS = ("one", "rows", "blocks", "tensors", "overwrite", "roundtrip")
NAMES = tuple(f"{k}_{loop}" for loop in ("affine", "seq") for k in KINDS)


def expected(name: str, x: np.ndarray, bands: int) -> tuple[np.ndarray, ...]:
    """The NumPy result of kernel `name` (benchmarks/kernels/hbm_order.py docstring)."""
    f = x.shape[1] // 2
    kind = name.split("_")[0]
    if kind == "blocks":
        return (np.stack([np.stack([x[:, :f], x[:, f:]])] * bands),)
    if kind == "tensors":
        return np.stack([x[:, :f]] * bands), np.stack([x[:, f:]] * bands)
    return (np.stack([x] * bands),)


def _outputs(result: object) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(r) for r in (result if isinstance(result, tuple) else (result,)))


def _check(name: str, result: object, x: np.ndarray, bands: int) -> str:
    got, want = _outputs(result), expected(name, x, bands)
    ok = len(got) == len(want) and all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, want))
    return "ok" if ok else "WRONG"


def run_model(names: list[str], bands: int, free: int, path: pathlib.Path = KERNEL_FILE) -> int:
    """Every kernel on tilec's interpreter (checked against NumPy) and on the model under both HBM rules."""
    from tilec.nki.api import load_kernel_file, simulate_traced
    from tilec.perf.api import estimate

    x = np.random.default_rng(7).random((128, 2 * free)).astype(np.float32)
    print(f"tilec's interpreter and model (trn2), x = (128, {2 * free}) fp32, {bands} bands")
    print(f"{'kernel':<20} {'result':>6} {'DMAs':>5} {'model us (range)':>17} {'model us (pattern)':>19}")
    bad = 0
    for name in names:
        kernel = load_kernel_file(path, name, force_interpreter=True)
        sys.modules[kernel.func.__module__].BANDS = bands  # the kernel file's global, read when it is traced
        result, trace = simulate_traced(kernel, x)
        status = _check(name, result, x, bands)
        bad += status != "ok"
        dmas = sum(ins.engine == "dma" for ins in trace.instrs)
        by = {rule: estimate(trace, hbm_rule=rule).total_us for rule in ("range", "pattern")}
        print(f"{name:<20} {status:>6} {dmas:>5} {by['range']:>17.1f} {by['pattern']:>19.1f}")
    return 1 if bad else 0


def run_hardware(names: list[str], bands: int, free: int, iters: int, profile: str | None) -> int:
    """On a Trn2 with the Neuron SDK: each kernel's output against NumPy, then its latency (nki.benchmark)."""
    x = np.random.default_rng(7).random((128, 2 * free)).astype(np.float32)
    print(f"Trn2, x = (128, {2 * free}) fp32, {bands} bands, {iters} iterations")
    bad, _ = probe.time_nki01(probe.load_module(KERNEL_FILE, BANDS=bands), names, (x,),
                              lambda name, result: _check(name, result, x, bands), iters, profile,
                              lambda name: name.split("_")[0] in ("rows", "blocks"), width=20)
    return 1 if bad else 0


def run_hardware06(names: list[str], bands: int, free: int, iters: int) -> int:
    """NKI 0.6 on a Trn2: each kernel's output against NumPy, then the median wall time of `iters` calls."""
    x = np.random.default_rng(7).random((128, 2 * free)).astype(np.float32)
    print(f"Trn2 (NKI 0.6), x = (128, {2 * free}) fp32, {bands} bands, median wall time of {iters} calls "
          f"(host overhead included)")
    bad, _ = probe.time_nki06(probe.load_module(KERNEL_FILE06, BANDS=bands), names, (x,),
                              lambda name, result: _check(name, result, x, bands), iters, width=20)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", action="store_true", help="run on the local Trn2 with neuronxcc (not tilec)")
    ap.add_argument("--profile", metavar="DIR", help="with --hardware: also profile rows_* and blocks_* into DIR")
    ap.add_argument("--bands", type=int, default=16)
    ap.add_argument("--free", type=int, default=128, help="F: x is (128, 2F) fp32, each store (128, F)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--kernels", help="comma-separated kernel names (default: all)")
    ap.add_argument("--nki06", action="store_true", help="the NKI 0.6 kernels (hbm_order_nki06.py)")
    args = ap.parse_args(argv)
    known = KINDS if args.nki06 else NAMES
    names = probe.chosen(ap, args.kernels, known)
    if args.hardware:
        if args.nki06:
            return run_hardware06(names, args.bands, args.free, args.iters)
        return run_hardware(names, args.bands, args.free, args.iters, args.profile)
    return run_model(names, args.bands, args.free, KERNEL_FILE06 if args.nki06 else KERNEL_FILE)


if __name__ == "__main__":
    sys.exit(main())
