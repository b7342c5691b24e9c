"""The window pools' knobs (rules_pool.py and the pool_*.py files it is split into): the constants the
costs and tests set, read through this module (`knobs.TAPS`) so that a test's monkeypatch reaches every file."""

HALF = ("f16", "bf16")
SHARE_MIN = 100  # elements per partition below which one engine does a whole combine
MIN_INTERLEAVED = 4  # block-local output rows an Interleave computes interleaved (fewer: the seams dominate)
PSUM = "auto"  # the pass along x from PSUM: "auto" (the model's costs decide), "on" where possible, "off" (tests)
TAPS = "auto"  # through PSUM, TensorE sums the taps of 16-bit sums: "auto" (the costs), "on", "off" (tests)
FULL_ROWS: int | None = None  # output rows per band TensorE sums whole with the taps (None: the costs decide)
WHOLE_SLACK = 0.02  # the fewest such rows whose estimate is within this part of the best (measured: avgpool 3x3 s1
#                     bf16 batch 8, 28 x 28: 3 rows 43.65 us, 4 rows 44.77; the estimate 1505 / 1491 ns per band)
PEEL_TILES = 3  # partition tiles from which a pool through PSUM peels its first and last (`WindowPool.build`; >= 3)
WHOLE_PEELED = True  # with a peeled first tile, the whole rows from a kernel-long estimate (peeled_whole; False: tests)
ALIGN_CUTS = True  # a pass along y's combines change engines at one row (combine_shared; False: tests, measures)
PAIR_ENDS = True  # count_include_pad=False: the border rows on both sides of TensorE's whole rows summed and scaled
#                   as one pair (band's counted_pass; False: tests, measures)
SHARE_BANK = True  # the whole rows' PSUM sums in the last chunk's bank when they fit (tensor_x_pass; False: tests)
PEEL_SBUF_PART = 2  # the peeled bodies' buffers may take at most this part of SBUF
BLOCK_STORES = True  # blocks of rows stored once per block when the model's costs say so (False: per band; tests)
BLOCK_STORES_SBUF_PART = 8  # ...when the tile-wide output buffer takes at most this part of SBUF
INTERLEAVED_BANDS = 4  # bands of an Interleave: its loads, the two engines and its stores overlap (the stores to Y
#                        are ordered, each one DMA latency after the last, so few and large)
REDUCE = "auto"  # the pass along x from SBUF as window tensor_reduces on VectorE (pool_window.choose_reduce): "auto"
#                 (the model's costs decide), "on" where possible, "off" (tests, measures)
IMAGES: str | int = "auto"  # channel rows stacked per partition (pool_stack.choose_images): "auto" (the model's
#                             costs decide), "off", or k (forced where it fits; tests, measures)
EVEN_BANDS = True  # a max or min pool's bands split its rows evenly when the costs say so (pool_bands.even_band;
#                   False: window_pool_plan's ~16 KiB bands, tests, measures)
PLAN_GAIN = 0.98  # a plan the costs estimate (stacked images, even bands) replaces window_pool_plan's when its
#                  estimate is below this part of the default's (pool_stack.py, pool_bands.py)
DOUBLING = True  # windows of 4 taps or more from SBUF by doubling (pool_doubling.py; False: tests, measures)
ONE_BLOCK_DMA = True  # a band's (or a tile's) G row blocks loaded / stored as one DMA with blocks (pool_window.
#                       one_store; False: one DMA per block, tests, measures)
SEAMS_PER_BLOCK = 1  # a max or min pool interleaves its row blocks only with at most this many seam rows per block
#                     (rules_pool.interleaved; more: the row blocks, each band's blocks one DMA)
TENSOR_ROWS: int | None = None  # input rows per band whose pass along x TensorE sums beside the vector engines
#                                (pool_window.choose_share: None the model's costs decide, 0 off; tests, measures)
IMAGE = True  # row blocks' input rows loaded once into a block image, bands as its views (pool_image.py; False:
#               a buffer per band with its halo rows, tests, measures)
IMAGE_SBUF_PART = 4  # ...when the images of the input and of the pass along x take at most this part of SBUF
ACROSS = "auto"  # blocks of output rows over several partition tiles (pool_costs.across_blocks): "auto" (the
#                  model's costs decide), "on" where possible, "off" (tests, measures)
