"""edge-agent: on-device plant-disease recognition that keeps learning.

The daemon side never imports torch; see :mod:`trainer` for the learning side.
"""

__version__ = "0.1.0"
