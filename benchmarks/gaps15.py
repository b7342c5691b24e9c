"""The follow-up programs of tests/programs/gaps15/ (what a user writes after the examples): does each compile, match
the reference evaluator in both NKI dialects, and how far is its model time from the floor?

    python benchmarks/gaps15.py                    # every program
    python benchmarks/gaps15.py clamp conv1d       # some programs (file stems)
    python benchmarks/gaps15.py --no-model         # correctness only
    python benchmarks/gaps15.py --realistic        # the model only, at the realistic sizes of REALISTIC
    python benchmarks/gaps15.py --realistic --target trn1   # compiled for and modelled on trn1 (default trn2)

Columns: class (ok | rejected | wrong | internal | noloc | hang: the oracle's verdict, 0.6 then 0.1), floor µs and
run µs as in benchmarks/families.py (run = model latency without start-up), ratio = run / floor. A program
whose ratio is above 3 (and run above 5 µs) is marked `slow`.
"""
from __future__ import annotations

import argparse
import pathlib
import signal
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from families import floor_us, model_us  # noqa: E402

from tilec.lang import api as lang  # noqa: E402
from tilec.target import target as get_target  # noqa: E402
from tilec.testing.oracle import Verdict, check_outputs, prepare  # noqa: E402

FOLDER = ROOT / "tests" / "programs" / "gaps15"
USER20 = ROOT / "tests" / "programs" / "user20"  # user20's survey (its test: tests/compiler/test_user20_programs.py)
USER23 = ROOT / "tests" / "programs" / "user23"  # user23's survey (its test: tests/compiler/test_user23_programs.py)
USER24 = ROOT / "tests" / "programs" / "user24"  # user24's survey (its test: tests/compiler/test_user24_programs.py)
SLOW = 3.0
MIN_US = 5.0  # below this the DMA fixed costs dominate any floor: tiny programs are not called slow


