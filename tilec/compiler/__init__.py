"""The compiler: .tl program -> tensor computations -> operation selection -> schedule -> loop-nest IR -> NKI.

    nest.py       level A: the program as loops over buffers (one to one from .tl); nest_eval.py its NumPy meaning
    lower.py      loop nests -> Comp records (what each statement computes)
    select.py     Comp -> ConvOp / PoolOp / TransposeOp / EltwiseOp / ReduceOp (records in ops.py), fusing
                  epilogues; select_eltwise.py: broadcasts and fused element-wise chains; select_reduce.py:
                  reductions of trailing dimensions (row sums/max/min, built by build_reduce.py)
    schedule.py   directives (the schedule language) folded into one plan per op; the default schedule
    build_*.py    op + plan -> loop-nest IR (ir.py), checked by verify.py after every pass; names.py gives the
                  derived buffer and loop names, unique against the user's names by construction
    passes.py     hoist, unroll, legalise, allocation report
    squeeze.py    drops unit dimensions from tiles and compiler-made views (2-D kernels read like hand-written NKI)
    codegen.py    IR -> view-model -> templates/*.py.jinja -> NKI module text
    pipeline.py   the flat list of passes;  api.py  compile_file / Compiled.run;  regen.py  generated/
"""
