"""`python -m trainadvisor`: the command line.

May import: cli."""

from trainadvisor.cli import main

main()
