"""pardec: fast local LLM generation with parallel decoding.

Importing this package is cheap on purpose: nothing here imports torch or transformers,
so `pardec --help` and shell completion stay fast. Heavy modules import them lazily.
"""

__version__ = "0.1.0"
