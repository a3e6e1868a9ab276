"""`servesim step-trace`: run our scheduler on an oracle workload and write an oracle-schema trace."""

from __future__ import annotations

from pathlib import Path

import typer

from scheduler.config import POLICIES
from scheduler.steptrace import StepTraceConfig, run_step_trace
from servesim.cli import app
from servesim.oracle_io import read_oracle_workload, write_jsonl_atomic
from traces.errors import InputError


def _check_start_up(sc, cc) -> None:
    """What vLLM refuses at start-up (simulator/startup.py), named by this command's flags."""
    from simulator.startup import blocks_for_max_model_len

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


@app.command("step-trace")
def step_trace(
    workload: Path = typer.Argument(..., help="workload JSONL in the vLLM oracle's format"),
    out: Path = typer.Option(..., "--out", help="trace JSONL to write (oracle schema)"),
    num_blocks: int = typer.Option(1000, help="KV blocks, null block included"),
    block_size: int = typer.Option(16),
    max_num_batched_tokens: int = typer.Option(2048),
    max_num_seqs: int = typer.Option(256),
    max_model_len: int = typer.Option(2048),
    long_prefill_token_threshold: int = typer.Option(0),
    policy: str = typer.Option("fcfs", help="fcfs | priority | continuum"),
    no_prefix_caching: bool = typer.Option(False, "--no-prefix-caching"),
    no_chunked_prefill: bool = typer.Option(False, "--no-chunked-prefill"),
    async_scheduling: bool = typer.Option(False, "--async-scheduling"),
) -> None:
    """Step-level view of the scheduler's decisions, field for field comparable with the oracle."""
    if policy not in POLICIES:
        raise InputError(f"unknown policy {policy!r}", field="--policy", allowed=", ".join(POLICIES))
    try:
        cfg = StepTraceConfig(num_blocks=num_blocks, block_size=block_size,
                              max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                              max_model_len=max_model_len, long_prefill_token_threshold=long_prefill_token_threshold,
                              policy=policy, no_prefix_caching=no_prefix_caching,
                              no_chunked_prefill=no_chunked_prefill, async_scheduling=async_scheduling)
        sc, cc = cfg.configs()
    except ValueError as e:
        raise InputError(str(e), field="options") from None
    _check_start_up(sc, cc)
    records = run_step_trace(read_oracle_workload(workload), cfg)
    n = write_jsonl_atomic(out, records)
    typer.echo(f"wrote {n} steps to {out}")
