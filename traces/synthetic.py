"""Synthetic workload generators, driven by a `SyntheticConfig` and one seeded numpy Generator.

    rng = np.random.default_rng(7)
    workload = make_workload("gamma", {"num_requests": 500,
                                        "arrival": {"rate_per_s": 4, "cv": 2}}, rng)

Generators by name (`available_generators()`): `synthetic` (everything from the config),
`poisson`, `gamma`, `constant` (the same, with that arrival process), `sessions` (multi-turn;
default SessionConfig when the config has none), `vlm` (images in every request, traces/vlm.py;
default ImageConfig when the config has none), `asr` (an audio input per request for an
encoder-decoder model, traces/asr.py). Same config + same seed -> identical workload.

Sessions: session starts follow the arrival process; turn j+1 arrives at
a_j + output_j * assumed_s_per_output_token + gap, where the gap is a think time or, with
probability tool_call_fraction, a tool call; with `closed_loop: true` it is sent the gap after the
client has turn j's answer in simulated time instead (simulator/sessions.py). Its prompt is the previous prompt + previous output +
new user tokens; all turns share one token stream (keyed by session_id), so the prefix really
grows. With num_requests set, all turns are sorted by arrival and the first N kept; the last kept
turn of a cut session becomes its last turn.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from servesim.traces.distributions import arrival_times, clip_round, length_table, sample_values
from servesim.scheduler.registry import Registry
from servesim.traces.errors import InputError, field_error
from servesim.traces.synthetic_config import (
    ARRIVAL_PROCESSES,
    AudioConfig,
    ChoiceConfig,
    DistConfig,
    ImageConfig,
    PrefixConfig,
    SessionConfig,
    SyntheticConfig,
    config_from_dict,
    config_to_dict,
)
from servesim.traces.asr import add_audio
from servesim.traces.tenant_mix import by_rate, label_by_fraction, superposed
from servesim.traces.vlm import add_images
from servesim.traces.workload import RequestSpec, Workload


def _lengths(config: DistConfig, count: int, rng: np.random.Generator, column: str) -> np.ndarray:
    """Token lengths (>= 1) from a distribution."""
    return np.maximum(sample_values(config, count, rng, integer=True, default_column=column), 1)


def sample_prompt_output(
    config: SyntheticConfig, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths; two empirical dists on the same file sample the same rows."""
    p_cfg, o_cfg = config.prompt_len, config.output_len
    if p_cfg.dist == "empirical" and o_cfg.dist == "empirical" and p_cfg.path == o_cfg.path:
        prompt_table = length_table(p_cfg.path, p_cfg.column or "prompt")
        output_table = length_table(o_cfg.path, o_cfg.column or "output")
        rows = rng.integers(0, len(prompt_table), count)  # joint: keeps the correlation
        prompt = clip_round(prompt_table[rows].astype(np.float64), p_cfg, integer=True)
        output = clip_round(output_table[rows].astype(np.float64), o_cfg, integer=True)
        return np.maximum(prompt, 1), np.maximum(output, 1)
    return _lengths(p_cfg, count, rng, "prompt"), _lengths(o_cfg, count, rng, "output")


def _choices(config: ChoiceConfig | None, count: int, rng: np.random.Generator) -> list[Any]:
    if config is None:
        return [None] * count
    weights = None
    if config.weights is not None:
        weights = np.asarray(config.weights) / sum(config.weights)
    picks = rng.choice(len(config.values), size=count, p=weights)
    return [config.values[i] for i in picks]


def assign_groups(
    prefix: PrefixConfig | None, count: int, rng: np.random.Generator
) -> tuple[list[int | None], np.ndarray]:
    """Per item: its shared-prefix group (None: no group) and that group's prefix length."""
    if prefix is None:
        return [None] * count, np.zeros(count, dtype=np.int64)
    group_prefix_len = _lengths(prefix.prefix_len, prefix.num_groups, rng, "prompt")
    if prefix.popularity == "zipf":
        weights = 1.0 / np.arange(1, prefix.num_groups + 1) ** prefix.zipf_s
        weights /= weights.sum()
    else:
        weights = None
    in_group = rng.random(count) < prefix.fraction
    picks = rng.choice(prefix.num_groups, size=count, p=weights)
    groups = [int(g) if member else None for g, member in zip(picks, in_group)]
    lens = np.where(in_group, group_prefix_len[picks], 0).astype(np.int64)
    return groups, lens


