"""Configuration tree of the synthetic generators; YAML scenarios mirror it one to one.

Example (YAML)::

    generator: gamma
    num_requests: 2000
    arrival: {process: gamma, rate_per_s: 8, cv: 3}
    prompt_len: {dist: lognormal, median: 600, sigma: 0.9, max_value: 8000}
    output_len: {dist: empirical, path: sharegpt.csv.gz, column: output}
    prefix: {num_groups: 8, prefix_len: {dist: uniform, low: 256, high: 2048}, fraction: 0.7}
    sessions:
      num_turns: {dist: uniform, low: 2, high: 6}
      think_time_s: {dist: exponential, mean: 5}

A bare number where a distribution is expected means `{dist: fixed, value: <number>}`.
Every config validates itself in ``__post_init__`` and raises InputError naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from servesim.traces.errors import InputError
from servesim.traces.tenant_mix import MixEntry, by_rate, mix_entries

ARRIVAL_PROCESSES = ("poisson", "gamma", "constant")
DISTRIBUTIONS = ("fixed", "uniform", "lognormal", "exponential", "empirical")
POPULARITY = ("uniform", "zipf")


def _bad(field_name: str, message: str, allowed: str) -> InputError:
    return InputError(message, field=field_name, allowed=allowed)


def _positive(value: float | None, name: str, *, allow_zero: bool = False) -> None:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = is_number and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise _bad(name, f"got {value!r}", "a finite number " + (">= 0" if allow_zero else "> 0"))


@dataclass(slots=True)
class ArrivalConfig:
    process: str = "poisson"  # one of ARRIVAL_PROCESSES
    rate_per_s: float = 1.0  # mean arrival rate in requests (or sessions) per second
    cv: float | None = None  # coefficient of variation of the gaps; gamma only (poisson is 1)

    def __post_init__(self) -> None:
        if self.process not in ARRIVAL_PROCESSES:
            raise _bad("process", f"unknown arrival process {self.process!r}",
                       ", ".join(ARRIVAL_PROCESSES))
        _positive(self.rate_per_s, "rate_per_s")
        if self.process == "gamma":
            _positive(self.cv, "cv")
        elif self.cv is not None:
            raise _bad("cv", f"cv={self.cv} given for process {self.process!r}",
                       "cv only with process: gamma")


@dataclass(slots=True)
class DistConfig:
    """A distribution of non-negative values; the unit is the user's (tokens, or seconds)."""

    dist: str = "fixed"  # one of DISTRIBUTIONS
    value: float | None = None  # fixed: the value
    low: float | None = None  # uniform: inclusive bounds (integers when sampling lengths)
    high: float | None = None
    mean: float | None = None  # lognormal (with sigma) or exponential: the mean
    median: float | None = None  # lognormal: alternative to mean, exp(mu)
    sigma: float | None = None  # lognormal: standard deviation of log(value)
    path: str | None = None  # empirical: a length dataset or any loadable trace
    column: str | None = None  # empirical: column; "prompt"/"output" pick the length columns
    min_value: float | None = None  # clip the samples to [min_value, max_value]
    max_value: float | None = None

    def __post_init__(self) -> None:
        if self.dist not in DISTRIBUTIONS:
            raise _bad("dist", f"unknown distribution {self.dist!r}", ", ".join(DISTRIBUTIONS))
        if self.dist == "fixed":
            _positive(self.value, "value", allow_zero=True)
        elif self.dist == "uniform":
            _positive(self.low, "low", allow_zero=True)
            _positive(self.high, "high", allow_zero=True)
            if self.high < self.low:  # type: ignore[operator]
                raise _bad("high", f"high {self.high} < low {self.low}", "high >= low")
        elif self.dist == "lognormal":
            _positive(self.sigma, "sigma", allow_zero=True)
            if (self.mean is None) == (self.median is None):
                raise _bad("mean", "lognormal needs exactly one of mean, median", "mean or median")
            _positive(self.mean if self.mean is not None else self.median,
                      "mean" if self.mean is not None else "median")
        elif self.dist == "exponential":
            _positive(self.mean, "mean")
        elif self.dist == "empirical" and not self.path:
            raise _bad("path", "empirical distribution needs a path", "a length dataset file")
        for name in ("min_value", "max_value"):
            if getattr(self, name) is not None:
                _positive(getattr(self, name), name, allow_zero=True)
        if (self.min_value is not None and self.max_value is not None
                and self.max_value < self.min_value):
            raise _bad("max_value", f"{self.max_value} < min_value {self.min_value}",
                       "max_value >= min_value")


