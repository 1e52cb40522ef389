"""`python -m pardec_cli` runs the command-line interface."""

from pardec_cli.cli.main import main

# Guarded: vLLM (`--engine vllm`) starts its engine in a spawned process, which imports
# this module again as `__mp_main__`; it must not run the CLI a second time.
if __name__ == "__main__":
    main()
