"""The sampling a measured run's requests ran with when its client sent no sampling parameters.

vLLM's OpenAI server (``--generation-config auto``, the default since 0.8) fills every request
field the client leaves out from the model's ``generation_config.json``
(``ModelConfig.get_diff_sampling_param``: temperature, top_p, top_k, min_p, repetition_penalty).
inference-perf's completion payload (the BLIS runs' client) carries only model, prompt,
max_tokens, ignore_eos and stream, so those runs sampled with their models' defaults; a
temperature-0 client (``vllm bench serve``'s default) would sample greedily instead.

Only models whose defaults were seen in a public copy are listed; no file could be read from the
Hugging Face Hub here. Every other model runs with vLLM's neutral parameters, and
``servesim validate`` notes which applied. Each entry says where its values were seen.
"""

from __future__ import annotations

from servesim.simulator.sampling import SamplingConfig

# Hugging Face id (as a run records it) -> (sampling, where the values were seen)
GENERATION_DEFAULTS: dict[str, tuple[SamplingConfig, str]] = {
    "meta-llama/Llama-3.1-70B-Instruct": (
        SamplingConfig(temperature=0.6, top_p=0.9),
        "Meta's Llama 3.1 Instruct generation_config.json (temperature 0.6, top_p 0.9); the 8B-Instruct "
        "file is reproduced verbatim in public code (PyPI fastmindapi 0.0.9 DEVELOPMENT.md), the 70B one "
        "was not readable here"),
    "Qwen/Qwen2.5-7B-Instruct": (
        SamplingConfig(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
        "Qwen2.5-Instruct's default decoding parameters (temperature 0.7, top_p 0.8, top_k 20, "
        "repetition_penalty 1.05), reproduced in public code from the model card and its "
        "generation_config.json; the file itself was not readable here"),
}


def generation_defaults(hf_id: str) -> tuple[SamplingConfig, str]:
    """The sampling of a request that sent none, for this model: its listed defaults, else vLLM's
    neutral parameters; with where they come from."""
    if hf_id in GENERATION_DEFAULTS:
        return GENERATION_DEFAULTS[hf_id]
    return SamplingConfig(), "vLLM's neutral defaults (this model's generation_config.json is not listed)"
