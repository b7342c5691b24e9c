"""Hand-written NKI kernels in the course assignment's style (seed 004): the interpreter's test corpus and the
performance model's calibration workloads (calibration.md rows 1-12).

The modules import `neuronxcc.nki` like any user kernel; load them with `tilec.nki.api.load_kernel_file(path, name)`
or import them after `import tilec` (which installs the neuronxcc shim when the real package is absent).

    asst.py    Part 1: vector_add_naive/tiled/stream (with the ROW_CHUNK / FREE_DIM variants the students run),
               matrix_transpose, and the tiled matmul nki_matmul_tiled_
    conv2d.py  Part 2: fused_conv2d_maxpool (conv2d + bias + maxpool, calibration rows 9-12)
"""
