"""`python -m tools.cli ...`: the same as the `workshop` console script."""

from tools.cli.app import main

main()
