"""Maintainers' measurement tools, run as `python -m devtools.NAME`.

measure_priors re-measures the task profiles' priors (profiles/*.toml), auto_share
compares `--method auto` with the best single method in `pardec bench --json` reports,
task_accuracy scores task detection on the benchmark prompts, and chat_overhead measures
`pardec chat` against `pardec gen` in a real terminal (tmux), and kernel_ab times edited
copies of the AVX2 kernels' source against the installed library in one process. None
of them is imported by the CLI.
"""
