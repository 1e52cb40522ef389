"""How close quantized weights keep a model to its full weights: top-1 agreement and KL.

Generates a greedy continuation of `--prompts-per-category` prompts of each category of
the bench files with the full (dense) model, then scores every position of those texts
(teacher forcing: one forward per text) with each configuration against the full
model's logits: the share of positions whose top token agrees, and the mean
KL(full || configuration). Configurations: the int4 decoder on torch's kernel with the
dense output head and with `quant.Int8Head` (what `--weights int4` loads on a CPU) and,
where this CPU runs them (`pardec_cli.kernels`, built first if need be), the int4
decoder on pardec's bfloat16 kernel and the q4q8 one (int8 activations, `--weights
q4q8`). Texts are scored in chunks of 64 positions over a cache, so that every layer
runs its decoding kernel (a forward of 256 rows or more takes the dense prefill path).

    python -m devtools.head_agreement [-m MODEL] [--dtype bfloat16] [--new-tokens 96]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "shared" / "bench"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=None, help="model spec (default: the embedded model)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--prompts-per-category", type=int, default=2)
    parser.add_argument("--files", default=f"{BENCH / 'spec_bench_dev.jsonl'},{BENCH / 'code_edit_dev.jsonl'}")
    args = parser.parse_args()

    import torch
    from torch import nn

    from pardec_cli.quant import Int4Records, Int8Head, Int8Records
    from pardec_cli.store.loading import load_model
    from pardec_cli.store.resolve import resolve_model

    import os

    from pardec_cli import kernels
    from pardec_cli.hardware import cpu_info
    from pardec_cli.home import kernels_dir

    path = resolve_model(args.model).path
    os.environ["PARDEC_KERNELS"] = "0"  # the reference on torch's kernels; torch's int4 and int8 kernels
    full, tokenizer = load_model(path, dtype=args.dtype, device="cpu", weights="full")
    int4, _ = load_model(path, dtype=args.dtype, device="cpu", weights="int4")
    int8, _ = load_model(path, dtype=args.dtype, device="cpu", weights="int8")
    head = int4.get_output_embeddings()
    assert isinstance(head, Int8Head), "int4 weights on a CPU load with the int8 head"
    dense = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
    dense.weight, dense.bias = head.weight, head.bias

    prompts: list[str] = []
    for file in args.files.split(","):
        counts: dict[str, int] = {}
        for line in Path(file).read_text("utf-8").splitlines():
            row = json.loads(line)
            if counts.get(row["category"], 0) < args.prompts_per_category:
                counts[row["category"]] = counts.get(row["category"], 0) + 1
                prompts.append(row["turns"][0])
    texts = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
            out = full.generate(ids, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
            texts.append((ids.shape[1], out))

        def logits(model: nn.Module) -> list[torch.Tensor]:
            from transformers import DynamicCache

            scored = []
            for n, out in texts:
                cache, parts = DynamicCache(), []
                for start in range(0, out.shape[1], 64):
                    parts.append(model(out[:, start:start + 64], past_key_values=cache, use_cache=True).logits[0].float())
                scored.append(torch.cat(parts)[n - 1 : -1])
            return scored

        reference = logits(full)
        total = sum(r.shape[0] for r in reference)
        print(f"{len(texts)} texts, {total} positions; {args.dtype}; against full weights")
        configs = [("int4 decoder, dense head", int4, dense), ("int4 decoder, Int8Head", int4, head),
                   ("int8 decoder, Int8Head", int8, int8.get_output_embeddings())]
        flags = cpu_info().flags
        if kernels.cpu_supported(flags, "bfloat16") and args.dtype == "bfloat16":
            kernels.build(kernels.build_dir(kernels_dir()))
            os.environ["PARDEC_KERNELS"] = "1"
            own, _ = load_model(path, dtype=args.dtype, device="cpu", weights="int4")
            assert any(isinstance(m, Int4Records) for m in own.modules()), "int4 in bfloat16 loads on pardec's kernel"
            configs.append((f"int4 on pardec's, {type(own.get_output_embeddings()).__name__}", own, own.get_output_embeddings()))
            configs.append(("int4 on pardec's, Int8Head", own, Int8Head(dense)))
            own8, _ = load_model(path, dtype=args.dtype, device="cpu", weights="int8")
            assert any(isinstance(m, Int8Records) for m in own8.modules()), "int8 in bfloat16 loads on pardec's kernel"
            configs.append((f"int8 on pardec's, {type(own8.get_output_embeddings()).__name__}", own8, own8.get_output_embeddings()))
        if kernels.cpu_supported(flags, "int8"):
            q4q8, _ = load_model(path, dtype=args.dtype, device="cpu", weights="q4q8")
            configs.append(("q4q8 decoder, Int8Head", q4q8, q4q8.get_output_embeddings()))
        for name, model, output_head in configs:
            model.set_output_embeddings(output_head)
            got = logits(model)
            agree = sum(int((g.argmax(-1) == r.argmax(-1)).sum()) for g, r in zip(got, reference))
            kl = sum(float(nn.functional.kl_div(g.log_softmax(-1), r.log_softmax(-1), log_target=True, reduction="sum"))
                     for g, r in zip(got, reference)) / total  # fmt: skip
            print(f"{name:34s} top-1 agreement {100 * agree / total:6.2f}%  KL {kl:.4f}", flush=True)


if __name__ == "__main__":
    main()
