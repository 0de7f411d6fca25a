"""The measurement catalogue: every name in the table that rules are evaluated against and fixes
read (`analyze.run.summary.named_measurements`, one table for a watched run and a trace alike),
declared once with its unit, its meaning and the module that makes it. A rule that reads a name
not declared here is refused when it is loaded (`rulebook`), with the closest declared name; the
test suite fails a run whose table holds a name not declared here (`rulebook.CHECK_ENV`).

Units: % (of the step, unless said), ms, us, s, bytes, count, steps/s, samples/s, FLOP,
TFLOP/s, MiB, bool, text (a name, a file:line, a sentence)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measurement:
    unit: str
    meaning: str
    producer: str  # the module that makes it, under trainadvisor/


_STEP = "analyze.run.summary"
_TRACE = "analyze.run.measures"
_RUNTIME = "training.gpu (the child's runtime facts), analyze.run.measures"
_MEMORY = "memory.peak"
_OOM = "memory.oom"
_DYNAMO = "compute.dynamo"
_RANKS = "analyze.run.ranks, analyze.rank_table"
_TRACE_ONLY = "analyze.run.measures (traced_only)"
_BREAKDOWN = "analyze.run.summary (a trace's breakdown)"
_BOTH = "analyze.run.summary (a trace's: analyze.run.measures.traced_only)"
_PHASES = "analyze.trace.phases (via analyze.run.measures)"
_CRITICAL = "analyze.run.critical_path"
_PARALLEL = "training.parallel (DDP's own record of itself, at the window)"
_OPTIONS = "profile.command (from the command's options and the machine)"

_DECLARED: dict[str, tuple[str, str, str]] = {
    # ---- the timed steps (clocks in the training process) ----
    "steps": ("count", "timed steps (a trace: steps it marks)", _BOTH),
    "step_time_ms_median": ("ms", "median time of a timed step", _BOTH),
    "step_time_ms_mean": ("ms", "mean time of a timed step", _BOTH),
    "step_time_ms_p90": ("ms", "90th percentile of the timed steps' times", _STEP),
    "steps_per_s": ("steps/s", "timed steps per second over the window", _BOTH),
    "samples_per_s": ("samples/s", "samples per second over the window (batch sizes counted)", _STEP),
    "step_unit": ("text", "what a count is per: 'step', or 'window' where a trace marks no steps", _TRACE),
    "training_loop": ("bool", "the loop trains (a backward pass or an optimizer step was seen)", _TRACE),
    "inference_loop": ("bool", "the loop only runs forward (no backward, no optimizer step)", _TRACE),
    "input_shapes_fixed": ("bool", "every step drew batches of the same shapes", _STEP),
    "backwards_per_step": (
        "count",
        "backward() calls per step (median): micro-steps of gradient accumulation",
        _STEP,
    ),
    "backwards_even": ("bool", "every timed step made the same number of backward() calls", _STEP),
    "framework": ("text", "the framework that built the loop (transformers, lightning, accelerate)", _STEP),
    # ---- the step's breakdown ----
    "data_wait_pct": (
        "%",
        "share of the step waiting in DataLoader __next__",
        _BOTH,
    ),
    "data_wait_ms_per_step": (
        "ms",
        "time per step waiting in DataLoader __next__",
        _BOTH,
    ),
    "h2d_copy_pct": ("%", "share of the step in host-to-device copies (from the trace)", _STEP),
    "h2d_copy_ms_per_step": ("ms", "host-to-device copy time per step (from the trace)", _STEP),
    "compute_pct": ("%", "share of the step that is neither data wait nor copies", _STEP),
    "compute_ms_per_step": ("ms", "time per step that is neither data wait nor copies", _STEP),
    "outside_call_pct": ("%", "share of an @advise step spent outside the decorated function", _STEP),
    "outside_call_ms_per_step": ("ms", "time per @advise step spent outside the decorated function", _STEP),
    "kernel_pct": (
        "%",
        "share of the traced steps with a GPU kernel running",
        "analyze.run.summary (a trace's breakdown)",
    ),
    "memcpy_pct": (
        "%",
        "share of the traced steps in GPU memory copies",
        "analyze.run.summary (a trace's breakdown)",
    ),
    "memset_pct": ("%", "share of the traced steps in GPU memsets", _BREAKDOWN),
    "communication_pct": (
        "%",
        "share of the step in collective communication",
        f"{_TRACE}, {_RANKS}",
    ),
    "runtime_pct": (
        "%",
        "share of the traced steps in CUDA runtime calls on the host",
        "analyze.run.summary (a trace's breakdown)",
    ),
    "other_host_pct": (
        "%",
        "share of the traced steps in other host work",
        "analyze.run.summary (a trace's breakdown)",
    ),
    "idle_pct": (
        "%",
        "share of the traced steps with nothing running",
        "analyze.run.summary (a trace's breakdown)",
    ),
    # ---- the GPU, from the trace ----
    "gpu_busy_pct": ("%", "share of the traced steps the GPU had a kernel running", _TRACE),
    "host_busy_pct": ("%", "share of the traced steps the host thread was busy", _TRACE),
    "tensor_core_pct": ("%", "share of kernel time in kernels that use tensor cores", _TRACE),
    "tensor_core_unknown_pct": (
        "%",
        "share of kernel time whose tensor-core use is unknown",
        _TRACE,
    ),
    "matmul_pct": ("%", "share of kernel time in matmul kernels", _TRACE),
    "fp32_matmul_pct": ("%", "share of matmul kernel time in fp32 (not TF32, bf16 or fp16) kernels", _TRACE),
    "conv_pct": ("%", "share of kernel time in convolution kernels", _TRACE),
    "launch_delay_us_median": ("us", "median delay from a kernel's launch to its start", _TRACE),
    "kernel_us_median": ("us", "median kernel duration", _TRACE),
    "short_kernel_pct": ("%", "share of kernels shorter than the launch-bound threshold", _TRACE),
    "kernels_per_step": ("count", "kernels launched per step", _TRACE),
    "graph_launches": ("count", "CUDA graph launches in the trace", _TRACE),
    "graph_kernels": ("count", "kernels run inside CUDA graphs", _TRACE),
    "communication_overlap_pct": ("%", "share of communication hidden behind compute", f"{_TRACE}, {_RANKS}"),
    "collective_ms_per_step": ("ms", "time in collectives per step, waits for other ranks included", _PHASES),
    "collective_exposed_ms_per_step": ("ms", "of it, with no compute beside it (exposed)", _PHASES),
    "communication_exposed_pct": ("%", "exposed communication's share of the step", _PHASES),
    "overlap_efficiency_pct": (
        "%",
        "torchtitan's overlap efficiency: (compute + communication - their union) / communication",
        _PHASES,
    ),
    "communication_phases": ("text", "collectives per step by the phase that launched them", _PHASES),
    "communication_kinds": ("text", "collectives per step by kind (all_reduce, all_gather, ...)", _PHASES),
    "communication_groups": ("text", "collectives per step by process group", _PHASES),
    "h2d_copies_per_step": ("count", "host-to-device copies per step", _TRACE),
    "h2d_ms_per_step": ("ms", "host-to-device copy time per step", _TRACE),
    "h2d_pct": ("%", "share of the step in host-to-device copies", _TRACE),
    "h2d_pageable_pct": ("%", "share of host-to-device copies made from pageable memory", _TRACE),
    "h2d_pageable_per_step": ("count", "host-to-device copies from pageable memory per step", _TRACE),
    "h2d_pinned_per_step": ("count", "host-to-device copies from pinned memory per step", _TRACE),
    "h2d_pageable": (
        "count",
        "host-to-device copies from pageable memory in the trace",
        "analyze.run.measures",
    ),
    "h2d_pinned": ("count", "host-to-device copies from pinned memory in the trace", _TRACE_ONLY),
    "syncs_per_step": ("count", "host-device synchronisations per step", _TRACE),
    "sync_ms_per_step": ("ms", "host time blocked in synchronisations per step", _TRACE),
    "sync_pct": ("%", "share of the step blocked in synchronisations", _TRACE),
    "sync_site": ("text", "the user's line that synchronises most (file:line)", _TRACE),
    "sync_sites": ("text", "the user's lines that synchronise most, up to three", _TRACE),
    "items_per_step": ("count", "tensor .item() calls per step", _TRACE),
    "cpu_tensor_copies_per_step": (
        "count",
        "tensors made on the host and copied over, per step",
        _TRACE,
    ),
    "cpu_tensor_op": ("text", "the operator that makes them most often", _TRACE),
    "cpu_tensor_site": ("text", "the user's line that makes them most often (file:line)", _TRACE),
    "cpu_tensor_sites": ("text", "the user's lines that make them, up to three", _TRACE),
    "allocator_calls_per_step": ("count", "cudaMalloc/cudaFree calls per steady step", _TRACE),
    "allocator_ms_per_step": ("ms", "host time in cudaMalloc/cudaFree per steady step", _TRACE),
    "allocator_pct": ("%", "share of the step in cudaMalloc/cudaFree", _TRACE),
    "allocator_steps_with_calls": ("count", "steady steps that called cudaMalloc/cudaFree", _TRACE),
    "model_aten_ops_per_step": ("count", "aten ops per traced step but the optimizer's and data's", _TRACE),
    # ---- the machine and the runtime (the training process's own facts) ----
    "cuda_used": ("bool", "the run used a CUDA device", _BOTH),
    "cuda_device_count": ("count", "CUDA devices visible to the training process", _RUNTIME),
    "gpu_name": ("text", "the GPU's name", _RUNTIME),
    "compute_capability": ("count", "the GPU's compute capability (major x 10 + minor)", _RUNTIME),
    "has_tensor_cores": ("bool", "the GPU has tensor cores", _RUNTIME),
    "bf16_supported": ("bool", "the GPU computes in bfloat16", _RUNTIME),
    "tf32_supported": ("bool", "the GPU computes in TF32", _RUNTIME),
    "tf32_enabled": ("bool", "torch.backends.cuda.matmul.allow_tf32 was on", _RUNTIME),
    "cudnn_tf32_enabled": ("bool", "torch.backends.cudnn.allow_tf32 was on", _RUNTIME),
    "tf32_api": ("text", "which TF32 switch this torch has (fp32_precision or allow_tf32)", _RUNTIME),
    "float32_matmul_precision": ("text", "torch.get_float32_matmul_precision()", _RUNTIME),
    "cudnn_benchmark": ("bool", "torch.backends.cudnn.benchmark was on", _RUNTIME),
    "anomaly_detection": ("bool", "autograd anomaly detection was on", _RUNTIME),
    "amp_override": ("text", "the script set an autocast of its own that a trial must not undo", _RUNTIME),
    "gpu_memory_bytes": ("bytes", "the GPU's total memory", _RUNTIME),
    "cpu_count": ("count", "CPU cores the training process may use", _STEP),
    "cpu_busy_pct": ("%", "share of all cores busy in the window (ours, workers and others)", _STEP),
    "free_cores": ("count", "cores left to DataLoader workers (neither ours nor others')", _STEP),
    "main_process_cpu_pct": ("%", "the training process's CPU in the window (of one core)", _STEP),
    "workers_cpu_pct": ("%", "the DataLoader workers' CPU in the window (of one core)", _STEP),
    "workers_busy_cores": ("count", "cores the DataLoader workers kept busy", _STEP),
    "lr_scheduler": ("bool", "the script steps a learning-rate scheduler", _RUNTIME),
    "data_parallel_modules": ("count", "modules wrapped in DataParallel", _RUNTIME),
    "intra_op_threads": ("count", "torch's intra-op threads in the training process", _RUNTIME),
    "ddp_modules": ("count", "DistributedDataParallel modules alive at the window", _PARALLEL),
    "ddp_call_site": ("text", "file:line that built the first DistributedDataParallel", _PARALLEL),
    "ddp_find_unused_parameters": (
        "bool",
        "DDP searches for unused parameters each step",
        _PARALLEL,
    ),
    "ddp_unused_parameter_bytes": (
        "bytes",
        "parameters DDP found unused in a step",
        _PARALLEL,
    ),
    "ddp_bucket_cap_mb": ("MiB", "DDP's gradient bucket size", _PARALLEL),
    "ddp_gradient_as_bucket_view": ("bool", "DDP's gradients are views into its buckets", _PARALLEL),
    "ddp_static_graph": ("bool", "DDP was told the graph is static", _PARALLEL),
    "ddp_world_size": ("count", "processes DDP all-reduces across", _PARALLEL),
    "fsdp_version": ("text", "FSDP2 (fully_shard) or FSDP1 (FullyShardedDataParallel)", _PARALLEL),
    "fsdp_units": ("count", "FSDP units alive at the window", _PARALLEL),
    "fsdp_resharding_units": ("count", "FSDP2 units that reshard their parameters after forward", _PARALLEL),
    "fsdp_world_size": ("count", "ranks FSDP shards across", _PARALLEL),
    # ---- the optimizer ----
    "optimizer": ("text", "the optimizer's class", _RUNTIME),
    "optimizers": ("count", "optimizers that stepped in the window", _RUNTIME),
    "optimizer_fused": ("bool", "the optimizer runs fused", _RUNTIME),
    "optimizer_fusable": ("bool", "the optimizer has a fused implementation for these parameters", _RUNTIME),
    "optimizer_foreach": ("bool", "the optimizer's foreach flag (None: its default)", _RUNTIME),
    "optimizer_has_foreach": ("bool", "the optimizer takes a foreach flag", _RUNTIME),
    # ---- the DataLoader that fed the steps ----
    "dataloaders": ("count", "DataLoaders the run built", _STEP),
    "dataloader_index": ("count", "index of the DataLoader that fed the timed steps", _STEP),
    "dataloader_call_site": ("text", "where that DataLoader was built (file:line)", _STEP),
    "dataset_class": ("text", "its dataset's class", _STEP),
    "num_workers": ("count", "its num_workers", _BOTH),
    "multiprocess_loader": (
        "bool",
        "a trace shows a multi-process DataLoader iterator",
        "analyze.run.measures",
    ),
    "batch_size": ("count", "its batch_size", _STEP),
    "pin_memory": ("bool", "its pin_memory", _STEP),
    "persistent_workers": ("bool", "its persistent_workers", _STEP),
    "prefetch_factor": ("count", "its prefetch_factor", _STEP),
    "iterable_dataset": ("bool", "its dataset is an IterableDataset", _STEP),
    # ---- FLOPs and utilisation ----
    "flops_per_step": ("FLOP", "FLOPs of one counted step", f"{_STEP}, {_TRACE}"),
    "flops_source": ("text", "where a trace's FLOPs come from", _TRACE),
    "flops_status": ("text", "why no FLOPs were counted, or 'counted'", _TRACE),
    "flops_recomputed": (
        "count",
        "checkpoint recomputations in the counted step (its FLOPs: HFU)",
        "compute.flops",
    ),
    "achieved_tflops": ("TFLOP/s", "FLOPs per step times steps per second", f"{_STEP}, {_TRACE}"),
    "peak_tflops": ("TFLOP/s", "the device's peak in the step's dtype", f"{_STEP}, {_TRACE}"),
    "mfu_pct": ("%", "achieved over peak FLOP/s (HFU where the step recomputes)", f"{_STEP}, {_TRACE}"),
    # ---- memory ----
    "peak_allocated_bytes": ("bytes", "the window's peak of allocated CUDA memory", _RUNTIME),
    "peak_reserved_bytes": ("bytes", "the window's peak of reserved CUDA memory", _RUNTIME),
    "peak_reserved_pct": ("%", "that peak, of the memory the allocator may use", _RUNTIME),
    "memory_headroom_pct": ("%", "the memory the allocator may use, left at the peak", _RUNTIME),
    "reserved_unused_pct": ("%", "reserved memory not allocated at the peak", _RUNTIME),
    "memory_limit_bytes": ("bytes", "the memory the allocator may use", _RUNTIME),
    "memory_limit_source": ("text", "what sets that limit (the card, a memory fraction)", _RUNTIME),
    "alloc_retries": ("count", "allocations the allocator retried after freeing its cache", _RUNTIME),
    "ooms": ("count", "out-of-memory errors the allocator counted", _RUNTIME),
    "step_peak_bytes": ("bytes", "the peak of one step's memory (`memory.step`)", _MEMORY),
    "parameters_bytes": ("bytes", "parameters at the step's peak", _MEMORY),
    "gradients_bytes": ("bytes", "gradients at the step's peak", _MEMORY),
    "optimizer_state_bytes": ("bytes", "optimizer state at the step's peak", _MEMORY),
    "activations_bytes": ("bytes", "activations kept for backward at the step's peak", _MEMORY),
    "other_bytes": ("bytes", "everything else at the step's peak", _MEMORY),
    "parameters_pct": ("%", "parameters' share of the step's peak", _MEMORY),
    "gradients_pct": ("%", "gradients' share of the step's peak", _MEMORY),
    "optimizer_state_pct": ("%", "optimizer state's share of the step's peak", _MEMORY),
    "gathered_parameters_bytes": ("bytes", "parameters FSDP held gathered at the step's peak", _MEMORY),
    "gathered_parameters_pct": ("%", "FSDP's gathered parameters' share of the step's peak", _MEMORY),
    "activations_pct": ("%", "activations' share of the step's peak", _MEMORY),
    "other_pct": ("%", "everything else's share of the step's peak", _MEMORY),
    "memory_budget_bytes": ("bytes", "--memory-budget, or the card's usable memory", _MEMORY),
    "budget_used_pct": ("%", "the step's peak, of the memory budget", _MEMORY),
    "memory_available_bytes": ("bytes", "the host memory available when profiling began", _OPTIONS),
    "blocks": ("count", "repeated blocks found in the model (checkpointing candidates)", "memory.blocks"),
    "blocks_path": ("text", "the module path of those blocks (model.layers)", "memory.blocks"),
    "blocks_type": ("text", "their class", "memory.blocks"),
    "blocks_params_pct": ("%", "their share of the model's parameters", "memory.blocks"),
    "hf_gradient_checkpointing": (
        "bool",
        "a transformers model checkpointing its gradients",
        "memory.blocks",
    ),
    # ---- out of memory ----
    "out_of_memory": ("bool", "the script died of out-of-memory", _OOM),
    "oom_memory": ("text", "which memory ran out (GPU memory, host memory)", _OOM),
    "oom_summary": ("text", "what the failing request and the live memory were", _OOM),
    "oom_request_bytes": ("bytes", "the allocation that failed", _OOM),
    "oom_live_bytes": ("bytes", "memory live when it failed", _OOM),
    "oom_limit_bytes": ("bytes", "the memory the allocator could use", _OOM),
    "oom_live_pct": ("%", "live memory, of that limit", _OOM),
    "oom_parameters_pct": ("%", "parameters' share of the live memory", _OOM),
    "oom_gradients_pct": ("%", "gradients' share of the live memory", _OOM),
    "oom_optimizer_state_pct": ("%", "optimizer state's share of the live memory", _OOM),
    "oom_other_pct": ("%", "everything else's share of the live memory", _OOM),
    "oom_parameters_bytes": ("bytes", "parameters in the live memory", _OOM),
    "oom_gradients_bytes": ("bytes", "gradients in the live memory", _OOM),
    "oom_optimizer_state_bytes": ("bytes", "optimizer state in the live memory", _OOM),
    "oom_other_bytes": ("bytes", "everything else in the live memory", _OOM),
    "oom_reserved_bytes": ("bytes", "memory the allocator held reserved when it failed", _OOM),
    "oom_unattributed_bytes": ("bytes", "live memory no allocation record accounts for", _OOM),
    "oom_largest_sites": ("text", "the lines that allocated most of it", _OOM),
    "oom_failed_site": ("text", "the line whose allocation failed", _OOM),
    # ---- torch.compile ----
    "compiled": ("bool", "the script compiled with torch.compile", _DYNAMO),
    "compiled_graphs": ("count", "graphs torch.compile compiled", _DYNAMO),
    "graph_breaks": ("count", "graph breaks", _DYNAMO),
    "graph_break_site": ("text", "where the most frequent graph break is", _DYNAMO),
    "graph_break_reason": ("text", "why it breaks there", _DYNAMO),
    "graph_break_sites": ("text", "the graph breaks, up to three, with their reasons", _DYNAMO),
    "recompilations": ("count", "recompilations", _DYNAMO),
    "recompile_site": ("text", "the function recompiled most", _DYNAMO),
    "recompile_reason": ("text", "the guard that failed there", _DYNAMO),
    "recompile_reasons": ("text", "the recompilations, up to three, with their guards", _DYNAMO),
    "recompile_limit": ("count", "torch's recompile limit", _DYNAMO),
    "recompile_limit_hits": ("count", "frames that hit it and run uncompiled since", _DYNAMO),
    "compile_s": ("s", "time spent compiling", _DYNAMO),
    "compile_pct": ("%", "compiling's share of the process's time so far", _DYNAMO),
    # ---- ranks (torchrun, or traces of several ranks) ----
    "ranks": ("count", "ranks measured", _RANKS),
    "slowest_rank": ("count", "the rank with the longest steps", _RANKS),
    "rank_step_time_ms_max": ("ms", "the slowest rank's mean step time", _RANKS),
    "rank_step_time_ms_min": ("ms", "the fastest rank's mean step time", _RANKS),
    "rank_skew_pct": ("%", "how much longer the slowest rank's steps are than the fastest's", _RANKS),
    "straggler_evidence": ("text", "what sets the slowest rank apart", _RANKS),
    "straggler_communication_ms": ("ms", "the slowest rank's communication time per step", _RANKS),
    "others_communication_ms": ("ms", "the other ranks' communication time per step", _RANKS),
    "slowest_rank_pre_backward_ms": ("ms", "the slowest rank's time before backward per step", _RANKS),
    "others_pre_backward_ms": ("ms", "the other ranks' time before backward per step", _RANKS),
    "rank_peak_bytes_max": ("bytes", "the largest of the ranks' step peaks", _RANKS),
    "rank_peak_max_rank": ("count", "the rank with that peak", _RANKS),
    "rank_peak_imbalance_pct": ("%", "how far the largest rank's peak is above the smallest's", _RANKS),
    "oom_rank": ("count", "under torchrun, the first rank that died of out-of-memory", _RANKS),
    "ddp_no_sync_used": (
        "bool",
        "the script enters DDP's no_sync() (its own gradient accumulation)",
        _PARALLEL,
    ),
    "fsdp_param_dtype": (
        "text",
        "the dtype FSDP gathers parameters in, where the script sets a policy",
        _PARALLEL,
    ),
    "fsdp_mp_policy_set": (
        "bool",
        "the script gives fully_shard a MixedPrecisionPolicy of its own (any field set)",
        _PARALLEL,
    ),
    "gating_rank": ("count", "the rank whose work gates the most steps (the critical path)", _CRITICAL),
    "straggler_cause": ("text", "why it is slow: data, compute, host or communication", _CRITICAL),
    "straggler_phase": ("text", "the phase of its step longer than the other ranks'", _CRITICAL),
    "critical_path": ("text", "the critical path across ranks, in a sentence", _CRITICAL),
    "critical_path_chain": ("text", "the gating rank's median step, segment by segment", _CRITICAL),
    # ---- the run and the command's options ----
    "run_total_steps": ("count", "the steps a whole run of the script takes, where known", "profile.tuning"),
    "run_seen_steps": ("count", "the most steps a run of the script was seen to take", "profile.tuning"),
    "worker_cap": ("count", "--max-workers", _OPTIONS),
}

CATALOGUE: dict[str, Measurement] = {name: Measurement(*fields) for name, fields in _DECLARED.items()}
