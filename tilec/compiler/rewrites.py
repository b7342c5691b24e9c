"""The source rewrites that run before lowering, in order: each turns statements no rule maps yet into ordinary
statements over new temporaries (or views), then checks the rewritten kernel as if the user had written it
(rewrite.py has their shared steps). One flat list, like the pipeline's passes: a rewrite that needs another's
result comes after it."""
from __future__ import annotations

from tilec.compiler.channel_pack import split_channel_columns
from tilec.compiler.const_split import split_constant_outputs
from tilec.compiler.continue_split import split_continued_reductions
from tilec.compiler.distance_split import split_row_column_terms, split_squared_distances
from tilec.compiler.fission import distribute_reductions
from tilec.compiler.gap_split import split_gapped_reductions
from tilec.compiler.init_split import split_broadcast_inits
from tilec.compiler.heads_split import split_packed_heads
from tilec.compiler.inplace_split import split_in_place_epilogues
from tilec.compiler.lang_split import (drop_identity_casts, fold_value_sizes, split_conv_layouts,
                                      split_mixed_broadcasts, split_modulo_reads, split_self_products)
from tilec.compiler.matvec_split import split_batched_matvec, split_vector_matrix
from tilec.compiler.merge_split import merge_reduced_runs
from tilec.compiler.operand_split import split_contraction_operands
from tilec.compiler.pad_split import split_padded_reads
from tilec.compiler.permute_split import (split_permuted_eltwise, split_reshape_copies, split_shifted_reads,
                                          split_transposed_reads)
from tilec.compiler.packed_rows import split_short_rows
from tilec.compiler.reduce_split import split_broadcast_reductions, split_total_reductions
from tilec.compiler.scalar_split import split_scalar_reads
from tilec.compiler.scale_split import split_column_scales
from tilec.compiler.store_split import split_shifted_stores
from tilec.compiler.sum_split import split_summed_products
from tilec.compiler.tconv_pad import split_padded_tconvs
from tilec.compiler.tconv_split import split_floor_loops, split_transposed_convs
from tilec.compiler.view_split import split_merged_dims
from tilec.compiler.rewrite_names import check, follow, moved_sums
from tilec.lang import syntax as sx