def _independent(config: SyntheticConfig, rng: np.random.Generator) -> list[RequestSpec]:
    times = arrival_times(config.arrival, rng, num=config.num_requests,
                          duration_s=config.duration_s)
    n = len(times)
    prompt, output = sample_prompt_output(config, n, rng)
    groups, prefix_lens = assign_groups(config.prefix, n, rng)
    priorities = _choices(config.priority, n, rng)
    loras = _choices(config.lora, n, rng)
    return [
        RequestSpec(
            request_id=f"{config.name}-{i}", arrival_time_s=float(times[i]),
            prompt_len=int(prefix_lens[i] + prompt[i]), output_len=int(output[i]),
            prefix_group=groups[i], prefix_len=int(prefix_lens[i]),
            priority=priorities[i] if priorities[i] is not None else 0, lora_id=loras[i],
        )
        for i in range(n)
    ]


def _session_turns(
    config: SyntheticConfig, sessions: SessionConfig, index: int, start_s: float,
    group: int | None, group_len: int, rng: np.random.Generator,
) -> list[RequestSpec]:
    """All turns of one session (before any num_requests/duration cut)."""
    num_turns = int(max(1, sample_values(sessions.num_turns, 1, rng, integer=True)[0]))
    prompt_first, outputs = sample_prompt_output(config, num_turns, rng)
    user_cfg = sessions.user_tokens or config.prompt_len
    user_tokens = _lengths(user_cfg, num_turns, rng, "prompt")
    think = sample_values(sessions.think_time_s, num_turns, rng, integer=False)
    tool = sample_values(sessions.tool_call_s, num_turns, rng, integer=False)
    is_tool = rng.random(num_turns) < sessions.tool_call_fraction
    priority = _choices(config.priority, 1, rng)[0]
    lora = _choices(config.lora, 1, rng)[0]
    session_id = f"{config.name}-s{index}"
    turns: list[RequestSpec] = []
    arrival_s, prompt_len = start_s, group_len + int(prompt_first[0])
    parent: str | None = None
    gap_s: float | None = None
    for j in range(num_turns):
        if j > 0:
            prev = turns[-1]
            gap_s = float(tool[j - 1] if is_tool[j - 1] else think[j - 1])
            decode_s = 0.0 if sessions.closed_loop else prev.output_len * sessions.assumed_s_per_output_token
            arrival_s = prev.arrival_time_s + decode_s + gap_s
            prompt_len = prev.prompt_len + prev.output_len + int(user_tokens[j])
            parent = prev.request_id if sessions.closed_loop else None
        if sessions.max_prompt_len is not None and prompt_len > sessions.max_prompt_len and turns:
            break
        turns.append(RequestSpec(
            request_id=f"{session_id}-t{j}", arrival_time_s=arrival_s, prompt_len=prompt_len,
            output_len=int(outputs[j]), prefix_group=group, prefix_len=group_len,
            priority=priority if priority is not None else 0, lora_id=lora,
            session_id=session_id, is_last_turn=False,
            parent_request_id=parent, think_time_s=gap_s if parent is not None else None,
        ))
    turns[-1].is_last_turn = True
    return turns


def _sessions(config: SyntheticConfig, rng: np.random.Generator) -> list[RequestSpec]:
    sessions = config.sessions or SessionConfig()
    starts = arrival_times(config.arrival, rng, num=config.num_requests,
                           duration_s=config.duration_s)
    groups, group_lens = assign_groups(config.prefix, len(starts), rng)
    turns = [
        turn
        for k, start in enumerate(starts.tolist())
        for turn in _session_turns(config, sessions, k, start, groups[k], int(group_lens[k]), rng)
    ]
    turns.sort(key=lambda r: r.arrival_time_s)  # stable
    if config.duration_s is not None:
        turns = [t for t in turns if t.arrival_time_s < config.duration_s]
    if config.num_requests is not None:
        turns = turns[: config.num_requests]
    last_seen: dict[str, RequestSpec] = {}
    for turn in turns:
        last_seen[turn.session_id] = turn
    for turn in last_seen.values():
        turn.is_last_turn = True  # a session cut by the limits ends at its last kept turn
    return turns


