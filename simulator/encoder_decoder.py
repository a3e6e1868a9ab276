"""Encoder-decoder models (Whisper) on the vLLM engine: what vLLM 0.19.1 forces for them, and what
it refuses.

vLLM forces, silently but for an info line (config/scheduler.py SchedulerConfig.__post_init__ with
is_encoder_decoder; "Encoder-decoder models do not support chunked prefill nor prefix caching;
disabling both"): chunked prefill off, chunked multimodal input off, no long-prefill threshold,
prefix caching off. The encoder's input length (Whisper: max_source_positions, 1500 frames for
every request, the feature extractor pads to 30 s) is the largest item the encoder budget and cache
must hold. The run's resolved config (config.yaml) shows the values used.

Refused: the SGLang engine (not modelled for these), pipeline parallelism, and a KV connector (vLLM
asserts "Encoder-decoder models are not currently supported with KV connectors": the CPU tier).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from servesim.simulator.specs import resolve_model
from servesim.traces.errors import InputError

if TYPE_CHECKING:
    from servesim.simulator.config import SimConfig


def encoder_decoder_config(cfg: SimConfig) -> SimConfig:
    """cfg with what vLLM forces for an encoder-decoder model (unchanged for any other model)."""
    model = resolve_model(cfg.hardware.model)
    if not model.cross_attention:
        return cfg
    check_encoder_decoder(cfg)
    assert model.vision is not None  # ModelSpec: cross_attention needs its encoder
    sched = cfg.scheduler
    forced = replace(sched, enable_chunked_prefill=False, disable_chunked_mm_input=True,
                     long_prefill_token_threshold=0,
                     mm_max_tokens_per_item=sched.mm_max_tokens_per_item or model.vision.max_tokens_per_item)
    cache = replace(cfg.cache, enable_prefix_caching=False) if cfg.cache.enable_prefix_caching else cfg.cache
    if forced == sched and cache is cfg.cache:
        return cfg
    return replace(cfg, scheduler=forced, cache=cache)


def check_encoder_decoder(cfg: SimConfig) -> None:
    """What vLLM refuses (or servesim does not model) for an encoder-decoder model."""
    model = cfg.hardware.model
    if cfg.engine != "vllm":
        raise InputError(f"{model} is an encoder-decoder model, modelled on the vllm engine only",
                         field="engine", allowed="vllm")
    if cfg.hardware.pp != 1:
        raise InputError(f"{model} is an encoder-decoder model: pipeline parallelism is not modelled for it",
                         field="hardware.pp", allowed="1")
    if cfg.kv_offload.enabled:
        raise InputError(f"{model} is an encoder-decoder model; vLLM 0.19.1 does not support KV connectors "
                         "(the CPU KV tier) with them", field="kv_offload.enabled", allowed="false")
