"""Part 2 of the course assignment (seed 004): a fused conv2d + bias + maxpool kernel in the assignment's style.

Structure (calibration.md rows 9-12):
- the weights are loaded and transposed once, before the main loop, into w_T[c_in (partitions), tap, c_out];
- the main loop walks (image, pair of output rows); for each pair it loads the input rows it needs once,
  then for each out-channel tile and each of the two output rows accumulates in one PSUM bank
  one nc_matmul per (in-channel tile, filter tap): stationary 128 x 128 weights, moving 128 x out_width pixels;
- the bias is added while evacuating PSUM; max pooling works on the two rows at once (pool_size 1 or 2).

Shapes: X (B, C_in, H, W), W (C_out, C_in, K, K), bias (C_out,); C_in, C_out multiples of 128; stride 1; the input is
pre-padded; out_width = W - K + 1 <= 512 (one PSUM bank of fp32) and the output height is even.
"""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.compiler.skip_middle_end_transformations
@nki.jit
def fused_conv2d_maxpool(X, W, bias, pool_size=1):

    batch_size, in_channels, input_height, input_width = X.shape
    out_channels, in_channels_, filter_height, filter_width = W.shape
    out_channels_ = bias.shape[0]

    assert in_channels_ == in_channels and out_channels_ == out_channels, "shape mismatch between X, W and bias"

    out_height = input_height - filter_height + 1
    out_width = input_width - filter_width + 1
    out_pool_height = out_height // pool_size
    out_pool_width = out_width // pool_size

    # Two output rows per step: the unit of max pooling
    ROWS = 2
    assert out_height % ROWS == 0 and out_width % pool_size == 0 and pool_size in (1, 2)

    # Tile sizes: channels go on the 128 partitions
    TILE_C = nl.tile_size.pmax  # 128
    n_tiles_c_in = in_channels // TILE_C
    n_tiles_c_out = out_channels // TILE_C
    n_taps = filter_height * filter_width
    in_rows = ROWS + filter_height - 1

    X_out = nl.ndarray(
        shape=(batch_size, out_channels, out_pool_height, out_pool_width),
        dtype=X.dtype,
        buffer=nl.hbm,
    )

    # ---- Phase 1: weights, loaded and transposed once -------------------------------------------------------
    # w_T[:, (co * n_tiles_c_in + ci) * n_taps + tap, :] is the (c_in, c_out) stationary tile of one filter tap
    w_T = nl.ndarray((TILE_C, n_tiles_c_out * n_tiles_c_in * n_taps, TILE_C), dtype=W.dtype, buffer=nl.sbuf)
    for co in nl.affine_range(n_tiles_c_out):
        for ci in nl.affine_range(n_tiles_c_in):
            # (c_out, c_in, kh, kw) block: c_out on partitions, straight from HBM
            w_raw = nl.ndarray((TILE_C, TILE_C, filter_height, filter_width), dtype=W.dtype, buffer=nl.sbuf)
            nisa.dma_copy(
                dst=w_raw,
                src=W[co * TILE_C:(co + 1) * TILE_C, ci * TILE_C:(ci + 1) * TILE_C, :, :],
            )
            for i in nl.affine_range(filter_height):
                for j in nl.affine_range(filter_width):
                    # Transpose each tap to (c_in, c_out) on the tensor engine, then evacuate PSUM
                    w_tap_psum = nisa.nc_transpose(w_raw[:, :, i, j])
                    w_T[:, (co * n_tiles_c_in + ci) * n_taps + i * filter_width + j, :] = nisa.tensor_copy(
                        w_tap_psum, dtype=W.dtype
                    )

    # Bias as one fp32 column per out-channel tile
    bias_sb = nl.ndarray((TILE_C, n_tiles_c_out), dtype=nl.float32, buffer=nl.sbuf)
    bias_tiles = bias.reshape((n_tiles_c_out, TILE_C, 1))
    for co in nl.affine_range(n_tiles_c_out):
        nisa.dma_copy(dst=bias_sb[:, co:co + 1], src=bias_tiles[co])

    # ---- Phase 2: main loop over images and pairs of output rows -------------------------------------------
    for b in nl.affine_range(batch_size):
        for r in nl.affine_range(out_height // ROWS):

            # The input rows this pair of output rows needs, all in-channel tiles
            x_rows = nl.ndarray((TILE_C, n_tiles_c_in, in_rows, input_width), dtype=X.dtype, buffer=nl.sbuf)
            for ci in nl.affine_range(n_tiles_c_in):
                nisa.dma_copy(
                    dst=x_rows[:, ci, :, :],
                    src=X[b, ci * TILE_C:(ci + 1) * TILE_C, r * ROWS:r * ROWS + in_rows, :],
                )

            for co in nl.affine_range(n_tiles_c_out):
                conv_rows = nl.ndarray((TILE_C, ROWS, out_width), dtype=X.dtype, buffer=nl.sbuf)

                for rr in nl.affine_range(ROWS):
                    # One PSUM bank accumulates the whole (c_in, kh, kw) reduction of one output row
                    res_psum = nl.zeros((TILE_C, out_width), nl.float32, buffer=nl.psum)
                    for ci in nl.affine_range(n_tiles_c_in):
                        for i in nl.affine_range(filter_height):
                            for j in nl.affine_range(filter_width):
                                res_psum += nisa.nc_matmul(
                                    w_T[:, (co * n_tiles_c_in + ci) * n_taps + i * filter_width + j, :],
                                    x_rows[:, ci, rr + i, j:j + out_width],
                                )

                    # Add the bias while moving the row out of PSUM
                    conv_rows[:, rr, :] = nisa.tensor_scalar(
                        res_psum, nl.add, bias_sb[:, co:co + 1], dtype=X.dtype
                    )

                if pool_size == 2:
                    # Max over the two rows, then over column pairs
                    row_max = nisa.tensor_tensor(conv_rows[:, 0, :], conv_rows[:, 1, :], op=nl.maximum)
                    pooled = nisa.tensor_reduce(nl.max, row_max.reshape((TILE_C, out_pool_width, 2)), axis=2)
                    nisa.dma_copy(
                        dst=X_out[b, co * TILE_C:(co + 1) * TILE_C, r, :],
                        src=pooled,
                    )
                else:
                    nisa.dma_copy(
                        dst=X_out[b, co * TILE_C:(co + 1) * TILE_C, r * ROWS:(r + 1) * ROWS, :],
                        src=conv_rows,
                    )

    return X_out
