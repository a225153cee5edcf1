"""Kernels in multi-device modules (Shardy): which dims a kernel call cuts, per-shard plans, range splits.

XLA's batch partitioner keeps hlofuse's CPU FFI calls local (`rules`: an `sdy.sharding_rule` and
`num_batch_dims` on each call). A Pallas (Mosaic TPU, Triton, Mosaic GPU) or NKI call has no partitioner, and
its kernel is compiled for one fixed shape, so the partitioner would all-gather its operands and run the whole
problem on every device. In a multi-device module `hlofuse-lower-kernels` writes instead what a user writes by
hand with `jax.shard_map`: a `sdy.manual_computation` whose body calls the kernel lowered for one shard's shapes.

- `cuts`: the dims a call can cut (`Cuts`), per target from its `KernelSpec.cuts`. Attention cuts the batch and
  the query heads (with the kv heads they read); sampling the first row dim longer than 1; the key or query
  sequence and the vocabulary where a range split merges them exactly.
- `plan`: `plan_shards` asks Shardy (propagation on a copy, the composites replaced by probes) which mesh axes
  cut each dim, giving a typed `ShardPlan`: axes per cut label and the `GatheredDim`s that arrive sharded but
  stay whole.
- `strategy`: from a plan and the kernel's spec, what the lowering does with one composite: keep it (with the
  reason), inline the kernel, or run it per shard (with its range split, if any).
- `manual`: the `sdy.manual_computation` builder.
- `ranges`: the attention range splits (decode and prefill key ranges, prefill query ranges) and the sampler's
  row split; `vocab_ranges`: the samplers' vocabulary ranges.
- `rules`: the CPU calls' sharding rules.
"""
