"""`python -m pardec_cli` runs the command-line interface."""

from pardec_cli.cli.main import main

main()