@dataclass(slots=True)
class PrefixConfig:
    num_groups: int = 1  # number of distinct shared prefixes (e.g. system prompts)
    prefix_len: DistConfig = field(default_factory=lambda: DistConfig("fixed", value=512))
    fraction: float = 1.0  # share of requests (or sessions) that start with a group prefix
    popularity: str = "uniform"  # how groups are picked: uniform or zipf
    zipf_s: float = 1.0  # zipf exponent: group k is picked with weight 1/k**zipf_s

    def __post_init__(self) -> None:
        if not isinstance(self.num_groups, int) or self.num_groups < 1:
            raise _bad("num_groups", f"got {self.num_groups!r}", "an integer >= 1")
        if not 0.0 <= self.fraction <= 1.0:
            raise _bad("fraction", f"got {self.fraction!r}", "a number in [0, 1]")
        if self.popularity not in POPULARITY:
            raise _bad("popularity", f"got {self.popularity!r}", ", ".join(POPULARITY))
        _positive(self.zipf_s, "zipf_s", allow_zero=True)


@dataclass(slots=True)
class SessionConfig:
    """Multi-turn sessions / agentic jobs: each turn's prompt extends the previous context."""

    num_turns: DistConfig = field(default_factory=lambda: DistConfig("uniform", low=2, high=6))
    user_tokens: DistConfig | None = None  # new tokens per later turn; None: the prompt_len dist
    think_time_s: DistConfig = field(default_factory=lambda: DistConfig("exponential", mean=5.0))
    tool_call_fraction: float = 0.0  # probability that a gap is a tool call instead of thinking
    tool_call_s: DistConfig = field(default_factory=lambda: DistConfig("exponential", mean=1.0))
    # Open-loop estimate of the previous turn's generation time (s per output token), so a turn
    # never arrives before the previous answer could exist: next = prev + out*this + gap.
    assumed_s_per_output_token: float = 0.02
    max_prompt_len: int | None = None  # end a session before a prompt would exceed this (tokens)
    # True: turn j+1 is sent its gap after the client has turn j's answer, in simulated time
    # (simulator/sessions.py); its arrival_time_s is then the lower bound a_j + gap.
    closed_loop: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.closed_loop, bool):
            raise _bad("closed_loop", f"got {self.closed_loop!r}", "true or false")
        if not 0.0 <= self.tool_call_fraction <= 1.0:
            raise _bad("tool_call_fraction", f"got {self.tool_call_fraction!r}", "[0, 1]")
        _positive(self.assumed_s_per_output_token, "assumed_s_per_output_token", allow_zero=True)
        if self.max_prompt_len is not None and self.max_prompt_len < 1:
            raise _bad("max_prompt_len", f"got {self.max_prompt_len!r}", "an integer >= 1 or none")


@dataclass(slots=True)
class ChoiceConfig:
    values: tuple[int, ...] = (0,)  # e.g. priorities or LoRA adapter ids
    weights: tuple[float, ...] | None = None  # relative weights; None: uniform

    def __post_init__(self) -> None:
        self.values = tuple(self.values)
        if not self.values:
            raise _bad("values", "empty list", "at least one value")
        if any(not isinstance(v, int) or isinstance(v, bool) for v in self.values):
            raise _bad("values", f"got {self.values!r}", "integers")
        if self.weights is not None:
            self.weights = tuple(float(w) for w in self.weights)
            weights = self.weights
            if len(weights) != len(self.values) or min(weights) < 0 or sum(weights) <= 0:
                raise _bad("weights", f"got {self.weights!r}",
                           "one non-negative weight per value, not all zero")


