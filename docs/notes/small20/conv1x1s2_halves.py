"""Hand-edited from tilec's conv1x1s2 kernel at batch 8 (small20, not generated): 64 input channels fill only
partitions 0-63, so every band load used DMA engines 0-7 of 16 (nki-spec §2.5: an engine serves 8 partitions). Here
each image's two row bands load side by side onto partitions 0-63 and 64-127 (all 16 engines), and the weights are
transposed once onto both halves (Wt loaded into two column halves of Wt_rows), so the matmul of band y_b reads its
stationary and moving at partition 64 * y_b (32 < P <= 64: start 0 or 64, nki-spec §1.6).

    tilec profile conv1x1s2_halves.py --shape 8x64x56x56 --shape 128x64     # 42.9 us (generated: 58.2 us)
    tilec nki-run conv1x1s2_halves.py --shape 8x64x56x56 --shape 128x64     # max |error| vs NumPy 1.1e-5 (fp32)
"""
import nki
import nki.isa as nisa
import nki.language as nl

BAND = 14


@nki.jit
def conv1x1s2(X, Wt):
    assert X.shape == (8, 64, 56, 56), ('conv1x1s2 was compiled for X of shape (8, 64, 56, 56); '
                                        'recompile with tilec compile -D N=... -D C=... -D H=... -D W=...')
    assert Wt.shape == (128, 64), ('conv1x1s2 was compiled for Wt of shape (128, 64); '
                                   'recompile with tilec compile -D K=... -D C=...')
    Y = nl.ndarray((8, 128, 28, 28), dtype=nl.float32, buffer=nl.shared_hbm)

    # ---- weights Wt: contraction-major, resident in SBUF
    Wt_T = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)  # tl:10
    Wt_rows = nl.ndarray((128, 2, 64), dtype=nl.float32, buffer=nl.sbuf)  # tl:10
    nisa.dma_copy(dst=Wt_rows[:, 0], src=Wt)  # tl:10
    nisa.dma_copy(dst=Wt_rows[:, 1], src=Wt)  # tl:10
    Wt_tp = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)  # tl:10
    nisa.nc_transpose(dst=Wt_tp, data=Wt_rows)  # tl:10
    nisa.tensor_copy(dst=Wt_T, src=Wt_tp)  # tl:10

    # ---- main: Y by row bands
    for n in range(8):
        X_band = nl.ndarray((128, 27, 56), dtype=nl.float32, buffer=nl.sbuf)  # tl:10
        nisa.dma_copy(dst=X_band[0:64], src=X[n, :, 0:27])  # tl:10
        nisa.dma_copy(dst=X_band[64:128], src=X[n, :, 28:55])  # tl:10
        for y_b in range(2):
            Y_band = nl.ndarray((128, 14, 28), dtype=nl.float32, buffer=nl.sbuf)  # tl:8
            Y_acc = nl.ndarray((128, 14, 28), dtype=nl.float32, buffer=nl.psum)  # tl:8
            nisa.nc_matmul(dst=Y_acc, stationary=Wt_T[y_b * 64:y_b * 64 + 64], moving=X_band[y_b * 64:y_b * 64 + 64, 0:27:2, 0:55:2], accumulate=False)  # tl:10
            nisa.activation(dst=Y_band, op=nl.copy, data=Y_acc)  # tl:8
            nisa.dma_copy(dst=Y[n, :, y_b * 14:y_b * 14 + 14], src=Y_band)  # tl:8
    return Y
