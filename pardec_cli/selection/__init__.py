"""How `--method auto` chooses: everything it knows and guesses, in one package.

- `tasks`: the task profile a prompt looks like (code, chat, extraction).
- `profiles`: the task profiles (profiles/*.toml): candidates, priors, sampling defaults.
- `estimates`: rough device speed (instruction set, data-sheet GPU figures).
- `costmodel`: the verification cost curve, estimated or measured.
- `tuned`: what `pardec tune` measured on this machine, saved and read back.
- `selector`: the choice itself (`AutoSelector`, `select`), measured beats guessed.

Layer: above engine and methods, below cli/tui/serve; `tuning` and `bench` use it.
"""
