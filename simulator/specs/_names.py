"""Name normalisation shared by the model and GPU registries.

Users type model and GPU names in many spellings (Hugging Face ids, vendor strings from nvidia-smi,
directory names such as ``h100_sxm``). We compare a normalised form: lowercase, whitespace and
underscores folded to ``-``, and we also try the name without its ``org/`` prefix and without a
trailing chat/instruct suffix, since those variants share the architecture.
"""

from __future__ import annotations

import re

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


def alias_keys(alias: str) -> list[str]:
    """Keys under which one declared alias is registered (with and without its org prefix)."""
    full = normalise(alias)
    short = full.rsplit("/", 1)[-1]
    return [full] if short == full else [full, short]
