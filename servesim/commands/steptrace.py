"""`servesim step-trace`: run our scheduler on an oracle workload and write an oracle-schema trace."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import typer

from servesim.scheduler.config import POLICIES
from servesim.scheduler.registry import unknown_name_message
from servesim.scheduler.oracle_trace import StepTraceConfig, run_step_trace
from servesim.cli import app
from servesim.oracle_io import read_oracle_workload, write_jsonl_atomic
from servesim.simulator.outfile import check_output_file
from servesim.traces.errors import InputError


def _check_start_up(sc, cc) -> None:
    """What vLLM refuses at start-up (simulator/startup.py), named by this command's flags."""
    from servesim.simulator.startup import blocks_for_max_model_len

    if sc.max_num_batched_tokens < sc.max_num_seqs:
        raise InputError(f"max_num_batched_tokens ({sc.max_num_batched_tokens}) must be greater than or equal to "
                         f"max_num_seqs ({sc.max_num_seqs})", field="--max-num-batched-tokens",
                         allowed=f">= {sc.max_num_seqs}")
    need = blocks_for_max_model_len(cc, sc.max_model_len, sc.max_num_batched_tokens)
    if need > cc.num_gpu_blocks:
        raise InputError(f"To serve at least one request with the model's max seq len ({sc.max_model_len}), "
                         f"{need} KV blocks of {cc.block_size} tokens are needed, more than the pool's "
                         f"{cc.num_gpu_blocks} (vLLM's start-up check)", field="--num-blocks",
                         allowed=f">= {need}, or --max-model-len <= {cc.num_gpu_blocks * cc.block_size}")


def _trace_config(flags: dict):
    """StepTraceConfig from the command's options, and the scheduler and cache configs it makes (bad
    values: an InputError naming the option)."""
    policy = flags["policy"]
    if policy not in POLICIES:
        raise InputError(unknown_name_message("policy", policy, POLICIES.names()), field="--policy",
                         allowed=", ".join(POLICIES.names()))
    try:
        flags["stop_token_ids"] = tuple(int(x) for x in flags["stop_token_ids"].split(",") if x.strip())
    except ValueError:
        raise InputError(f"not a comma-separated list of ints: {flags['stop_token_ids']!r}",
                         field="--stop-token-ids") from None
    try:
        cfg = StepTraceConfig(**flags)
        sc, cc = cfg.configs()
        cfg.offload_config()
    except ValueError as e:
        raise InputError(str(e), field="options") from None
    return cfg, sc, cc


def _check_encoder(requests: list[dict], cfg: StepTraceConfig) -> None:
    """Every multimodal item fits the encoder budget and cache the flags give (else it would never run)."""
    limit = min(cfg.encoder_budget, cfg.encoder_cache_size)
    for rec in requests:
        for i, item in enumerate(rec.get("mm_items") or ()):
            if item["length"] > limit:
                raise InputError(f"request {rec['req_id']!r}: multimodal item {i} has {item['length']} embeddings, "
                                 f"more than --encoder-budget / --encoder-cache-size hold ({limit})",
                                 field="--encoder-budget", allowed=f">= {item['length']} (both flags)")