@dataclass(slots=True)
class ImageConfig:
    """Images in each request (the `vlm` generator, traces/vlm.py): how many, at which resolution,
    how often the same image recurs; placeholder tokens per image as Qwen2.5-VL's processor counts
    them (smart_resize to multiples of patch_size * merge_size within [min_pixels, max_pixels], one
    token per merge_size x merge_size patches). Defaults: Qwen2.5-VL's preprocessor_config.json."""

    images_per_request: DistConfig = field(default_factory=lambda: DistConfig("fixed", value=1))
    height: DistConfig = field(default_factory=lambda: DistConfig("fixed", value=720))  # pixels
    width: DistConfig = field(default_factory=lambda: DistConfig("fixed", value=1280))  # pixels
    shared_fraction: float = 0.0  # share of images drawn from a pool of equal images (same mm hash)
    num_shared_images: int = 100  # images in that pool (each with one resolution drawn once)
    min_pixels: int = 3136  # 56 * 56
    max_pixels: int = 12845056  # 28 * 28 * 16384: at most 16384 tokens an image
    patch_size: int = 14
    merge_size: int = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.shared_fraction <= 1.0:
            raise _bad("shared_fraction", f"got {self.shared_fraction!r}", "a number in [0, 1]")
        for name, value in (("num_shared_images", self.num_shared_images), ("min_pixels", self.min_pixels),
                            ("max_pixels", self.max_pixels), ("patch_size", self.patch_size),
                            ("merge_size", self.merge_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise _bad(name, f"got {value!r}", "an integer >= 1")
        if self.max_pixels < self.min_pixels:
            raise _bad("max_pixels", f"{self.max_pixels} < min_pixels {self.min_pixels}", "max_pixels >= min_pixels")


@dataclass(slots=True)
class AudioConfig:
    """Audio in each request, for an encoder-decoder speech model (the `asr` generator, traces/asr.py):
    one encoder input per request, outside the decoder prompt. Whisper's feature extractor pads or
    cuts every clip to 30 s, 3000 mel frames, which its encoder's convolutions halve to 1500 states
    (config.json max_source_positions), so encoder_tokens is 1500 whatever the clip's length."""

    encoder_tokens: int = 1500

    def __post_init__(self) -> None:
        if not isinstance(self.encoder_tokens, int) or isinstance(self.encoder_tokens, bool) or self.encoder_tokens < 1:
            raise _bad("encoder_tokens", f"got {self.encoder_tokens!r}", "an integer >= 1")


@dataclass(slots=True)
class SyntheticConfig:
    name: str = "synthetic"
    num_requests: int | None = 1000  # stop after this many requests (None: use duration_s)
    duration_s: float | None = None  # keep arrivals < duration_s (None: use num_requests)
    arrival: ArrivalConfig = field(default_factory=ArrivalConfig)
    prompt_len: DistConfig = field(default_factory=lambda: DistConfig("fixed", value=512))
    output_len: DistConfig = field(default_factory=lambda: DistConfig("fixed", value=128))
    prefix: PrefixConfig | None = None
    sessions: SessionConfig | None = None
    priority: ChoiceConfig | None = None
    lora: ChoiceConfig | None = None
    images: ImageConfig | None = None  # multimodal requests (independent requests only, not sessions)
    audio: AudioConfig | None = None  # an encoder-decoder speech model's input (not with images or sessions)
    # Tenants and SLO classes (traces/tenant_mix.py): fractions of one stream, or a stream per entry.
    mix: tuple[MixEntry, ...] | None = None

    def __post_init__(self) -> None:
        if self.audio is not None and (self.images is not None or self.sessions is not None):
            raise _bad("audio", "audio with images or sessions", "audio alone (an encoder-decoder model's input)")
        if self.mix is not None:
            self.mix = mix_entries(self.mix)
            if by_rate(self.mix) and self.sessions is not None:
                raise _bad("mix", "rate_per_s entries with sessions", "fractions with sessions")
        if self.images is not None and self.sessions is not None:
            raise _bad("images", "images with sessions", "images or sessions, not both")
        if self.num_requests is None and self.duration_s is None:
            raise _bad("num_requests", "neither num_requests nor duration_s is set",
                       "num_requests >= 1 and/or duration_s > 0")
        if self.num_requests is not None and (
                not isinstance(self.num_requests, int) or self.num_requests < 1):
            raise _bad("num_requests", f"got {self.num_requests!r}", "an integer >= 1 or none")
        if self.duration_s is not None:
            _positive(self.duration_s, "duration_s")


# --- dict <-> dataclass (YAML mirror) ----------------------------------------------------------


def config_from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass `cls` from nested dicts, naming the dotted field on any error."""
    if cls is DistConfig and isinstance(data, (int, float)) and not isinstance(data, bool):
        data = {"dist": "fixed", "value": data}
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping, got {data!r:.60}", field=where or cls.__name__,
                         allowed=f"keys of {cls.__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise InputError(f"unknown key(s) {', '.join(map(str, unknown))}",
                         field=_join(where, unknown[0]), allowed=", ".join(names))
    kwargs = {}
    for key, value in data.items():
        target = dataclass_in(hints[key])
        if target is not None and value is not None:
            value = config_from_dict(target, value, _join(where, key))
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except InputError as exc:
        raise InputError(exc.detail, field=_join(where, exc.field or ""),
                         allowed=exc.allowed) from None
    except TypeError as exc:  # e.g. a string where a number is needed
        raise InputError(f"bad value: {exc}", field=where or cls.__name__) from None


def config_to_dict(config: Any) -> dict[str, Any]:
    """Plain dict (tuples as lists) suitable for YAML/JSON, the inverse of config_from_dict."""
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value
    return plain(config)


def dataclass_in(hint: Any) -> type | None:
    """The dataclass inside `X` or `X | None`, else None (a tuple of dataclasses is a list value:
    its items are built by the dataclass that holds it)."""
    if dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return None
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where and key else (where or key)
