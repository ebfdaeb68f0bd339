"""Agent scripts: sent to a host as `python3 -c` (stdlib only) and run there; never imported by the controller."""