@app.command("step-trace")
def step_trace(
    workload: Path = typer.Argument(..., help="workload JSONL in the vLLM oracle's format"),
    out: Path = typer.Option(..., "--out", help="trace JSONL to write (oracle schema)"),
    overwrite: bool = typer.Option(False, "--overwrite/--no-overwrite", help="replace an existing --out file"),
    num_blocks: int = typer.Option(1000, help="KV blocks, null block included"),
    block_size: int = typer.Option(16),
    max_num_batched_tokens: int = typer.Option(2048),
    max_num_seqs: int = typer.Option(256),
    max_model_len: int = typer.Option(2048),
    long_prefill_token_threshold: int = typer.Option(0),
    policy: str = typer.Option("fcfs", help="a scheduling policy (scheduler/policies/): fcfs | priority | continuum"),
    no_prefix_caching: bool = typer.Option(False, "--no-prefix-caching"),
    no_chunked_prefill: bool = typer.Option(False, "--no-chunked-prefill"),
    async_scheduling: bool = typer.Option(False, "--async-scheduling"),
    pipeline_parallel_size: int = typer.Option(1, help="N > 1: a batch queue of N steps (vLLM's pipeline "
                                               "parallelism; the oracle runs it through tools/record_golden.py)"),
    max_steps: int = typer.Option(1_000_000),
    hash_algo: str = typer.Option("sha256", help="prefix-caching block hash: sha256 | blake2b"),
    num_spec_tokens: int = typer.Option(0, help="K > 0: speculative decoding with K drafts (oracle's fake drafter)"),
    spec_method: str = typer.Option("ngram", help="ngram | eagle | draft_model"),
    eos_rate: float = typer.Option(0.0, help="probability that a sampled token is EOS (id 2)"),
    stop_token_ids: str = typer.Option("", help="comma-separated ids the fake sampler may emit as stop tokens"),
    stop_rate: float = typer.Option(0.0, help="probability that a sampled token is one of --stop-token-ids"),
    min_tokens: int = typer.Option(0, help="(workload generation) switches the stop-rule trace fields on"),
    abort_rate: float = typer.Option(0.0, help="(workload generation) switches the abort trace fields on"),
    abort_window: int = typer.Option(200, help="(workload generation only)"),
    abort_after: int = typer.Option(0, help="(workload generation only)"),
    abort_preempted_rate: float = typer.Option(0.0, help="(workload generation) switches the abort trace fields on"),
    sliding_window: int = typer.Option(0, help="W > 0: the KV cache group slides over W tokens"),
    hybrid: bool = typer.Option(False, "--hybrid", help="with --sliding-window: full-attention + sliding-window groups"),
    num_loras: int = typer.Option(0, help="N > 0: LoRA on (requests carry lora_id)"),
    max_loras: int = typer.Option(1, help="LoRAs per step at most, with --num-loras"),
    cache_salt: int = typer.Option(0, help="(workload generation only: requests carry cache_salt)"),
    kv_connector_rate: float = typer.Option(0.0, help="> 0: decode-side KV connector (requests with remote_prefill)"),
    kv_load_steps: int = typer.Option(3, help="a remote KV load is reported finished this many steps later"),
    trace_block_tables: bool = typer.Option(False, "--trace-block-tables", help="add every running request's block tables"),
    offload_cpu_blocks: int = typer.Option(0, help="N > 0: vLLM's OffloadingConnector with a CPU tier of N offload blocks"),
    offload_block_size: int = typer.Option(0, help="offload block size in tokens (a multiple of --block-size; 0: equal)"),
    offload_eviction_policy: str = typer.Option("lru", help="the CPU tier's eviction policy: lru | arc"),
    offload_store_threshold: int = typer.Option(0, help="N >= 2: store only blocks looked up N times (vLLM's "
                                                        "store_threshold; 0: every block)"),
    offload_load_steps: int = typer.Option(2, help="a CPU->GPU load is reported finished this many steps later"),
    offload_store_steps: int = typer.Option(2, help="a GPU->CPU store completes this many steps later"),
    groups: str = typer.Option("", help="KV cache groups, e.g. full,mamba | full,chunked_local:64 | sink_full:32"),
    mamba_cache_mode: str = typer.Option("none", help="vLLM's --mamba-cache-mode: none | align | all"),
    grammar_rate: float = typer.Option(0.0, help="(workload generation) switches the grammar-wait trace fields on"),
    grammar_max_steps: int = typer.Option(6, help="(workload generation only)"),
    streaming_rate: float = typer.Option(0.0, help="(workload generation) switches the streaming-input trace fields on"),
    stream_gap: int = typer.Option(30, help="(workload generation only)"),
    encoder_budget: int = typer.Option(0, help="N > 0: multimodal requests (workload mm_items) with an encoder "
                                       "budget of N embeddings a step (tools/encoder_oracle.py)"),
    encoder_cache_size: int = typer.Option(0, help="the encoder cache in embeddings, with --encoder-budget"),
    disable_chunked_mm_input: bool = typer.Option(False, "--disable-chunked-mm-input",
                                                  help="never split a multimodal item across steps"),
) -> None:
    """Step-level view of the scheduler's decisions, field for field comparable with the vLLM oracle.

    Every flag of the oracle's drives (drive.py, tools/offload_oracle.py, tools/kv_groups_oracle.py,
    tools/blocked_oracle.py) is accepted, with its name, default and worker rules; flags marked
    "workload generation" only shape the workload there (it is read from WORKLOAD here) and switch
    the matching trace fields on."""
    options = dict(locals())
    out = check_output_file(out, overwrite=overwrite)  # before any work
    # Every option but the two paths and --overwrite is a StepTraceConfig field of the same name.
    cfg, sc, cc = _trace_config({f.name: options[f.name] for f in fields(StepTraceConfig) if f.name in options})
    _check_start_up(sc, cc)
    requests = read_oracle_workload(workload)
    _check_encoder(requests, cfg)
    records = run_step_trace(requests, cfg)
    n = write_jsonl_atomic(out, records)
    typer.echo(f"wrote {n} steps to {out}")
