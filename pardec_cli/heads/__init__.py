"""Draft heads that read the target's hidden states: Medusa and EAGLE, in their published formats.

    files.py    reading and writing head directories (config.json, safetensors, pickles
                loaded with weights_only=True), checks against the target
    vocab.py    the output layer a head drafts with: an LM head, optionally restricted
                to a draft vocabulary (EAGLE-3's d2t, or the tokens of a training corpus)
    medusa.py   Medusa heads (FasterDecoding format): residual SiLU blocks + an LM head each
    eagle.py    EAGLE-1/2 (yuhuili format) and EAGLE-3 draft layers, with their own KV cache

The decoding methods that use them are `pardec_cli.methods.medusa` and
`pardec_cli.methods.eagle`; `pardec_cli.training` trains new ones.
"""
