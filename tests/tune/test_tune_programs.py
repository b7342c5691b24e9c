"""The tuner on real programs: spaces derived from the compiler, its rules as the authority, end-to-end tuning
whose winner is at least as fast as the default and matches the reference evaluator."""
from __future__ import annotations

import io
import math
import pathlib
import random

import pytest

from tilec.tune.api import summary_text, tune
from tilec.tune.evaluate import Job, compile_job, model_outcome
from tilec.tune.knobs import build_space
from tilec.errors import TilecError

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
SMALL_CONV = dict(N=1, C=128, K=128, H=6, W=18)  # 4x16 conv outputs, 2x8 after the 2x2 pool


@pytest.fixture(scope="module")
def conv_job() -> Job:
    return Job.of(str(EXAMPLES / "conv_bias_maxpool.tl"), SMALL_CONV)


@pytest.fixture(scope="module")
def conv_space(conv_job):
    return build_space(conv_job)


def test_conv_space_knobs_follow_the_program_and_hardware_limits(conv_space):
    names = [k.name for k in conv_space.knobs]
    assert names[:5] == ["tile conv.k", "tile conv.c", "tile conv.x", "tile conv.y", "split conv.y"]
    values = {k.name: k.values for k in conv_space.knobs}
    assert all(v <= 128 for v in values["tile conv.k"] + values["tile conv.c"])
    assert set(values["tile conv.x"]) <= {2, 4, 8, 16}  # divisors of Wo = 16, multiples of the pool width
    assert {"place conv", "buffers X", "hoist Wt", "hoist X"} <= set(names)
    assert conv_space.check(conv_space.default_point()) is None
    # the default point is the compiler's default schedule written out: the same kernel
    default = compile_job(Job.of(str(EXAMPLES / "conv_bias_maxpool.tl"), SMALL_CONV), None).source
    assert compile_job(Job.of(str(EXAMPLES / "conv_bias_maxpool.tl"), SMALL_CONV),
                       conv_space.render(conv_space.default_point())).source == default
    assert all(conv_space.check(p) is None for p in conv_space.experts)


def test_weight_split_knob_speaks_the_compiler_directive(conv_job, conv_space):
    knob = next(k for k in conv_space.knobs if k.name == "split Wt")
    assert knob.values == (None, "conv.c")  # default first: one weight DMA per out-channel tile
    # with C = 128 in one in-channel tile, loads per in-channel tile are the default kernel: skipped statically
    assert "is the default load" in conv_space.check(conv_space.point(**{"split Wt": "conv.c"}))
    split = conv_space.point(**{"split Wt": "conv.c", "tile conv.c": 64})
    assert conv_space.check(split) is None
    assert "split Wt, conv.c\n" in conv_space.render(split)
    unsplit = conv_space.point(**{"tile conv.c": 64})
    assert compile_job(conv_job, conv_space.render(split)).source != \
        compile_job(conv_job, conv_space.render(unsplit)).source
    matmul = build_space(Job.of(str(EXAMPLES / "matmul.tl"), dict(M=128, K=256, N=128)))
    assert next(k for k in matmul.knobs if k.name == "split A").values == (None, "C.k")


def test_statically_legal_points_compile(conv_job, conv_space):
    rng = random.Random(4)
    legal = [p for p in (conv_space.random_point(rng) for _ in range(80)) if conv_space.check(p) is None][:12]
    assert len(legal) >= 8
    for point in legal:
        compile_job(conv_job, conv_space.render(point))  # raises TilecError if the static checks let it through


def test_psum_overflow_is_rejected_statically_and_by_the_compiler(conv_job, conv_space):
    ok = conv_space.point(**{"tile conv.x": 16, "tile conv.y": 4, "split conv.y": 4})
    assert conv_space.check(ok) is None
    # 64 rows of 16 columns would not fit one PSUM bank: the knob never offers it, the check names the rule, and
    # the compiler (the authority) rejects the schedule text too
    named = conv_space.named(ok)
    named["tile conv.y"] = named["split conv.y"] = 64
    reasons = [check(named) for check in conv_space.checks]
    assert "64 rows of 16 columns is 1024 elements per matmul; one PSUM bank holds 512" in reasons
    wide = conv_space.render(ok).replace("tile conv.y, 4", "tile conv.y, 64")
    outcome = model_outcome(conv_job, wide)
    assert not outcome.ok and "512" in outcome.error
    with pytest.raises(TilecError):
        compile_job(conv_job, "tile conv.k, 256\n")  # more than 128 partitions