REWRITES = (
    split_padded_tconvs,  # `Y[n, k, 2*y + a, ..] += (X[n, c, y + a - t, ..] ?? 0) * Wt[c, k, 2*t + 1 - a, ..]` (tconv_pad)
    split_floor_loops,  # `X[n, c, y / 2, x / 2] * Wt[c, k, y % 2, x % 2]`: y as 2 * y_q + y_r (tconv_split.py)
    split_merged_dims,  # `Y[n, c * G + g] = X[n, g * Cg + c]`: views [.., Cg, G, ..] (view_split.py)
    split_transposed_convs,  # `Y[n, k, y, a, x, b] += X * Wt[c, k, a, b]`: T[n, k, a, b, y, x] first (same)
    merge_reduced_runs,  # `G += F[n, c, h, w] * F[n, d, h, w]`: (h, w) as one loop over F's view (merge_split.py)
    split_packed_heads,  # `P[h, i, j] += Q[i, h * D + d] * ..`: Q copied as Q_h[h, i, d] first (heads_split.py)
    distribute_reductions,  # two reductions in one loop nest: one nest each (fission.py)
    split_continued_reductions,  # `Y = 0; for k: Y += A B; for k: Y += C D`: a chain (continue_split.py)
    split_squared_distances,  # `D += (A[i, k] - B[j, k])^2`: norms + one matmul (distance_split.py)
    split_column_scales,  # `S = dot[i, j] * r[j]` after `dot += A[i, k] * B[j, k]`: B's rows scaled (scale_split.py)
    split_row_column_terms,  # `Dm = aa[i] - 2 * ab[i, j] + bb[j]`: the terms in ab's matmul (distance_split)
    split_summed_products,  # `Y += A * B + C * D`: one contraction a term, each from the last (sum_split.py)
    split_batched_matvec,  # `y[b, m] += A[b, m, k] * x[b, k]`: x as [B, K, 1] (matvec_split.py)
    split_vector_matrix,  # `Y[t, d] += w[l] * Hs[l, t, d]`: w as [1, L], Y as [1, T, D] (same)
    split_shifted_stores,  # `Y[s, D + d] = f(..)`: f into a temporary, then a copy (store_split.py)
    split_broadcast_inits,  # `P[h, i, j] = Mk[i, j]` before a sum: added after it (init_split.py)
    fold_value_sizes,  # `Y = S / (H * W)`: the sizes' constant folded into one number (lang_split)
    drop_identity_casts,  # `f32(h[i, j])` of an f32 tensor: `h[i, j]` (lang_split)
    split_constant_outputs,  # `Y[0, j] = f(X[j])`: a unit loop shifted by 0, a copy (const_split)
    split_conv_layouts,  # HWIO weights, NHWC tensors: permuted in their own statements (lang_split)
    split_modulo_reads,  # `X[i % 4, j]`: one copy per repeat into a temporary (lang_split)
    split_self_products,  # `G += A[i, k] * A[j, k]`: the second read of a copy (lang_split)
    split_scalar_reads,  # `Y[i, j] = X[i, j] * gam[0]`: gam[0] as a column gam_0[i, 0] first (scalar_split.py)
    split_mixed_broadcasts,  # `(X - mu[n, k]) * g[k]`: g widened to [n, k] first (lang_split)
    split_padded_reads,  # padded reads in element-wise statements: copied first (pad_split.py)
    split_total_reductions,  # `s[0] += X[i, j]`: rows to a column, then one row (reduce_split.py)
    split_gapped_reductions,  # `mu[c] += X[n, c, h, w]`: over h, w first, then over n (gap_split.py)
    split_broadcast_reductions,  # `s[i] += exp(X[i, j] - m[i])`: the terms first (reduce_split.py)
    split_contraction_operands,  # `O += exp(S[i, t] - m[i]) * V[t, d]`: each operand first (operand_split.py)
    split_transposed_reads,  # `Y[i, j] = X[i, j] + X[j, i]`: X[j, i] permuted first (same)
    split_permuted_eltwise,  # `Y[j, i] = relu(X[i, j])`: element-wise, then a permute (permute_split)
    split_reshape_copies,  # `Y[h, s, d] = X[s, h * D + d]`: one copy per h (permute_split.py)
    split_shifted_reads,  # `Y[i, j] = X[i, j + 1] - X[i, j]`: the shifted read copied first (same)
    split_in_place_epilogues,  # `O += P * V` then `O = O / z`: O_acc first (inplace_split.py)
    split_short_rows,  # `Y[i, c] = X[i, c] * g[c]`, C short: k rows a partition, g replicated (packed_rows.py)
    split_channel_columns,  # `Y[n, c, y, x] = X[..] * g[c]`, C < 128: (c, part of y) on partitions (channel_pack.py)
)


def source_rewrites(program, directives: tuple[sx.Directive, ...] = ()):
    """The program after every rewrite of REWRITES (each returns the same object when it has nothing to do)."""
    return rewritten_with(program, directives)[0]


def rewritten_with(program, directives: tuple[sx.Directive, ...]) -> tuple:
    """(the program after every rewrite, the directives over it). The rewrites run whatever the schedule says; a
    directive over the loops of a sum a rewrite moved into a temporary goes to the temporary (rewrite_names.follow),
    and one naming a tensor or loop a rewrite removed or renamed is an error at its line (rewrite_names.check)."""
    for rewrite in REWRITES:
        rewritten = rewrite(program)
        module = rewrite.__module__.rsplit(".", 1)[-1]
        if rewritten is not program:
            directives = follow(directives, moved_sums(program, rewritten), rewritten)
        check(program, rewritten, directives, f"the source rewrite {rewrite.__name__} ({module}.py)")
        program = rewritten
    return program, directives
