"""tilec.perf: a calibrated performance model of one Trainium2 NeuronCore over the interpreter's instruction trace.

Modules: params (the per-target table, every number with its source), costs (one instruction in isolation),
deps (true/anti/output dependences through buffer regions), schedule (one list-scheduling pass), throttle (the Trn2
TensorE warm-up limit), metrics and api (the Estimate: total time, engine activity, MFU/HFU/MBU, memory peaks),
report (summary text, time per source line), timeline (the HTML picture). It reads only `tilec.trace`; it never
imports the interpreter or the compiler.

How the model reasons
---------------------
* Four compute engines (TensorE, VectorE, ScalarE, GpSimdE) each execute their instructions in program order; an
  instruction starts when its engine is free and every instruction it depends on (through the regions it reads and
  writes) has finished. Costs come from the nki-spec §2.4 table at each engine's clock plus a per-instruction
  overhead (tilec/perf/costs.py has the formulas). An SBUF operand whose innermost free stride exceeds 16 bytes
  doubles the instruction's streaming part (spec §2.2 ARCH2 stride penalty, documented for v2, [inferred] for v3 and
  for TensorE moving operands); the stride also decides whether v3 performance mode gets 4x or 2x.
* TensorE work on trn2 is limited by the warm-up throttle (spec §2.3): in the 3 µs after TensorE work begins, or
  after its utilization over a 3 µs window fell below 50 %, it may be busy at most 1.5 µs; an instruction past that
  waits for the end of the 3 µs (the step shape is inferred, see throttle.py). A long stream pays ~1.5 µs once; a
  bursty kernel pays it per burst longer than 1.5 µs. trn1 has no throttle.
* A DMA transfer (one `dma_copy`) waits for its data dependences plus a 1.15 us latency (semaphore-to-start and
  descriptor generation), its trigger issues in order on its trigger stream (the engine that consumes a load, or
  produced what a store reads; a transfer that depends on nothing leads its stream), then occupies the DMA engines
  of its partitions (8 partitions per engine, up to 16 engines) for a small time per descriptor and its bytes at 23
  B/ns per engine, each engine running its queue's transfers in order and the engines in parallel (params.DMA_QUEUE;
  TILEC_MODEL_DMA_QUEUE=stream is the old rule, where a transfer waited for the previous one to start anywhere). A
  transfer writing HBM completes 650 ns after its last byte (the HBM write acknowledgement, fitted to row 8); only
  then is its SBUF source free. Tiny-DMA loops (rows 1, 2, 4) are bound by the latency chain load -> compute ->
  store -> next load on one stream; the 1024x1024 transpose (row 8) by the chain copy -> store -> acknowledgement ->
  copy over its 2 rotating result buffers; a conv whose row loads feed TensorE (rows 9-12, from the public kernel
  behind them) streams thousands of DMAs beside the matmuls. schedule.py's docstring says why one model fits the
  three. Tiles allocated in a loop body rotate through 2 buffers per allocation site, and a buffer refilled whole by
  DMA gets a new copy per load (16 deep), but only while the copies fit in the Target's usable SBUF beside every
  site's first buffer (the "fit" rule, params.SBUF_ROTATION; the allocator's multi-buffering policy is not
  documented). TILEC_MODEL_SBUF_ROTATION=free grants them whether they fit or not, as a what-if. PSUM tiles are
  placed in the 8 banks of 2 KiB (one tensor per bank, MIG v2.32.0) in program order: a site's rotation buffer only
  where a bank is free, and a tile in a bank another tile held waits for that tile to end (schedule.place_psum,
  params.PSUM_ROTATION; TILEC_MODEL_PSUM_ROTATION=free is the old unchecked rule).
* Dependences through HBM are tracked per byte range: an HBM access is the span [lo, hi) of its access pattern, so
  two DMAs writing disjoint but interleaved rows of one tensor wait for each other. Whether neuronxcc orders such
  DMAs is not documented (docs/notes/model8.md); benchmarks/trn2_hbm_order.py is the Trn2 measurement that decides
  it, and TILEC_MODEL_HBM_DEPS=pattern runs the other outcome (conflict only on a common element, the interpreter's
  race rule, tilec/patterns.py) for what-if numbers.
* TensorE transposes on trn2 run in transpose mode (ARCH3, v2.32.0 trainium2_arch.rst "Built-in Transpose
  Support": `nc_transpose` on TensorE and `nc_matmul(is_transpose=True)` alike): an fp32 transpose costs half the
  fp32 matmul factor (2.35x a 16-bit one instead of 4.7x). trn1 has no transpose mode.
* VectorE's 16-bit performance mode borrows GpSimdE's SBUF bus and the hardware arbitrates (ARCH3); the cost is not
  documented, so by default the two engines overlap freely. TILEC_MODEL_SHARED_BUS=exclusive (or `estimate(...,
  shared_bus="exclusive")`) runs the pessimistic reading, where a performance-mode VectorE instruction and a GpSimdE
  instruction never overlap; benchmarks/trn2_shared_bus.py is the Trn2 measurement that decides it.
* Engines that must not access one memory at the same time run one after the other (tilec/perf/conflicts.py, the
  Target's `exclusions`): on trn1 (NeuronCore-v2) VectorE and GpSimdE on SBUF, VectorE and ScalarE on PSUM (ARCH2,
  v2.32.0 trainium_inferentia2_arch.rst l. 596-601: "must be serialized ... enforced by Neuron Compiler"); on trn2
  (NeuronCore-v3) only VectorE and ScalarE on the same PSUM bank (ARCH3, v2.32.0 trainium2_arch.rst l. 271-273: full
  bandwidth in parallel "as long as their accesses do not collide on the same PSUM bank"; what a collision costs is
  not given, serialising it is the inference). TILEC_MODEL_ENGINE_ACCESS=off is the model without the rule.
* The kernel starts 13 µs before anything moves (calibration.md: ~14 µs before the first DMA when profiled; the
  fitted value also has to serve the unprofiled rows 1-5, row 5 being a single 15 µs iteration).
* The big convolution (rows 9-12) is TensorE-bound: 7,992 matmuls with a 128 x 222 moving operand. The public
  kernel the rows were measured with (xaviergonzalez/asst4-trainium2 part2/conv2d.py at d155261, run as written;
  `benchmarks/calibrate.py --public-conv PATH`) spends ~80 us on its weight prologue (16,384-descriptor weight DMAs
  and 36 transposes), so a matmul costs ~96 ns (9 cycles over the spec's 222); fp32 is fitted at 4.7x.
* MFU is the profiler's definition (nki-spec §5): useful matmul FLOPs / (2 * 128 * 128 * 2.4 GHz * total_time). It
  gives 90 % for the fp16 conv (measured 90 %) but 19 % for fp32, where the profiler showed 41 %. No definition in
  the spec reproduces 41 % from 58.1 GFLOP and 3832 µs: the bf16-adjusted count (fp32 x4, EXSCHEMA) would give 77 %,
  and 41 % is 2.1x the plain formula. The model keeps the documented formula and the gap is reported, not fitted.

Left out: HBM bank effects, strides of other than the innermost free dimension, the real allocator's placement
(rotation per allocation site and per whole-buffer load stands in for it), cross-engine semaphore latency beyond the
DMA latency (not documented). Assumed, not documented: the HBM write acknowledgement (650 ns), the 2-buffer rotation,
that a VectorE/ScalarE collision on a trn2 PSUM bank serialises, the byte-range HBM dependence rule, and that the
compiler leads a stream with the DMAs that depend on nothing; row 8's measured kernel is known only by description
(calibration.md §1), ours follows it.
"""
