"""NKI 0.1 kernels for tests/nki/test_psum_banks.py: PSUM tiles at and over one bank, and block tensors in PSUM."""
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def block_psum(a, b, blocks=8):
    """`blocks` matmuls a.T @ b, each into its own block of one PSUM block tensor, summed on VectorE."""
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.hbm)
    at = nl.load(a)
    bt = nl.load(b)
    acc = nl.ndarray((blocks, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)  # BLOCKS
    for i in nl.affine_range(blocks):
        acc[i] = nisa.nc_matmul(at, bt)
    s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
    s[...] = nisa.tensor_copy(acc[0])
    for i in nl.sequential_range(1, blocks):
        s[...] = nisa.tensor_tensor(s, acc[i], op=nl.add)
    nl.store(out, s)
    return out


@nki.jit
def small_blocks_and_tiles(a, b):
    """Four (128, 256) fp32 blocks (two fit a bank: 2 banks) beside six (128, 512) tiles: 8 banks."""
    out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.hbm)
    at = nl.load(a)
    bt = nl.load(b)
    acc = nl.ndarray((4, nl.par_dim(128), 256), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(4):
        acc[i] = nisa.nc_matmul(at, bt[:, 0:256])
    tiles = []
    for j in range(6):
        t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        t[...] = nisa.nc_matmul(at, bt)
        tiles.append(t)
    s = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
    s[...] = nisa.tensor_copy(acc[0])
    for i in nl.sequential_range(1, 4):
        s[...] = nisa.tensor_tensor(s, acc[i], op=nl.add)
    for t in tiles:
        s[...] = nisa.tensor_tensor(s, t[:, 0:256], op=nl.add)
    nl.store(out, s)
    return out


@nki.jit
def across_blocks(a, b):
    """One VectorE copy reading two PSUM blocks (two banks) at once."""
    out = nl.ndarray((2, 128, 512), dtype=nl.float32, buffer=nl.hbm)
    at = nl.load(a)
    bt = nl.load(b)
    acc = nl.ndarray((2, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(2):
        acc[i] = nisa.nc_matmul(at, bt)
    s = nl.ndarray((2, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.sbuf)
    s[0:2] = nisa.tensor_copy(acc[0:2])  # ACROSS
    for i in nl.affine_range(2):
        nl.store(out[i], s[i])
    return out


@nki.jit
def psum_tile(a, dtype_name="float32", cols=512):
    """A (128, cols) PSUM tile of nl.<dtype_name>, zeroed, copied out."""
    dtype = getattr(nl, dtype_name)
    out = nl.ndarray((128, cols), dtype=dtype, buffer=nl.hbm)
    t = nl.zeros((128, cols), dtype=dtype, buffer=nl.psum)  # TILE
    s = nl.ndarray((128, cols), dtype=dtype, buffer=nl.sbuf)
    s[...] = nisa.tensor_copy(t)
    nl.store(out, s)
    return out
