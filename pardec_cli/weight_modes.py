"""Which weights `--weights` means on this device: a torch-free leaf (doctor reads it
without loading torch; `quant` holds the layers themselves)."""

from __future__ import annotations

WEIGHT_MODES = ("auto", "full", "int8", "int4", "q4q8", "q8q8")

#: Weights whose layers round their activations to int8 groups: the ones pardec's native
#: step (`engine.native`) takes, on a float16 KV cache.
ROUNDED_ACTIVATIONS = ("q4q8", "q8q8", "q4q8+q8q8")

# What `--weights auto` picks on a CPU, by (compute dtype, how the model is stored: "q4"
# for GGUF 4-bit blocks kept, "q8" for Q8_0 ones, None for dense); anything else is
# "full". In bfloat16, int4 over a model's own 4-bit blocks was fastest for one token and
# for a 16-token verification; int8, and any packed kernel in float32, were slower than
# dense. The measurement (devtools/measure_weights.py) is in docs/weights.md.
AUTO_CPU: dict[tuple[str, str | None], str] = {("bfloat16", "q4"): "int4"}
#: Where float32 layers run on pardec's AVX2 kernels (built; `store.loading.auto_native`
#: says where auto wants them), before `AUTO_CPU`: a model kept as GGUF 4-bit blocks runs as
#: q4q8, llama.cpp's own arithmetic for those blocks (Q4_1 by Q8_1), at about half the
#: one-token step of int8 and a third of dense float32 (docs/weights.md, "q4q8 on AVX2");
#: a dense one, or one kept as Q8_0 blocks, as q8q8 (Q8_0 by Q8_0), both on the native
#: step: a SmolLM2-135M token 2.3x faster than dense bfloat16 compiled, nearer the full
#: model than q4q8 (docs/weights.md, "q8q8").
AUTO_AVX2: dict[tuple[str, str | None], str] = {("float32", "q4"): "q4q8", ("float32", "q8"): "q8q8", ("float32", None): "q8q8"}


def resolve_weights(weights: str, *, dtype: str, device: str, stored: str | None, avx2: bool = False) -> str:
    """`--weights` -> "full", "int8", "int4", "q4q8" or "q8q8" for this device, dtype and stored form.

    "auto" takes `AUTO_AVX2` where `avx2` says float32 layers run on pardec's AVX2 kernels
    here, else `AUTO_CPU`, on a CPU, and "full" elsewhere (on an H200, int8 steps were
    slower than bf16 and int4 ones 7% faster for one token: docs/runner.md, "On a GPU").
    Elsewhere it never takes "q4q8" or "q8q8" (weights by int8 activations: further from
    the full model than by bfloat16 ones; docs/weights.md). `stored` is "q4" for
    a model kept with GGUF 4-bit blocks, "q8" for one kept as Q8_0 blocks
    (`store.quantized.stored_kind`), None for dense weights.
    """
    from pardec_cli.errors import PardecUsageError

    if weights not in WEIGHT_MODES:
        raise PardecUsageError(f"unknown --weights {weights!r}", hint="use one of " + ", ".join(WEIGHT_MODES))
    if weights != "auto":
        return weights
    if device == "cpu":
        if avx2 and (dtype, stored) in AUTO_AVX2:
            return AUTO_AVX2[(dtype, stored)]
        return AUTO_CPU.get((dtype, stored), "full")
    return "full"
