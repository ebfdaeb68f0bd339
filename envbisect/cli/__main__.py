"""`python -m envbisect.cli`: the command line."""
from envbisect.cli.app import main

main()
