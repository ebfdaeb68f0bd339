"""Trials: apply a configuration, co-restart, probe; the layered verify and path check."""
