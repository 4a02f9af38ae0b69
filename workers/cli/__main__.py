"""`python -m workers.cli`: the `relay` command."""

from workers.cli import main

main()
