"""`python -m sdbench`: the command line (sdbench.cli)."""

from sdbench.cli import main

main()