def test_points_the_compiler_would_fold_into_others_are_skipped(conv_space):
    odd = conv_space.point(**{"tile conv.y": 4, "split conv.y": 2})
    assert conv_space.check(odd) == "a band of 2 rows is not a multiple of the 4 rows per matmul"


def test_tune_small_conv_beats_or_equals_default_verifies_and_reruns_from_cache(tmp_path, monkeypatch):
    path = str(EXAMPLES / "conv_bias_maxpool.tl")
    out = io.StringIO()
    first = tune(path, SMALL_CONV, budget=6, seed=1, jobs=1, progress=out, cache_dir=str(tmp_path))
    assert first.verified and first.max_error <= 1e-4
    assert first.best_us <= first.default_us < math.inf
    assert first.history[0].origin == "default" and len(first.history) == 6
    assert "def conv_bias_maxpool" in first.source and first.best_schedule.startswith("tile conv.k")
    pruned = sum(t.error.startswith("pruned") for t in first.history)
    assert first.evaluations + pruned == 6 and "best" in out.getvalue()
    import tilec.tune.api

    def no_run(*args):
        raise AssertionError("a re-run must not run the interpreter again")

    monkeypatch.setattr(tilec.tune.api, "verify", no_run)  # the verdict comes from the cache too
    again = tune(path, SMALL_CONV, budget=6, seed=1, jobs=1, progress=False, cache_dir=str(tmp_path))
    assert again.evaluations == 0 and again.verified and again.source == first.source
    assert [(t.schedule, t.cost) for t in again.history] == [(t.schedule, t.cost) for t in first.history]
    assert again.best_schedule == first.best_schedule
    assert "tuned schedule" in summary_text(first)
    assert "space            : 6 schedules tried out of" in summary_text(first)  # a sample, not the whole space


def test_tune_vector_add_evaluates_its_whole_small_space_and_says_so(tmp_path):
    result = tune(str(EXAMPLES / "vector_add.tl"), {"L": 128 * 1024}, budget=6, jobs=1, progress=False,
                  cache_dir=str(tmp_path))
    assert result.verified and result.best_us <= result.default_us
    assert result.best_schedule.startswith("tile z.i, ")
    tiles = {t.schedule for t in result.history}
    assert result.stats.exhaustive and len(tiles) == result.stats.legal == 5  # 1024, 512, 256, 128, 64 per tile
    assert all(t.cost >= result.best_us for t in result.history)
    assert "all 5 legal schedules evaluated" in summary_text(result)


