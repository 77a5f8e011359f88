"""Encryption at rest: the keyring (``crypto``: keys, sealed columns bound to their row) and
sealed files (``sealed``: chunked AES-GCM with random access).

Imports config only: everything else in models may build on it, it builds on nothing.
Re-encrypting what is stored under an old key needs the tables, so it is
``models.maintenance.rotation``."""
