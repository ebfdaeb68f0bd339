"""The command line: a thin layer over the library (envbisect.runs, envbisect.state, envbisect.report)."""
