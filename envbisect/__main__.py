"""`python -m envbisect`: the command line, as `envbisect`."""
from envbisect.cli.app import main

main()
