"""Calibration subset: the assignment's kernels on the interpreter + model against hardware measurements
(docs/calibration.md §1). Targets (issue 15): each row within 10 %, the public conv behind rows 9-12 too
(`benchmarks/calibrate.py --public-conv`, not in the repository); the full set is in benchmarks/calibrate.py."""
from __future__ import annotations

import importlib.util
import pathlib
import statistics
import subprocess
import sys

import pytest

pytest.importorskip("tilec.nki.api")

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("calibrate", ROOT / "benchmarks" / "calibrate.py")
calibrate = importlib.util.module_from_spec(spec)
sys.modules["calibrate"] = calibrate  # dataclasses look their module up while the file runs
spec.loader.exec_module(calibrate)

from tilec.perf.api import estimate  # noqa: E402

QUICK = (2, 4, 5, 6, 7, 8)
# Every row within 10 % (issue 15's target). The model reaches: 2 -9.1 %, 4 -3.8 %, 5 +8.1 %, 6 -2.1 %, 7 -7.8 %,
# 8 -0.4 %, median 5.8 %. Row 8 is the one row the HBM write acknowledgement (params.dma_write_ack_ns) was fitted to,
# so its bound is 5 %: a change that loses the fit shows here before it shows as a 10 % miss.
BOUND = {8: 0.05}
ROW_BOUND = 0.10
MEDIAN_BOUND = 0.07


@pytest.fixture(scope="module")
def quick_estimates():
    return {n: estimate(calibrate.trace_of(calibrate.ROWS_BY_NUMBER[n])) for n in QUICK}


@pytest.mark.parametrize("number", QUICK)
def test_row_within_10_percent(quick_estimates, number):
    row = calibrate.ROWS_BY_NUMBER[number]
    assert abs(quick_estimates[number].total_us / row.measured_us - 1) <= BOUND.get(number, ROW_BOUND)


def test_median_within_7_percent(quick_estimates):
    errors = [abs(quick_estimates[n].total_us / calibrate.ROWS_BY_NUMBER[n].measured_us - 1) for n in QUICK]
    assert statistics.median(errors) <= MEDIAN_BOUND


def test_row_chunk_128_to_stream_ratio(quick_estimates):
    measured = 378 / 186  # 2.03; the model gives 1.92 (each row's error, not the ratio, is what was fitted)
    assert quick_estimates[2].total_us / quick_estimates[4].total_us == pytest.approx(measured, rel=0.10)


def test_row_chunk_1_per_iteration_cost():
    """Row 1 (25,600 iterations, 37318 us) is too slow for the test suite: check its per-iteration cost on 1/10."""
    row = calibrate.ROWS_BY_NUMBER[1]
    small = calibrate.Row(1, row.file, row.kernel, "n=2560", (((2560,), "float32"), ((2560,), "float32")), (), 0)
    est = estimate(calibrate.trace_of(small))
    per_iteration = (est.total_us - est.params.startup_ns.value / 1000) / 2560
    measured = (row.measured_us - est.params.startup_ns.value / 1000) / 25600
    assert per_iteration == pytest.approx(measured, rel=0.10)  # row 1 is -6.5 % on its full 25,600 iterations
    assert quick_ratio(est, 2560) == pytest.approx(37318 / 378, rel=0.10)  # measured 98.7, model ~101


def quick_ratio(est_tiled_1, n: int) -> float:
    """Latency ratio ROW_CHUNK 1 / ROW_CHUNK 128 extrapolated to n = 25600 from per-iteration costs."""
    row2 = calibrate.ROWS_BY_NUMBER[2]
    est_128 = estimate(calibrate.trace_of(row2))
    startup = est_128.params.startup_ns.value / 1000
    tiled_1 = startup + (est_tiled_1.total_us - startup) * 25600 / n
    return tiled_1 / est_128.total_us


def test_profiled_rows_report_the_measured_dma_transfer_counts(quick_estimates):
    assert quick_estimates[6].dma_transfer_count == 3 and quick_estimates[7].dma_transfer_count == 6
    # Measured, FREE_DIM 1000 (26 us) beats 2000 (28 us): its second iteration's loads, into fresh rotation buffers
    # and depending on nothing, lead their trigger stream and move during the first iteration's add (schedule.py).
    # The model keeps that order, and the ratio (measured 0.93, model 0.87) within 10 %.
    six, seven = quick_estimates[6].total_us, quick_estimates[7].total_us
    assert seven < six
    assert seven / six == pytest.approx(26 / 28, rel=0.10)


@pytest.mark.large
@pytest.mark.parametrize("number", (9, 10))
def test_big_conv_rows(number):
    row = calibrate.ROWS_BY_NUMBER[number]
    trace = calibrate.trace_of(row)  # ~9,400 instructions
    est = estimate(trace)  # its CPU time is a benchmark column (benchmarks/calibrate.py), not a timed test
    assert estimate(trace).summary_text() == est.summary_text()  # deterministic
    assert abs(est.total_us / row.measured_us - 1) <= 0.10
    if number == 10:
        assert est.mfu == pytest.approx(row.measured_mfu, abs=0.05)


def test_cli_profile_prints_summary_and_writes_timeline(tmp_path):
    html = tmp_path / "stream.html"
    cmd = [sys.executable, str(ROOT / "tilec_cli.py"), "profile", str(ROOT / "benchmarks" / "kernels" / "asst.py"),
           "--kernel", "vector_add_stream_200", "--shape", "25600", "--shape", "25600", "--html", str(html)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    fields = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line and not line.startswith(" ")
                  and " " in line and line.split(" ", 1)[0].islower())
    assert fields["dma_transfer_count"] == "3"
    assert 0.000010 < float(fields["total_time"]) < 0.000020
    assert "asst.py" in done.stdout and html.exists() and "<svg" in html.read_text()


@pytest.mark.parametrize("extra, message", [
    (["--shape", "25600"], "needs --kernel"),
    (["--kernel", "vector_add_stream", "--shape", "25600"], "no input given for kernel parameter(s) b_vec"),
    (["--kernel", "vector_add_stream", "--shape", "25600x", "--shape", "3"], "bad --shape"),
    (["--kernel", "vector_add_stream", "--shape", "a_vec=256", "--shape", "b_vec=256", "--shape", "c=256"],
     "has no parameter(s) c"),
    (["--kernel", "matrix_transpose", "--shape", "100x100"], "AssertionError: Matrix dimensions not divisible"),
    (["--kernel", "vector_add_stream_200", "--shape", "25600", "--shape", "25600", "--html",
      "/nonexistent-dir/x.html"], "error: cannot write /nonexistent-dir/x.html"),
])
def test_cli_profile_user_mistake_is_an_error_not_a_traceback(extra, message):
    cmd = [sys.executable, str(ROOT / "tilec_cli.py"), "profile", str(ROOT / "benchmarks" / "kernels" / "asst.py"),
           *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr


def test_cli_profile_tl_program_attributes_time_to_tl_lines(tmp_path):
    html = tmp_path / "va.html"
    cmd = [sys.executable, str(ROOT / "tilec_cli.py"), "profile", str(ROOT / "examples" / "vector_add.tl"),
           "-D", "L=2048", "--html", str(html)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = done.stdout[done.stdout.index("busy time by .tl source line:"):]
    assert "line 7 " in report  # `z[i] = x[i] + y[i]` is line 7 of vector_add.tl
    assert "(.tl line 7)" in html.read_text()  # the hover names the .tl line too
