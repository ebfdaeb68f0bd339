"""Inputs: the playbook, env files, times and secret masking. Pure parsing; no I/O but reading local files."""
