"""YAML a user hands us, bounded: a document's size and the size it expands to through aliases.

PyYAML's safe loader is safe from code execution but not from a "billion laughs" document: a few
anchors, each a list of aliases of the one before, expand to billions of nodes in 1.5 KB. Every
user-facing YAML file (scenarios, cluster and plan configs, `--set` values) goes through here, so
such a file is refused with a message instead of hanging until the kernel kills the process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from servesim.traces.errors import InputError

MAX_YAML_BYTES = 8 * 2**20  # a scenario or config is a few KB; 8 MiB leaves room for inline lists
MAX_YAML_NODES = 1_000_000  # nodes after expanding aliases (a long inline sweep list is ~10^4)


def read_text_bounded(path: str | Path, what: str) -> str:
    """A YAML file's text, read once (a pipe or /dev/stdin too) and at most MAX_YAML_BYTES: an
    endless stream is refused, not read into memory. InputError naming `path` (and `what` it is)
    for an OS error: permission denied, a folder, a missing file."""
    try:
        with open(Path(path).expanduser(), encoding="utf-8") as fh:
            text = fh.read(MAX_YAML_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError(f"cannot read {what}: {reason}", path=str(path)) from None
    if len(text) > MAX_YAML_BYTES:
        raise InputError(f"the {what} is longer than {MAX_YAML_BYTES // 2**20} MiB", path=str(path),
                         allowed=f"at most {MAX_YAML_BYTES // 2**20} MiB")
    return text


def compose_bounded(text: str, path: str | None = None) -> Node | None:
    """The document's node tree (None for an empty document), refused past the bounds above."""
    if len(text) > MAX_YAML_BYTES:
        raise InputError(f"the YAML document is {len(text) / 2**20:.1f} MiB", path=path,
                         allowed=f"at most {MAX_YAML_BYTES // 2**20} MiB")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(f"not valid YAML: {getattr(exc, 'problem', None) or exc}", path=path,
                         line=mark.line + 1 if mark else None) from None
    if node is not None:
        size = expanded_size(node)
        if size > MAX_YAML_NODES:
            raise InputError(f"the YAML document expands to {size:.3g} values through its aliases (*name)",
                             path=path, allowed=f"at most {MAX_YAML_NODES:,} values; write lists out "
                             "instead of nesting aliases")
    return node


def safe_load_bounded(text: str, path: str | None = None) -> Any:
    """yaml.safe_load, within the bounds (aliases stay shared objects, as safe_load makes them)."""
    node = compose_bounded(text, path)
    if node is None:
        return None
    return yaml.SafeLoader("").construct_document(node)


def expanded_size(root: Node) -> int:
    """Nodes in the tree with every alias expanded, in time linear in the distinct nodes (an alias
    is the same Node object as its anchor, so sizes are memoised by identity; PyYAML refuses
    recursive aliases while composing). Iterative: deep nesting cannot exhaust the stack."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        kids = _children(node)
        if children_done or not kids:
            sizes[id(node)] = 1 + sum(sizes[id(k)] for k in kids)
            continue
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sizes[id(root)]


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []
