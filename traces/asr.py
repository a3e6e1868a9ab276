"""Audio in synthetic requests (the `asr` generator): an encoder-decoder speech model's input.

Each request gets one encoder input at offset 0 that is not part of its decoder prompt
(MultiModalFeatureSpec in_prompt false, vLLM 0.19.1's layout for Whisper: one multimodal item,
mm_position offset 0, length = the encoder's states), of AudioConfig.encoder_tokens states, with
its own mm hash (vLLM does not share an encoder-decoder model's encoder outputs). The request's
prompt_len is the decoder prompt (Whisper: <|startoftranscript|><|en|><|transcribe|>
<|notimestamps|>, 4 tokens) and its output_len the transcript.
"""

from __future__ import annotations

from dataclasses import replace

from servesim.scheduler.multimodal import MultiModalFeatureSpec
from servesim.traces.synthetic_config import AudioConfig
from servesim.traces.workload import RequestSpec


def add_audio(specs: list[RequestSpec], cfg: AudioConfig) -> list[RequestSpec]:
    """The requests, each with its audio input (no random draw: every clip is padded to the window)."""
    return [replace(spec, mm_items=(MultiModalFeatureSpec(0, cfg.encoder_tokens, f"{spec.request_id}-audio",
                                                          "audio", in_prompt=False),))
            for spec in specs]
