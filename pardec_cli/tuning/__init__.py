"""`pardec tune`: measure this machine, search method knobs, save what wins.

    prompts.py  the built-in tuning prompt sets (package data), or a user's JSONL file
    curve.py    measure the verification cost curve (forward time of 1..K new tokens)
    space.py    the candidates to try per profile: profile candidates and knob variations
    search.py   successive halving within a time budget (pure: tested on a fake surface)
    evaluate.py runs candidates on prompts through Session, checks output against vanilla
    results.py  the TOML results file per model, device and dtype
    tuner.py    ties them together for one model: what `pardec tune` runs
"""
