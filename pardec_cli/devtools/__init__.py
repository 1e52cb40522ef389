"""Maintainers' measurement tools, run as `python -m pardec_cli.devtools.NAME`.

measure_priors re-measures the task profiles' priors (profiles/*.toml), auto_share
compares `--method auto` with the best single method in `pardec bench --json` reports,
and task_accuracy scores task detection on the benchmark prompts. None of them is
imported by the CLI.
"""
