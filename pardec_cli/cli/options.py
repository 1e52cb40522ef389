"""Options shared by several commands (model, method, sampling), declared once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from pardec_cli.cli.completion import complete_model
from pardec_cli.methods.registry import method_names
from pardec_cli.planning import AUTO
from pardec_cli.weight_modes import WEIGHT_MODES

F = Callable[..., Any]


class MethodName(click.ParamType):
    """"auto" or a registered method name; validated when the method is built (clear
    error, close-match hint)."""

    name = "METHOD"

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        return [CompletionItem(name) for name in [AUTO, *method_names()] if name.startswith(incomplete)]


class ProfileName(click.ParamType):
    """"auto" or a task profile (built-in or the user's); validated once the command runs."""

    name = "PROFILE"

    def shell_complete(self, ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        from pardec_cli.selection.profiles import profile_names

        return [CompletionItem(name) for name in [AUTO, *profile_names()] if name.startswith(incomplete)]


def profile_option(f: F) -> F:
    """-P/--profile: the task profile (sampling defaults, auto's candidate methods)."""
    return click.option(
        "-P", "--profile", default=AUTO, show_default=True, type=ProfileName(),
        help="Task profile: code, chat, extraction (or one of yours), or auto to detect it from the prompt. "
        "Sets sampling defaults for options you leave unset, and the methods --method auto weighs.",
    )(f)


def model_options(f: F) -> F:
    """-m/--model, --dtype, --weights, --device, --offline."""
    f = click.option("--offline", is_flag=True, default=None, help="Never contact the Hugging Face Hub (also HF_HUB_OFFLINE=1).")(f)
    f = click.option(
        "--device", default="auto", show_default=True, metavar="auto|cpu|cuda[:N]",
        help="Where to run. auto: CUDA when available, else CPU.",
    )(f)
    f = click.option(
        "--dtype", default="auto", show_default=True,
        type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
        help="Weights and compute dtype. auto: on a CPU, float32 where auto's weights run on pardec's native "
        "step once its kernels are built (a GGUF 4-bit model as q4q8; a dense or Q8_0 model as q8q8, except "
        "on AMX CPUs; one native call per step, the fastest step measured, AVX512 or not); else bfloat16 "
        "where the hardware runs it fast (CUDA with bf16, a CPU with AMX or AVX512-bf16), else float32. "
        "Greedy output is bit-exact only in float32.",
    )(f)
    f = click.option(
        "--weights", default="auto", show_default=True, type=click.Choice(WEIGHT_MODES),
        help="How the decoder's weights are held. full: dense, in the --dtype; int8: 8-bit per channel; int4: "
        "4-bit in groups of 32 (fewer bytes read per token, slightly different output); q4q8: int4 weights "
        "by 8-bit activations, as llama.cpp multiplies Q4_1 (CPUs with AVX512-VNNI or AVX2: faster steps, "
        "further from the full model; pardec compiles its kernel once, ~20 s); q8q8: 8-bit weights in groups "
        "of 32 by 8-bit activations, llama.cpp's Q8_0 (float32 on a CPU with AVX2: half the bytes of "
        "bfloat16, nearer the full model than q4q8). On a CPU all of them also take the output head's "
        "product in int8. auto: what measured fastest for the --dtype on a CPU (in float32 once pardec's "
        "kernels are built: q4q8 for a GGUF 4-bit model, q8q8 for a dense or Q8_0 one), dense on GPUs.",
    )(f)
    f = click.option(
        "-m", "--model", "model", default=None, metavar="MODEL", shell_complete=complete_model,
        help="Alias (smollm2-135m), Hub id (org/name) or local directory. Default: the embedded SmolLM2-135M-Instruct.",
    )(f)
    return f


def compile_option(f: F) -> F:
    """--compile auto|on|off: the compiled runner (torch.compile over a static KV cache);
    `compile = "off"` in config.toml, PARDEC_GEN_COMPILE=off in the environment."""
    return click.option(
        "--compile", "compile", default=AUTO, show_default=True, type=click.Choice(["auto", "on", "off"]),
        help="Run decoding steps through torch.compile over a static KV cache. on: compile each kind of "
        "step on first use (a minute or two per model on CPU, once: the steps are saved and later runs "
        "load them in seconds); off: eager; auto: compiled where it pays back (bench, tune, serve, and "
        "a -n large enough, far smaller once the steps are saved; `pardec doctor` says how large). "
        "The output is the same either way.",
    )(f)


def compile_notice(message: str) -> None:
    """The runner's one-line messages (compiling a step, falling back to eager), on stderr."""
    click.echo(f"pardec: {message}", err=True)


def method_options(default: str = AUTO) -> Callable[[F], F]:
    """--method, -O/--option KEY=VALUE, --draft-model, --heads."""

    def decorate(f: F) -> F:
        f = click.option(
            "--heads", "heads_dir", default=None, metavar="DIR",
            type=click.Path(exists=True, file_okay=False, path_type=str),
            help="Medusa/EAGLE heads for --method medusa, eagle or eagle3 (default: the heads installed for the model).",
        )(f)
        f = click.option(
            "--draft-model", default=None, metavar="MODEL", shell_complete=complete_model,
            help="Draft model for --method draft (same tokenizer as the target); with --method auto, "
            "a drafter auto may choose.",
        )(f)
        f = click.option(
            "-O", "--option", "method_opts", multiple=True, metavar="KEY=VALUE",
            help="A method knob, repeatable (e.g. -O num_draft=8). `pardec methods` lists them.",
        )(f)
        f = click.option(
            "--method", default=default, show_default=True, type=MethodName(),
            help="Decoding method: auto (chosen per prompt for this hardware and task; `pardec doctor` shows its picks), "
            + ", ".join(method_names()) + "; with knobs as bench and --explain print them, e.g. 'pld[num_draft=8]'.",
        )(f)
        return f

    return decorate


class FiniteFloat(click.FloatRange):
    """A float in a range that must also be finite: 'nan' and 'inf' parse as floats but
    compare false with every bound, so a plain FloatRange lets them through."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def sampling_options(f: F) -> F:
    """-n/--max-tokens, --temp, --top-p, --top-k, --seed, --stop."""
    f = click.option("--stop", multiple=True, metavar="TEXT", help="Stop when this text appears (not printed). Repeatable.")(f)
    f = click.option("--seed", type=int, default=None, help="Random seed: the same seed gives the same sampled text.")(f)
    f = click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="Sample among the K most likely tokens (0: all).")(f)
    f = click.option("--top-p", type=FiniteFloat(0.0, 1.0, min_open=True), default=1.0, show_default=True, help="Nucleus sampling threshold.")(f)
    f = click.option("--temp", "temperature", type=FiniteFloat(min=0.0), default=0.0, show_default=True, help="Sampling temperature; 0 is greedy.")(f)
    f = click.option("-n", "--max-tokens", type=click.IntRange(min=1), default=256, show_default=True, help="Most tokens to generate.")(f)
    return f


ENGINES = ("pardec", "vllm")


def engine_options(f: F) -> F:
    """--engine, --tensor-parallel, --pipeline-parallel."""
    f = click.option(
        "--pipeline-parallel", type=click.IntRange(min=1), default=None, metavar="N",
        help="With --engine vllm: pipeline stages (layers split across GPUs or nodes). Default: what the "
        "tensor split leaves of the GPUs found.",
    )(f)
    f = click.option(
        "--tensor-parallel", type=click.IntRange(min=1), default=None, metavar="N",
        help="With --engine vllm: GPUs each layer is split across. Default: the GPUs found (a divisor of "
        "the model's attention heads). More than this machine has: a multi-node run over Ray.",
    )(f)
    f = click.option(
        "--engine", type=click.Choice(ENGINES), default="pardec", show_default=True,
        help="Who decodes: pardec's own engine, or vLLM (pip install 'pardec[vllm]') with pardec's choice of "
        "method translated to its speculative_config, across GPUs and nodes.",
    )(f)
    return f


HEAD_METHODS = ("medusa", "eagle", "eagle3")


def split_method(method: str, method_opts: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """'pld[num_draft=8]', a label as bench, tune and --explain print it, -> ('pld',
    ('num_draft=8', *method_opts)): the knobs in brackets are -O pairs. A knob given both
    ways is a usage error (which value was meant?)."""
    from pardec_cli.methods.options import merge_label_knobs

    return merge_label_knobs(method, method_opts, "with -O")


def build_method_options(
    method: str, method_opts: tuple[str, ...], draft_model: str | None, heads_dir: str | None = None
) -> dict[str, Any]:
    """Merge -O pairs, --draft-model and --heads into the option mapping for `method`."""
    from pardec_cli.errors import PardecUsageError
    from pardec_cli.methods.options import parse_assignments

    options: dict[str, Any] = parse_assignments(method_opts)
    if method == AUTO:
        from pardec_cli.methods.options import resolve_options
        from pardec_cli.methods.registry import AUTO_OPTIONS

        auto_knobs = {option.name for option in AUTO_OPTIONS}
        if set(options) - auto_knobs:
            raise PardecUsageError(
                "-O sets a knob of a named method; with --method auto the knobs are chosen too "
                f"(auto's own: {', '.join(sorted(auto_knobs))})",
                hint="name the method (--method pld -O num_draft=8), or see auto's choice with --explain",
            )
        resolve_options(AUTO, AUTO_OPTIONS, options)  # a bad value fails before the model loads
        return options  # --draft-model, if any, is a drafter auto may use
    if draft_model:
        if method != "draft":
            raise PardecUsageError(f"--draft-model is for --method draft, not {method!r}")
        options["model"] = draft_model
    if heads_dir:
        if method not in HEAD_METHODS:
            raise PardecUsageError(f"--heads is for --method {', '.join(HEAD_METHODS)}, not {method!r}")
        options["heads"] = heads_dir
    # Check the name and knobs now, before a model is loaded (which can take a while).
    from pardec_cli.methods.options import resolve_options
    from pardec_cli.methods.registry import get_spec

    spec = get_spec(method)
    if "+" not in method:  # a combination routes its knobs to its parts when it is built
        resolve_options(method, spec.options, options)
    return options