def test_cli_writes_schedule_and_kernel_and_reports_errors_without_traceback(tmp_path, capsys, monkeypatch):
    import tilec_cli
    monkeypatch.chdir(tmp_path)  # the cache goes to ./.tilec-cache/tune
    kernel, schedule = tmp_path / "k.py", tmp_path / "s.txt"
    argv = ["tune", str(EXAMPLES / "conv_bias_maxpool.tl"), *sum((["-D", f"{k}={v}"] for k, v in SMALL_CONV.items()),
            []), "--budget", "3", "--jobs", "1", "--quiet", "-o", str(kernel), "--save-schedule", str(schedule)]
    assert tilec_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "default schedule" in out and "verified         : yes" in out
    assert schedule.read_text().startswith("tile conv.k") and "def conv_bias_maxpool" in kernel.read_text()
    assert (tmp_path / ".tilec-cache" / "tune").is_dir()
    # the saved schedule is a schedule file the compiler takes back: the same kernel, byte for byte
    again = tmp_path / "again.py"
    defines = sum((["-D", f"{k}={v}"] for k, v in SMALL_CONV.items()), [])
    assert tilec_cli.main(["compile", str(EXAMPLES / "conv_bias_maxpool.tl"), *defines, "--schedule", str(schedule),
                           "-o", str(again)]) == 0
    assert again.read_text() == kernel.read_text()
    # without --quiet: a progress line with the best latency so far on stderr (the re-run comes from the cache;
    # TILEC_PROGRESS=1 stands for a terminal, progress is quiet on a pipe)
    capsys.readouterr()
    monkeypatch.setenv("TILEC_PROGRESS", "1")
    assert tilec_cli.main([a for a in argv if a != "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "tune [" in captured.err and "best " in captured.err and "us" in captured.err
    assert "tuned schedule" in captured.out and "MFU" in captured.out and "0 evaluated" in captured.out
    assert tilec_cli.main(["tune", str(tmp_path / "missing.tl")]) == 1
    assert "error: cannot read" in capsys.readouterr().err


def test_a_saved_schedule_runs_and_profiles_at_the_tuned_latency(tmp_path, capsys, monkeypatch):
    import tilec_cli
    monkeypatch.chdir(tmp_path)
    program, schedule = str(EXAMPLES / "avgpool.tl"), str(tmp_path / "avg.sched")
    sizes = ["-D", "C=128", "-D", "H=16", "-D", "W=16"]
    assert tilec_cli.main(["tune", program, *sizes, "--budget", "8", "--jobs", "1", "--quiet",
                           "--save-schedule", schedule]) == 0
    tuned = float(capsys.readouterr().out.split("tuned schedule   :")[1].split("us")[0])
    assert tilec_cli.main(["run", program, *sizes, "--schedule", schedule]) == 0  # checked against the evaluator
    assert "max abs error vs reference" in capsys.readouterr().out
    assert tilec_cli.main(["profile", program, *sizes, "--schedule", schedule, "--html", "t.html"]) == 0
    total_us = float(capsys.readouterr().out.split("total_time ")[1].split()[0]) * 1e6
    assert abs(total_us - tuned) < 0.05 + 1e-3 * tuned  # the summary prints one decimal
    assert tilec_cli.main(["profile", str(tmp_path / "t.html"), "--schedule", schedule]) == 1
    assert "--schedule applies to .tl programs" in capsys.readouterr().err


def test_tune_with_a_hardware_evaluator_takes_the_best_measured_of_the_model_top_k(tmp_path):
    from tilec.tune.evaluate import HardwareEvaluator, ModelEvaluator
    measured: list[str] = []

    def fake_benchmark(job, schedule):  # a device that disagrees with the model: later-measured is faster
        measured.append(schedule)
        return 100.0 - len(measured)

    hw = HardwareEvaluator(top_k=3, benchmark=fake_benchmark, screen=ModelEvaluator(jobs=1))
    result = tune(str(EXAMPLES / "conv_bias_maxpool.tl"), SMALL_CONV, budget=6, seed=2, evaluator=hw,
                  progress=False, cache_dir=str(tmp_path))
    ok = sorted((t for t in result.history if math.isfinite(t.cost)), key=lambda t: (t.cost, t.index))
    assert measured == [t.schedule for t in ok[:3]]  # the model's top 3, best first
    assert result.best_schedule == measured[-1] and result.measured_p99_us == 97.0
    assert result.verified


def test_assignment_conv_space_offers_psum_shapes_and_column_bands():
    space = build_space(Job.of(str(EXAMPLES / "conv_bias_maxpool.tl"), dict(N=1)))  # 224x224, 256 -> 256
    values = {k.name: k.values for k in space.knobs}
    assert values["tile conv.x"] == (222, 74) and values["split conv.x"] == (None, 74)
    assert set(values["tile conv.y"]) == {2, 6}  # rows per matmul group: 2 x 222 or 6 x 74 <= 512 fp32
    six_by_74 = space.point(**{"tile conv.x": 74, "tile conv.y": 6, "split conv.y": 6, "split conv.x": 74})
    assert space.check(six_by_74) is None
    assert space.check(space.point(**{"tile conv.y": 6})) == \
        "6 rows of 222 columns is 1332 elements per matmul; one PSUM bank holds 512"
    assert space.experts and all(space.check(p) is None for p in space.experts)


def test_tune_matmul_beats_the_default_with_one_band_per_moving_tile(tmp_path):
    # the default stores whole output rows after the last matmul; a band per moving tile overlaps that store
    result = tune(str(EXAMPLES / "matmul.tl"), dict(M=128, K=256, N=1024), budget=6, seed=0, jobs=1,
                  progress=False, cache_dir=str(tmp_path))
    assert result.verified and result.best_us < result.default_us
    assert "split C.j, 512" in result.best_schedule


def test_row_reduction_space_tiles_rows_and_free_elements_and_tunes(tmp_path):
    job = Job.of(str(EXAMPLES / "rowsum.tl"), {"M": 256, "N": 2048})
    space = build_space(job)
    assert [k.name for k in space.knobs] == ["tile s.i", "tile s.j"]
    rows, free = space.knobs
    assert rows.values[0] == 128 and set(rows.values) == {32, 64, 128}
    assert free.values[0] == 2048 and set(free.values) == {64, 128, 256, 512, 1024, 2048}
    result = tune(job.path, {"M": 256, "N": 2048}, budget=48, jobs=1, progress=False, cache_dir=str(tmp_path))
    assert result.verified and result.stats.exhaustive and result.stats.legal == 18
    assert result.best_us <= result.default_us


def test_a_statement_split_into_nests_of_one_name_gets_its_knobs_once():
    """permute_split turns `Y[s, h * D + d] = X[h, s, d]` into one copy per head, every one a nest storing Y over
    loops of the same names: the space lists each knob once (it raised "duplicate knob names"; the lead's fuzz
    generator for reshape copies found it). Copies take no directives (directives.apply_schedule refuses them), so
    since core17 they offer no knob at all: the space of heads_merge is empty."""
    heads = pathlib.Path(__file__).resolve().parents[1] / "programs" / "gaps15" / "heads_merge.tl"
    space = build_space(Job.of(str(heads), dict(H=3, S=52, D=46)))
    names = [k.name for k in space.knobs]
    assert len(names) == len(set(names)) and not names


GAPS15 = pathlib.Path(__file__).resolve().parents[1] / "programs" / "gaps15"


@pytest.mark.parametrize("name, sizes, refused", [
    ("strided_slice_offset", dict(B=2, M=128, N=600), "tile Y.j, 100"),  # a copy
    ("dot_product", dict(N=65536), "tile s.i, 1024"),  # one long row (build_reduce.long_row)
    ("mean_axis0_3d", dict(A=4, B=16, C=1024), "tile Y.c, 256"),  # few rows, kept on partitions
])
def test_ops_without_schedule_parameters_offer_no_knobs_and_refuse_directives(name, sizes, refused):
    """core17: the tuner draws knobs only from ops whose schedule has parameters; the ops scheduled by a builder
    without any (a copy, a long row, a sum of few rows with the kept elements on the partitions) offer none, and the
    compiler refuses a directive on them with a located error (the tuner's candidates were refused before)."""
    from tilec.compiler.api import compile_loaded
    from tilec.lang import api as lang

    path = GAPS15 / f"{name}.tl"
    space = build_space(Job.of(str(path), sizes))
    op = refused.split()[1].split(".")[0]
    assert not [k for k in space.knobs if k.target.startswith(f"{op}.")]
    prog = lang.load(str(path), sizes)
    with pytest.raises(TilecError, match="takes no directives|no parameters") as err:
        compile_loaded(prog, lang.parse_schedule(refused, "<test>"))
    assert err.value.span is not None


@pytest.mark.parametrize("name", ["avgpool1d", "matvec_bias", "conv1d_same_bias", "depthwise_conv1d"])
def test_every_one_knob_candidate_compiles(name):
    """core17: the space keeps only values the compiler accepts (directives.apply_schedule on each directive alone;
    a padded conv read offers no column bands and no single input buffer): `tile Y.c, 1` of a pool, `tile y.x, 1`
    of a matvec, `split H.l` and `buffers X, 1` of a padded conv were refused; depthwise_conv1d's space raised
    "duplicate knob names". Each knob moved alone from the default point compiles."""
    job = Job.of(str(GAPS15 / f"{name}.tl"), {})
    space = build_space(job)
    tried = 0
    for knob in space.knobs:
        for value in knob.values[1:]:
            point = space.point(**{knob.name: value})
            if space.check(point) is None:
                compile_job(job, space.render(point))  # a refusal raises TilecError
                tried += 1
    assert tried > 0
