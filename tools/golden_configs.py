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

# The opt-in extensions of the oracle (speculative decoding, stop rules, aborts, sliding window and
# hybrid groups, LoRA, cache salt, KV connector): at least two configs each, async where vLLM allows.
STOP = {"eos_rate": 0.02, "stop_token_ids": [7, 8, 9], "stop_rate": 0.03, "min_tokens": 6}
FEATURE_CONFIGS: dict[str, dict] = {
    "spec_ngram": {"num_spec_tokens": 3},
    "spec_ngram_small_pool_priority": {"num_spec_tokens": 4, "num_blocks": 160, "policy": "priority"},
    "spec_eagle": {"num_spec_tokens": 3, "spec_method": "eagle"},
    "spec_eagle_async_small_pool": {"num_spec_tokens": 2, "spec_method": "eagle", "async_scheduling": True,
                                    "num_blocks": 180},
    "spec_draft_model": {"num_spec_tokens": 2, "spec_method": "draft_model", "max_num_seqs": 64},
    "spec_draft_model_async": {"num_spec_tokens": 3, "spec_method": "draft_model", "async_scheduling": True,
                               "max_num_batched_tokens": 1024, "max_num_seqs": 32},
    "stop_rules": dict(STOP),
    "stop_rules_async_spec": dict(STOP, async_scheduling=True, num_spec_tokens=2, spec_method="eagle"),
    "stop_rules_ngram": dict(STOP, num_spec_tokens=3, num_blocks=200),
    "aborts": {"abort_rate": 0.3},
    "aborts_many_running": {"abort_rate": 0.5, "abort_after": 25, "abort_window": 1},
    "aborts_preempted_small_pool": {"abort_preempted_rate": 0.5, "abort_rate": 0.2, "num_blocks": 160},
    "aborts_async": {"abort_rate": 0.4, "abort_after": 10, "abort_window": 3, "abort_preempted_rate": 0.5,
                     "async_scheduling": True, "num_blocks": 180},
    "sliding_window": {"sliding_window": 128, "trace_block_tables": True},
    "sliding_window_async_small": {"sliding_window": 64, "num_blocks": 120, "async_scheduling": True,
                                   "trace_block_tables": True},
    "sliding_window_eagle": {"sliding_window": 96, "num_spec_tokens": 2, "spec_method": "eagle",
                             "trace_block_tables": True},
    "hybrid": {"sliding_window": 128, "hybrid": True, "num_blocks": 400, "trace_block_tables": True},
    "hybrid_async_priority": {"sliding_window": 64, "hybrid": True, "num_blocks": 300, "async_scheduling": True,
                              "policy": "priority", "trace_block_tables": True},
    "lora": {"num_loras": 4, "max_loras": 2},
    "lora_async_priority": {"num_loras": 3, "max_loras": 1, "async_scheduling": True, "policy": "priority"},
    "cache_salt": {"cache_salt": 3},
    "cache_salt_async_small": {"cache_salt": 2, "async_scheduling": True, "num_blocks": 200},
    "kv_connector": {"kv_connector_rate": 0.5},
    "kv_connector_async_small": {"kv_connector_rate": 0.6, "kv_load_steps": 5, "async_scheduling": True,
                                 "num_blocks": 200},
    "kv_connector_aborts": {"kv_connector_rate": 0.7, "abort_rate": 0.4, "abort_after": 1, "abort_window": 4},
    "kv_connector_sliding": {"kv_connector_rate": 0.5, "sliding_window": 128, "trace_block_tables": True},
}
GOLDEN_CONFIGS.update(FEATURE_CONFIGS)

# Pipeline parallelism (record_golden.py runs the driver with N stages and a batch queue of N).
PP_CONFIGS: dict[str, dict] = {
    "pp2_sync": {"pipeline_parallel_size": 2},
    "pp4_sync_small_pool": {"pipeline_parallel_size": 4, "num_blocks": 160},
    "pp3_async_priority": {"pipeline_parallel_size": 3, "async_scheduling": True, "policy": "priority",
                           "arrival_spread": 100},
    "pp4_async_small_pool": {"pipeline_parallel_size": 4, "async_scheduling": True, "num_blocks": 180},
    "pp2_sync_no_chunk_threshold": {"pipeline_parallel_size": 2, "no_chunked_prefill": True,
                                    "max_num_batched_tokens": 2048, "long_prefill_token_threshold": 0,
                                    "num_blocks": 200},
    "pp3_spec_eagle_async": {"pipeline_parallel_size": 3, "num_spec_tokens": 2, "spec_method": "eagle",
                             "async_scheduling": True, "num_blocks": 200},
    "pp2_preempt_sync_priority": {"pipeline_parallel_size": 2, "num_blocks": 120, "policy": "priority",
                                  "arrival_spread": 60},
    "pp2_aborts_async": {"pipeline_parallel_size": 2, "abort_rate": 0.3, "async_scheduling": True},
}
GOLDEN_CONFIGS.update(PP_CONFIGS)

# Workload-generation flags (drive.py's) shared by every golden config.
WORKLOAD_FLAGS = {"num_requests": 80, "num_prefixes": 6}
# The flags that become StepTraceConfig fields (workload-only ones among them switch trace fields on).
TRACE_FLAGS = ("num_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
               "long_prefill_token_threshold", "policy", "no_prefix_caching", "no_chunked_prefill",
               "async_scheduling", "hash_algo", "num_spec_tokens", "spec_method", "eos_rate", "stop_token_ids",
               "stop_rate", "min_tokens", "abort_rate", "abort_window", "abort_after", "abort_preempted_rate",
               "sliding_window", "hybrid", "num_loras", "max_loras", "cache_salt", "kv_connector_rate",
               "kv_load_steps", "trace_block_tables", "max_steps", "pipeline_parallel_size",
               "offload_cpu_blocks", "offload_block_size", "offload_eviction_policy", "offload_store_threshold",
               "offload_load_steps", "offload_store_steps", "groups", "mamba_cache_mode", "grammar_rate",
               "grammar_max_steps", "streaming_rate", "stream_gap", "encoder_budget", "encoder_cache_size",
               "disable_chunked_mm_input", "encoder_decoder")
