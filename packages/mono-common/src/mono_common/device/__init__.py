"""Triton device helpers (guarded waits, epochs, all-reduce) shared by every model kernel."""
