"""The root of every error edge-agent raises on purpose, so a caller can catch them all and tell them apart by type.

Each package's errors subclass :class:`EdgeAgentError` (the daemon's, the trainer's and the engines' alike); the
command-line tools print one line for any of them instead of a traceback. Code that must act on the kind of a
failure catches a typed subclass (:class:`edge_agent.imageheader.ImageTruncated`, ...), never reads the message.
"""

from __future__ import annotations

__all__ = ["EdgeAgentError"]


class EdgeAgentError(Exception):
    """An error edge-agent raised on purpose; its message names the file or key and, where there is one, the fix."""
