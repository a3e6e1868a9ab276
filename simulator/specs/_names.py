"""Name normalisation shared by the model and GPU registries.

Users type model and GPU names in many spellings (Hugging Face ids, vendor strings from nvidia-smi,
directory names such as ``h100_sxm``). We compare a normalised form: lowercase, whitespace and
underscores folded to ``-``, and we also try the name without its ``org/`` prefix and without a
trailing chat/instruct suffix, since those variants share the architecture.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SEPARATORS = re.compile(r"[\s_]+")
# Fine-tuned variants with the same architecture as the base checkpoint.
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-hf", "-base", "-it")


def normalise(name: str) -> str:
    return _SEPARATORS.sub("-", name.strip().lower())


def candidates(name: str) -> list[str]:
    """Spellings to look up, most specific first."""
    full = normalise(name)
    out = [full]
    short = full.rsplit("/", 1)[-1]
    if short != full:
        out.append(short)
    for base in list(out):
        stripped = True
        while stripped:  # "llama-2-70b-chat-hf" carries two variant suffixes
            stripped = False
            for suffix in _VARIANT_SUFFIXES:
                if base.endswith(suffix):
                    base = base[: -len(suffix)]
                    out.append(base)
                    stripped = True
    return out


def lookup_spec(kind: str, name: str, specs: dict, lookup: dict[str, str]):
    """The spec ``name`` (an id or alias, any spelling ``candidates`` tries) names in a registry
    (``specs``: id -> spec; ``lookup``: key -> id); unknown: an InputError on field ``kind`` listing
    the ids with a did-you-mean."""
    from servesim.scheduler.registry import unknown_name_message
    from servesim.traces.errors import InputError

    for key in candidates(str(name)):
        if key in lookup:
            return specs[lookup[key]]
    raise InputError(unknown_name_message(kind, str(name), sorted(specs)), field=kind,
                     allowed=", ".join(sorted(specs)))


def alias_keys(alias: str) -> list[str]:
    """Keys under which one declared alias is registered (with and without its org prefix)."""
    full = normalise(alias)
    short = full.rsplit("/", 1)[-1]
    return [full] if short == full else [full, short]


# ---- model ids: org prefixes, paths and suffix tokens ---------------------------------------
# Checkpoint ids name the same architecture and config.json shapes as their base model, plus
# suffix tokens of three classes (how Hugging Face repositories are conventionally named):
# a fine-tune (-Instruct, -Chat, -it, -Base, -hf, -Thinking), optionally with a release tag
# (-Instruct-2507: Qwen's dated re-releases), and a quantization (-FP8, -AWQ, -GPTQ-Int4, ...)
# that maps to the weight format servesim prices (simulator/specs/precision.py). Separators in
# suffixes are "-" or "." (neuralmagic/RedHatAI's "-quantized.w8a8").
_FINETUNE = r"instruct|chat|hf|base|it|thinking"
_RELEASE_TAG = re.compile(rf"[-.](?:{_FINETUNE})[-.](\d{{4}})$")
_FINETUNE_SUFFIX = re.compile(rf"[-.](?:{_FINETUNE})$")
# quantization suffix (longest spellings first) -> servesim weight format. "w8a8" / "int8" is
# INT8 W8A8 (RedHatAI's quantized.w8a8 checkpoints); "FP8" / "FP8-dynamic" per-channel or
# per-tensor fp8 (the registry's @fp8 variants; a block-scaled checkpoint's config.json says fp8_block).
_QUANT_SUFFIXES = (
    ("quantized.w8a8", "int8"), ("quantized.w4a16", "int4"), ("fp8-dynamic", "fp8"),
    ("fp8-static", "fp8"), ("fp8-block", "fp8_block"), ("gptq-int4", "int4"), ("awq", "int4"),
    ("gptq", "int4"), ("w4a16", "int4"), ("int4", "int4"), ("w8a8", "int8"), ("int8", "int8"),
    ("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("fp8", "fp8"),
)


@dataclass(slots=True, frozen=True)
class IdCandidate:
    """One spelling of a model id to look up: the normalised ``key``, the suffix tokens taken off
    to reach it (as written, lowercase, in the order they appear), and the org/path prefix dropped."""

    key: str
    suffixes: tuple[str, ...] = ()
    prefix: str = ""


def model_id_candidates(name: str) -> list[IdCandidate]:
    """Spellings of a model id to look up, most specific first: the id, without its org prefix or
    folder (``RedHatAI/``, ``/data/model/``), then with one more suffix token taken off the end at
    a time (``-FP8``, then ``-Instruct``; ``-Instruct-2507`` is one token)."""
    full = normalise(name).rstrip("/")
    short = full.rsplit("/", 1)[-1]
    prefix = full[: len(full) - len(short)]
    out = [IdCandidate(full)] + ([IdCandidate(short, prefix=prefix)] if prefix else [])
    base, taken = short, ()
    while True:
        token = _suffix_token(base)
        if token is None or len(token) >= len(base):
            return out
        base, taken = base[: -len(token)], (token, *taken)
        out.append(IdCandidate(base, taken, prefix))


def _suffix_token(name: str) -> str | None:
    """The known suffix token that ``name`` ends with (separator included), or None."""
    for pattern in (_RELEASE_TAG, _FINETUNE_SUFFIX):
        m = pattern.search(name)
        if m:
            return m.group(0)
    for suffix, _ in _QUANT_SUFFIXES:
        if name.endswith(suffix) and name[-len(suffix) - 1: -len(suffix)] in ("-", "."):
            return name[-len(suffix) - 1:]
    return None


def quantization_of(token: str) -> str | None:
    """The weight format a suffix token names (``-fp8-dynamic`` -> ``fp8``), or None."""
    return dict(_QUANT_SUFFIXES).get(token[1:])


def is_release_tag(token: str) -> bool:
    """``-instruct-2507``: a dated re-release (same architecture; the config may differ in its
    context length, e.g. max_position_embeddings)."""
    return _RELEASE_TAG.fullmatch(token) is not None
