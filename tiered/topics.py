"""Kafka's rule for legal topic names, in one place, and the like rule for node ids.

Every layer that turns a topic name into a directory, an object key or a config section asks
here: Kafka's own rule (1-249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`) also keeps `/`,
`:` and path tricks such as `../x` out of every path and key we build. A sidecar's node id
becomes part of an object key too, so it follows the same characters, at most 64 of them.
"""

from __future__ import annotations

import re

#: Kafka's maximum topic name length (Topic.MAX_NAME_LENGTH)
MAX_TOPIC_LENGTH = 249
#: Kafka's legal topic characters (Topic.LEGAL_CHARS)
_LEGAL = re.compile(r"[A-Za-z0-9._-]+")
#: how much of a hostile name an error message repeats
_SHOWN_MAX = 60


def _shown(name: str) -> str:
    return repr(name if len(name) <= _SHOWN_MAX else name[:_SHOWN_MAX] + "...")


def is_internal_topic(name: str) -> bool:
    """Kafka's internal topics (`__consumer_offsets`, `__transaction_state`,
    `__cluster_metadata`, ...: every name starting `__`). They are the broker's own state, not
    history anyone reads back, so tiered leaves them alone unless a topic section asks."""
    return name.startswith("__")


def topic_name_problem(name: object) -> str | None:
    """Why `name` is not a legal Kafka topic name, or None when it is."""
    if not isinstance(name, str):
        return f"topic name must be a string, got {type(name).__name__}"
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name {name!r} is not allowed"
    if len(name) > MAX_TOPIC_LENGTH:
        return (
            f"topic name {_shown(name)} is {len(name)} characters long; "
            f"at most {MAX_TOPIC_LENGTH} are allowed"
        )
    if not _LEGAL.fullmatch(name):
        bad = "".join(sorted({ch for ch in name if not _LEGAL.fullmatch(ch)}))
        return (
            f"topic name {_shown(name)} contains {bad!r}; only ASCII letters, digits, "
            "'.', '_' and '-' are allowed"
        )
    return None


#: longest node id: it names an object in the bucket and appears in every lease it holds
MAX_NODE_ID_LENGTH = 64


def node_id_problem(node: object) -> str | None:
    """Why `node` cannot name a sidecar, or None when it can."""
    if not isinstance(node, str):
        return f"node id must be a string, got {type(node).__name__}"
    if not node or len(node) > MAX_NODE_ID_LENGTH or node in (".", "..") \
            or not _LEGAL.fullmatch(node):
        return (f"node id must be 1..{MAX_NODE_ID_LENGTH} characters of [A-Za-z0-9._-], not "
                f"'.' or '..', got {_shown(node)}")
    return None


def node_id_from(text: str) -> str:
    """A legal node id made from `text` (a host name): other characters become '-', and it is
    cut to the longest allowed."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", text)[:MAX_NODE_ID_LENGTH]
    return cleaned if node_id_problem(cleaned) is None else "node"
