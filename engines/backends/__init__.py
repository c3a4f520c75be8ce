"""Engine backends, one module each; :func:`engines.base.backends` discovers them.

To add one, drop a module here that defines a ``BackendConfig`` subclass with a
unique ``type`` literal and an ``Engine`` subclass decorated with ``@register``.
Import its runtime lazily (inside methods), never at module level.
"""
