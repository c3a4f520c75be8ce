"""Continual-learning strategies, one module each, found by the registry in :mod:`.base`."""
