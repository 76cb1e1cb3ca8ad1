"""`python -m tiered.cli`."""

from tiered.cli.main import main

main()