# realistic sizes (docs/notes/gaps15.md's table, plus the forms compiled since): model time against the floor only
REALISTIC: dict[str, dict[str, int]] = {
    "softmax_ragged": {"M": 2048, "N": 2048},
    "softmax_axis0": {"M": 2048, "N": 2048},
    # cols20: statistics without a user, and column chains written in bf16 throughout
    "column_variance": {"M": 4096, "N": 2048},
    "softmax_axis0_bf16": {"M": 2048, "N": 2048},
    # cols21: column chains with a batch index (a statistic over a middle or leading axis)
    "softmax_mid": {"A": 16, "B": 256, "C": 1024},
    "channel_layernorm": {"N": 8, "C": 128, "H": 28, "W": 28},
    "channel_layernorm@c96": {"N": 8, "C": 96, "H": 56, "W": 56},  # ConvNeXt-T's first stage: fewer rows than P
    "column_standardize_bf16": {"M": 4096, "N": 2048},
    "log_softmax": {"M": 2048, "N": 2048},
    "residual_layernorm": {"M": 2048, "N": 1024},
    "residual_rmsnorm": {"M": 2048, "N": 1024},
    "outer_product": {"M": 2048, "N": 2048},
    "layer_scale": {"T": 4096, "D": 1024},
    "batch_embedding": {"B": 8, "S": 512, "D": 512},
    "symmetric_part": {"N": 2048},
    "symmetric_product": {"B": 8, "M": 1024},
    "conv1x1_nhwc": {"N": 8, "H": 28, "W": 28, "C": 256, "K": 256},
    "nchw_to_nhwc_residual": {"N": 8, "C": 256, "H": 28, "W": 28},
    "row_mean_var": {"M": 2048, "N": 2048},
    "attn_full": {"S": 1024, "D": 128},
    "attn_inline": {"S": 1024, "D": 128},
    "attn_inline_bf16": {"S": 1024, "D": 128},
    "attn_full_bf16": {"S": 1024, "D": 128},  # attn22: attn_full with every tensor bf16 (P declared bf16)
    "attn_causal_bf16": {"S": 1024, "D": 128},  # attn22: attn_inline_bf16 with an additive (causal) mask
    "cross_entropy": {"M": 4096, "N": 1024},
    "bn_mean": {"N": 32, "C": 256, "H": 56, "W": 56},
    "transpose3d_relu": {"B": 8, "M": 1024, "N": 1024},
    "nchw_to_nhwc_add": {"N": 8, "C": 256, "H": 28, "W": 28},
    "concat_rows_2d": {"M1": 1025, "M2": 1023, "N": 1024},
    "strided_slice_offset": {"B": 8, "M": 1024, "N": 2048},
    "diff_adjacent": {"M": 2048, "N": 2049},
    "mean_axis0_3d": {"A": 16, "B": 256, "C": 1024},
    "linear_bias_gelu": {"M": 1024, "K": 1024, "N": 1024},
    "dot_product": {"N": 1048576},
    "total_sum": {"M": 2048, "N": 2048},
    "heads_split": {"S": 2048, "E": 1024},
    "heads_merge": {"H": 16, "S": 2048, "D": 64},
    # ffn19: BERT-base's feed-forward block at 512 and 2048 tokens ("program@tag": the same program at more sizes)
    **{f"ffn_{f}{dt}@{m}": {"M": m, "D": 768, "H": 3072, "E": 768}
       for f in ("gelu", "relu") for dt in ("", "_bf16") for m in (512, 2048)},
    **{f"ffn_gelu{dt}@small{m}": {"M": m, "D": 256, "H": 512, "E": 256} for dt in ("", "_bf16") for m in (2048, 4096)},
    "ffn_gelu_bf16@large512": {"M": 512, "D": 1024, "H": 4096, "E": 1024},  # BERT-large (fp32: SBUF overflow)
    # user20 (tests/programs/user20/): refused before session 20, compiled by its source rewrites
    "batched_matvec": {"B": 8, "M": 1024, "K": 1024},
    "channel_max_mean": {"N": 8, "C": 256, "H": 28, "W": 28},
    "cosine_sim": {"M": 4096, "D": 512},
    "rope": {"S": 4096, "Dh": 64},
    "causal_scores": {"Hd": 8, "S": 1024, "D": 64},
    "heads_scores": {"S": 1024, "Hd": 8, "D": 64},  # (shuf21: the heads copied head-first, heads_split.py)
    "channel_shuffle": {"N": 8, "G": 4, "Cg": 64, "H": 28, "W": 28},
    "pixel_shuffle": {"N": 1, "C": 64, "H": 56, "W": 56},
    "pixel_unshuffle": {"N": 1, "C": 64, "H": 56, "W": 56},
    "group_norm": {"N": 8, "G": 32, "Cg": 8, "H": 28, "W": 28},
    # rows21: a folded batch norm + relu6 in NHWC, rows of 128 channels (packed_rows.py: 3.49x -> 1.34x)
    "bn_nhwc": {"N": 8, "H": 56, "W": 56, "C": 128},
    # lead22: operands of two dtypes in one statement, an extremum of scaled values, a batched vector-matrix product
    "softmax_bf16_stats": {"M": 2048, "N": 2048},
    "softmax_temperature": {"M": 2048, "N": 2048},
    "masked_mean": {"B": 32, "S": 512, "D": 768},
    "masked_mean_bf16": {"B": 32, "S": 512, "D": 768},
    "decode_attention": {"B": 4, "H": 8, "S": 2048, "D": 128},
    "decode_attention_bf16": {"B": 4, "H": 8, "S": 2048, "D": 128},  # attn24 (lead23's trial: 261.6 us total)
    "batchnorm_infer": {"N": 8, "C": 64, "H": 56, "W": 56},
    "layernorm_hidden": {"M": 4096, "D": 1024},
    "layernorm_bf16_stats": {"M": 4096, "D": 1024},
    # user23 (tests/programs/user23/): refused or an internal error before session 23
    "sqdist": {"M": 4096, "N": 4096, "D": 128},  # (D + 1 = 129: the norms' row is a second contraction tile)
    "sqdist@d127": {"M": 4096, "N": 4096, "D": 127},
    "sqdist@d64": {"M": 4096, "N": 4096, "D": 64},
    "sqdist_matmul": {"M": 4096, "N": 4096, "D": 128},  # the expansion written out (distance_split's terms)
    "sqdist_matmul@d127": {"M": 4096, "N": 4096, "D": 127},
    "gram_style": {"N": 8, "C": 256, "H": 32, "W": 32},
    "normalize_rows": {"M": 4096, "D": 1024},
    "cosine_matrix": {"M": 4096, "N": 4096, "D": 128},  # (scale_split: the column factor scales B's rows)
    "alibi_pos": {"Hd": 8, "S": 1024, "D": 64},  # (an intermediate finished in place: inplace_split)
    # user24 (tests/programs/user24/): the survey's programs at the sizes of the layers they come from
    "swiglu_ffn": {"M": 512, "D": 768, "H": 2048},
    "rmsnorm_linear": {"M": 2048, "D": 1024, "E": 1024},
    "layernorm_qkv": {"M": 2048, "D": 768},
    "embedding_bag": {"B": 512, "V": 4096, "D": 256},
    "instance_norm_relu": {"N": 8, "C": 128, "H": 32, "W": 32},
    "audio_conv1d_s2": {"N": 8, "C": 512, "T": 1024, "K": 512},
    "causal_dwconv1d": {"N": 8, "C": 1536, "L": 1024},
    "space_to_depth_nhwc": {"N": 8, "H": 56, "W": 56, "C": 64},
    "separable_s2": {"N": 8, "C": 128, "H": 28, "W": 28, "K": 256},
    "channel_shuffle_nhwc": {"N": 8, "H": 28, "W": 28, "G": 4, "Cg": 64},
    "avgpool_conv1x1": {"N": 8, "C": 192, "H": 28, "W": 28, "K": 64},
    "upsample_shifts": {"R": 8192, "W": 512},
    "focal_loss": {"M": 4096, "N": 1024},
    "dice_loss": {"M": 4096, "N": 1024},
    "smoothed_kl": {"M": 4096, "N": 1024},
    "mish_hswish": {"M": 4096, "N": 1024},
    "weight_norm_linear": {"M": 2048, "D": 1024, "E": 1024},
    "grn": {"N": 8, "H": 28, "W": 28, "C": 384},
    "temporal_pool_fc": {"N": 32, "C": 512, "L": 1000, "K": 512},
    "conformer_conv": {"N": 8, "C": 256, "L": 1024},
    "mbconv_se": {"N": 8, "C": 40, "H": 28, "W": 28, "E": 240, "R": 10},
    "ws_conv1x1": {"N": 8, "C": 256, "H": 28, "W": 28, "K": 512},
    "depth_to_space_crd": {"N": 8, "C": 64, "H": 56, "W": 56},
    # user24: refused before (a total in `for z in 0..1`, a vector's element `k[0]`): reduce_split, scalar_split
    "ce_mean": {"M": 4096, "N": 1024},
    "top1_accuracy": {"M": 4096, "N": 1024},
    "huber_mean": {"M": 4096, "N": 1024},
    "eca_block": {"N": 8, "C": 256, "H": 28, "W": 28},
    "scalar_mix": {"L": 13, "T": 4096, "D": 768},  # (a vector times a matrix: matvec_split.split_vector_matrix)
}


