"""tilec's CPU interpreter of the NKI 0.1 API (`neuronxcc.nki`) and the NKI 0.6 API (`nki`), on one core.

    api.py        simulate / simulate_traced (numerics=False: trace-only) / load_kernel_file / run_file
    shim.py       serves `import neuronxcc.nki[.language|.isa]` from this package when neuronxcc is absent
    top.py        nki.jit / baremetal / benchmark / simulate_kernel / nki.compiler / nki.typing
    kernel.py     running a kernel: HBM argument wrapping, outputs, SPMD grids
    language.py   nki.language        isa.py  nki.isa          alu.py  operators and activation functions
    tensor.py     tensors as affine views (indexing, reshape, broadcast)   indexing.py  nl.arange / mgrid
    core.py       checked reads/writes, fresh results, assignment, PSUM accumulation
    runtime.py    the state of one run: buffers, loops, capacity          checks.py  the hardware rules
    races.py      affine_range loop-carried dependence detection          recorder.py trace accesses, DMA chunks
    dtypes.py     NKI dtypes and promotion                                 rules.py  targets and error classes
    hooks.py      the performance-model hook used by nki.benchmark        blas.py   single-threaded BLAS during a run
    __main__.py   python -m tilec.nki SCRIPT.py | --install-pth | --remove-pth
  NKI 0.6 (`import nki`; the same core, tensors and trace):
    shim06.py     serves `import nki[.isa|.language|.typing]`   top06.py  nki.jit / nki.simulate / Run06 (0.6 runs)
    isa06.py      nki.isa: dst-first instructions, accumulate=  language06.py  nki.language

Importing this package is cheap and side-effect free; `tilec.nki.shim.install()` activates the import shim.
"""
