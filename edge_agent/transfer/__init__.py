"""Engine transfer: the trainer hands each published engine version to every daemon over ZeroMQ.

:mod:`.protocol` is the wire format, :mod:`.fetcher` the daemon's side (download, verify, install) and
``trainer/transfer.py`` the trainer's (offers, chunks, the fleet list).
"""
