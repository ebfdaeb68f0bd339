"""Runs: a bisection, a revert/apply, their folders, and the Deployment they act on."""
