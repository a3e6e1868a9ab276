"""The configurations of the golden parity traces (recorded with the real vLLM 0.19.1 oracle)."""

# name -> oracle flags (as StepTraceConfig / drive.py keyword names) + workload generator flags
GOLDEN_CONFIGS: dict[str, dict] = {
    "fcfs_default": {},
    "priority": {"policy": "priority"},
    "no_prefix_caching": {"no_prefix_caching": True},
    "no_chunked_prefill": {"no_chunked_prefill": True},
    "async": {"async_scheduling": True},
    "small_pool_fcfs": {"num_blocks": 160},
    "small_pool_priority": {"num_blocks": 160, "policy": "priority"},
    "long_prefill_threshold": {"long_prefill_token_threshold": 256, "max_num_batched_tokens": 1024},
    "arrival_spread": {"arrival_spread": 150},
    "async_small_pool": {"async_scheduling": True, "num_blocks": 160},
    "block32_few_seqs": {"block_size": 32, "max_num_seqs": 16, "num_blocks": 300},
    "no_chunk_small_pool_priority": {"no_chunked_prefill": True, "num_blocks": 200, "policy": "priority"},
    "spread_async_priority_small": {"arrival_spread": 100, "async_scheduling": True, "policy": "priority",
                                    "num_blocks": 180},
    "small_budget_no_cache": {"max_num_batched_tokens": 512, "long_prefill_token_threshold": 128,
                              "no_prefix_caching": True, "max_model_len": 1024},
}

# Workload-generation flags (drive.py's) shared by every golden config.
WORKLOAD_FLAGS = {"num_requests": 80, "num_prefixes": 6}
TRACE_FLAGS = ("num_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
               "long_prefill_token_threshold", "policy", "no_prefix_caching", "no_chunked_prefill",
               "async_scheduling")
