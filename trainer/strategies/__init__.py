"""Continual-learning strategies, one module each (finetune, ewc, rehearsal, lwf); see :mod:`.base`."""