def realistic(names: list[str], target: str = "trn2") -> None:
    tgt = get_target(target)
    for name, sizes in REALISTIC.items():
        if names and name not in names and name.split("@")[0] not in names:
            continue
        path = FOLDER / f"{name.split('@')[0]}.tl"
        path = path if path.exists() else next((d / path.name for d in (USER20, USER23) if (d / path.name).exists()),
                                               USER24 / path.name)
        t0 = time.time()
        floor, bound = floor_us(lang.load(path, sizes), tgt)
        latency, startup = model_us(path, sizes, tgt)
        shown = ", ".join(f"{k}: {v}" for k, v in sizes.items())
        if isinstance(latency, float):
            run = latency - startup
            timing = f"floor {floor:8.2f} {bound:7} run {run:9.2f} ratio {run / floor:6.2f}"
        else:
            timing = f"floor {floor:8.2f} {bound:7} {latency[:90]}"
        print(f"{name:<22} {shown:<30} {timing}  ({time.time() - t0:.0f} s)", flush=True)


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def verdict(path: pathlib.Path, nki: str, timeout: int, target: str = "trn2") -> Verdict:
    from tilec.compiler.api import compile_loaded
    from tilec.testing.oracle import _error

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        prep = prepare(path.read_text())
        if prep.verdict is not None:
            return prep.verdict
        try:
            compiled = compile_loaded(prep.program, None, nki=nki, target=target)
        except Exception as err:
            return _error("compile", err)
        try:
            out = compiled.run(**prep.inputs)
        except Exception as err:
            v = _error("run", err)
            return Verdict("internal", "run", v.message) if v.cls == "rejected" else v
        bad = check_outputs(prep.program, out, prep.ref, bounds=prep.bounds)
        return Verdict("wrong", "compare", bad) if bad else Verdict("ok")
    except _Timeout:
        return Verdict("hang", "", f"over {timeout} s")
    finally:
        signal.alarm(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--no-model", action="store_true")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--realistic", action="store_true")
    ap.add_argument("--target", default="trn2", help="the NeuronCore compiled for and modelled (tilec.target.TARGETS)")
    args = ap.parse_args(argv)
    if args.realistic:
        realistic(args.names, args.target)
        return 0
    paths = sorted(FOLDER.glob("*.tl"))
    if args.names:
        paths = [p for p in paths if p.stem in args.names]
    tgt = get_target(args.target)
    counts: dict[str, int] = {}
    for path in paths:
        t0 = time.time()
        v6, v1 = verdict(path, "0.6", args.timeout, tgt.name), verdict(path, "0.1", args.timeout, tgt.name)
        cls = v6.cls if v6.cls == v1.cls else f"{v6.cls}/{v1.cls}"
        timing = ""
        if not args.no_model and v6.cls == "ok":
            program = lang.load(path)
            floor, bound = floor_us(program, tgt)
            latency, startup = model_us(path, {}, tgt)
            if isinstance(latency, float):
                run = latency - startup
                ratio = run / floor
                timing = f"floor {floor:8.2f} {bound:7} run {run:8.2f} ratio {ratio:6.2f}"
                if ratio > SLOW and run > MIN_US:
                    cls += " slow"
        counts[cls] = counts.get(cls, 0) + 1
        detail = "" if v6.cls == v1.cls == "ok" else " | " + (v6.line() if v6.cls != "ok" else v1.line())
        print(f"{path.stem:<28} {cls:<14} {timing}{detail[:200]}  ({time.time() - t0:.0f} s)", flush=True)
    print("; ".join(f"{k}: {n}" for k, n in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
