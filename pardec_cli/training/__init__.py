"""`pardec train-heads`: Medusa and EAGLE heads for any local model, its weights frozen.

    corpus.py      prompts and texts; the target's own replies (self-distillation), cached
    features.py    the target's hidden states over the corpus, computed once
    objectives.py  the losses (Medusa heads; EAGLE with training-time test)
    trainer.py     AdamW, learning-rate schedule, step/time budget, checkpoints, Ctrl-C
    progress.py    the progress line (redrawn on a terminal only)
    run.py         the stages end to end, saving into the store
"""
