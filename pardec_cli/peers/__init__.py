"""Other inference engines that pardec measures itself against (`pardec bench --baseline`).

    llamacpp.py         llama.cpp (llama-cpp-python) through a worker process: find the
                        model's GGUF, run greedy generations on token ids, survive a crash
    llamacpp_worker.py  the worker: one Llama object, JSON lines on stdin/stdout

These are optional (`pip install 'pardec[peers]'`); nothing here imports them until a
baseline is asked for, and llama.cpp itself is only ever imported inside the worker, so
that a crash in its native code cannot take the benchmark down with it.
"""