def generate(config: SyntheticConfig, rng: np.random.Generator, *, generator: str = "synthetic"
             ) -> Workload:
    """Generate a workload from `config`, drawing every random number from `rng`."""
    if config.prompt_len.dist == "fixed" and config.prompt_len.value < 1:
        raise InputError(f"fixed prompt length {config.prompt_len.value}", field="prompt_len.value",
                         allowed="a length >= 1")
    if config.output_len.dist == "fixed" and config.output_len.value < 1:
        raise InputError(f"fixed output length {config.output_len.value}",
                         field="output_len.value", allowed="a length >= 1")
    if by_rate(config.mix):  # a stream per tenant / class (traces/tenant_mix.py)
        requests = superposed(config, rng, _independent)
    else:
        requests = _sessions(config, rng) if config.sessions is not None else _independent(config, rng)
    if config.images is not None:  # drawn after everything else: the text part is the same without
        requests = add_images(requests, config.images, rng)
    if config.audio is not None:
        requests = add_audio(requests, config.audio)
    if config.mix is not None and not by_rate(config.mix):  # drawn last: the same requests, labelled
        requests = label_by_fraction(requests, config.mix, rng)
    source = f"synthetic generator {generator!r}: " + json.dumps(config_to_dict(config))
    return Workload.from_unsorted(requests, name=config.name, source=source)


# --- registry ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GeneratorInfo:
    name: str
    prepare: Callable[[SyntheticConfig], SyntheticConfig]  # checks/completes the config
    description: str


# Built-ins are below; every module of traces/ is imported on the first lookup, so a new
# generator is one new file in traces/.
GENERATORS: Registry[GeneratorInfo] = Registry("generator", plugins="servesim.traces", error=field_error("generator"))


def register_generator(name: str, description: str = ""
                       ) -> Callable[[Callable[[SyntheticConfig], SyntheticConfig]], Any]:
    """Decorator: register a config-preparing function as generator `name`."""
    def wrap(prepare: Callable[[SyntheticConfig], SyntheticConfig]) -> Any:
        GENERATORS.add(name, GeneratorInfo(name, prepare, description or (prepare.__doc__ or "")))
        return prepare
    return wrap


def available_generators() -> list[str]:
    return GENERATORS.names()


@register_generator("synthetic")
def _as_is(config: SyntheticConfig) -> SyntheticConfig:
    """Everything as configured (arrival process, lengths, prefixes, sessions)."""
    return config


def _arrival_generator(process: str) -> None:
    def prepare(config: SyntheticConfig) -> SyntheticConfig:
        if config.arrival.process != process:
            raise InputError(f"generator {process!r} with arrival.process "
                             f"{config.arrival.process!r}", field="arrival.process",
                             allowed=f"{process} (or use generator: synthetic)")
        return config
    register_generator(process, f"{process} arrivals; other settings as configured")(prepare)


for _process in ARRIVAL_PROCESSES:
    _arrival_generator(_process)


@register_generator("sessions")
def _with_sessions(config: SyntheticConfig) -> SyntheticConfig:
    """Multi-turn sessions (default SessionConfig when the config has none)."""
    return config if config.sessions is not None else replace(config, sessions=SessionConfig())


@register_generator("vlm")
def _with_images(config: SyntheticConfig) -> SyntheticConfig:
    """Multimodal requests: images sized as Qwen2.5-VL's processor sizes them (traces/vlm.py); the
    default ImageConfig (one 1280x720 image a request) when the config has none."""
    return config if config.images is not None else replace(config, images=ImageConfig())


@register_generator("asr")
def _with_audio(config: SyntheticConfig) -> SyntheticConfig:
    """Speech recognition on an encoder-decoder model (Whisper): one 30 s audio input per request
    (traces/asr.py); set prompt_len to the decoder prompt (Whisper's task tokens: 4) and output_len
    to the transcript."""
    return config if config.audio is not None else replace(config, audio=AudioConfig())


def make_workload(generator: str, params: Mapping[str, Any] | SyntheticConfig,
                  rng: np.random.Generator) -> Workload:
    """Generate with the named generator; `params` mirrors SyntheticConfig (e.g. from YAML)."""
    info = GENERATORS.get(generator)
    if isinstance(params, SyntheticConfig):
        config = params
    else:
        data = dict(params)
        if generator in ARRIVAL_PROCESSES:  # the name sets the process unless it contradicts it
            arrival = dict(data.get("arrival") or {})
            arrival.setdefault("process", generator)
            data["arrival"] = arrival
        config = config_from_dict(SyntheticConfig, data)
    return generate(info.prepare(config), rng, generator=generator)
