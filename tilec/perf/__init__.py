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
* A DMA transfer (one `dma_copy`) waits for its data dependences plus a 600 ns issue latency (the v3 HWDGE figure;
  with the generic 1.3 µs semaphore-to-start figure rows 4, 5 and 8 come out 9-17 % slow), then
  occupies the DMA engines of its partitions (8 partitions per engine, up to 16 engines) for a fixed time per
  transfer, a small time per descriptor, and its bytes at 23 B/ns per engine. The fixed part is what makes tiny DMAs
  expensive: calibration rows 1, 2 and 4 (1.5-1.9 µs per loop iteration of 3 DMAs) are bound by it, and the
  per-descriptor part is what separates ROW_CHUNK 1 (one engine, one descriptor) from ROW_CHUNK 128 (16 engines,
  8 descriptors each). Transfers of different queues share the engines (round robin), so loads run ahead while a
  store waits for compute. Tiles allocated in a loop body rotate through 3 buffers per allocation site (fitted to
  row 8), which bounds how far loads run ahead.
* The kernel starts 13 µs before anything moves (calibration.md: ~14 µs before the first DMA when profiled; the
  fitted value also has to serve the unprofiled rows 1-5, row 5 being a single 15 µs iteration).
* The big convolution (rows 9-12) is TensorE-bound: 7,992 matmuls with a 128 x 222 moving operand. At the spec's
  cost (222 cycles at 2.4 GHz = 92.5 ns) they would take 739 µs in fp16; the hardware takes 824 µs, ~101 ns per
  matmul after start-up (calibration.md §3 quotes ~103 ns), which the model reproduces with a fitted per-matmul
  overhead of 21 cycles. fp32 is not simply 4x: measured 3832 µs is 4.65x the fp16 time, so the fp32 factor is
  fitted to 4.7 (the spec's x4 alone gives ~3250 µs, 15 % short of the measurement). Everything else (input row
  loads, PSUM evacuation with the bias, pooling, stores) overlaps with the matmul stream on the other engines and
  queues, provided the PSUM zeroing (`nl.zeros` + `+=`) is folded into the first matmul (see schedule.py).
* MFU is the profiler's definition (nki-spec §5): useful matmul FLOPs / (2 * 128 * 128 * 2.4 GHz * total_time). It
  gives 90 % for the fp16 conv (measured 90 %) but 19 % for fp32, where the profiler showed 41 %. No definition in
  the spec reproduces 41 % from 58.1 GFLOP and 3832 µs: the bf16-adjusted count (fp32 x4, EXSCHEMA) would give 77 %,
  and 41 % is 2.1x the plain formula. The model keeps the documented formula and the gap is reported, not fitted.

Left out: HBM bank effects, PSUM bank conflicts, strides of other than the innermost free dimension, the real
allocator's placement (rotation through 3 buffers per allocation site stands in for it), cross-engine semaphore
latency (not documented), DMA queue limits beyond one queue per call site.
"""
