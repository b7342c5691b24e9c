"""The compiler: .tl program -> tensor computations -> operation selection -> schedule -> loop-nest IR -> NKI.

    nest.py       level A: the program as loops over buffers (one to one from .tl); nest_eval.py its NumPy meaning;
                  primitives.py split/reorder/unroll/partition/stage/compute_at/reverse_compute_at/bind_expr on it;
                  tensorize.py matches its statements against the Target's instruction table (tilec/target.py)
    lower.py      loop nests -> Comp records (what each statement computes)
    select.py     Comp -> ConvOp / PoolOp / TransposeOp / EltwiseOp / ReduceOp (records in ops.py);
                  select_conv.py: contractions and the epilogues fused on their PSUM eviction; select_pool.py: window
                  pools; select_eltwise.py: broadcasts and fused element-wise chains; select_copy.py: shifts,
                  upsampling, concatenation; select_reduce.py: reductions of a run of dimensions (row sums/max/min
                  by rules.reduce, short rows by build_reduce.py; column sums)
    schedule.py   directives (the schedule language) folded into one plan per op; the default schedule
    rules.py      nests scheduled as lists of primitives on level A (lower_tiles.py lowers them): element-wise here,
                  rules_transpose.py transposes/permutes, rules_reduce.py row reductions, rules_colreduce.py column
                  reductions, rules_move.py copies, rules_pool.py window pools (rules.py re-exports the families)
    build_*.py    op + plan -> loop-nest IR (ir.py), checked by verify.py after every pass (build_rowchain.py: runs
                  of row ops fused into one pass over row tiles; build_colreduce.py: sums over leading axes);
                  names.py gives the derived buffer and loop names, unique against the user's names by construction
    passes.py     hoist, unroll, legalise, allocation report
    squeeze.py    drops unit dimensions from tiles and compiler-made views (2-D kernels read like hand-written NKI)
    codegen.py    IR -> view-model -> tilec/templates/*.py.jinja -> NKI module text
    pipeline.py   the flat list of passes;  api.py  compile_file / Compiled.run;  regen.py  generated/
"""
