"""`pardec chat`: the Textual chat (pardec_cli/tui), or a line-mode chat, from the command line.

Thin: parse and check the options (before anything slow happens), pick the conversation
to continue, start the full-screen app, or the line mode (chat_plain.py) with --plain or
when stdin or stdout is not a terminal. The model loads inside the app, in a worker
thread, so the window opens at once and torch is never imported on the UI thread. With
--server the replies come from a running `pardec serve` and no model is loaded here.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from pardec_cli.cli.options import (
    AUTO,
    build_method_options,
    compile_option,
    method_options,
    model_options,
    profile_option,
    sampling_options,
    split_method,
)
from pardec_cli.cli.output import is_terminal
from pardec_cli.errors import PardecError, PardecUsageError
from pardec_cli.prompt_files import clean_text


@click.command()
@click.argument("message", nargs=-1)
@model_options
@compile_option
@method_options()
@sampling_options
@profile_option
@click.option("--greedy", is_flag=True, help="Greedy decoding (the same as --temp 0): the same reply every time.")
@click.option("--repeat-guard/--no-repeat-guard", "repetition_guard", default=True, show_default=True,
              help="End a reply caught in a loop (the same block of tokens over and over); it only cuts the "
              "reply short, the tokens before are sampled as without it.")
@click.option("-s", "--system", default=None, help="System prompt (through the model's chat template).")
@click.option("-c", "--continue", "resume", is_flag=False, flag_value="latest", default=None, metavar="[ID]",
              help="Continue the latest saved conversation, or the one with this id (or id prefix).")
@click.option("--history", is_flag=True, help="Open on the list of saved conversations.")
@click.option("--list", "list_only", is_flag=True, help="Print the saved conversations (id, date, title) and exit.")
@click.option("--save/--no-save", default=True, show_default=True,
              help="Save conversations under the pardec home (config: `save = false` in [chat]).")
@click.option("--plain", is_flag=True,
              help="Line-mode chat: messages on stdin, replies on stdout, stats on stderr (the default when "
              "stdin or stdout is not a terminal).")
@click.option("--server", default=None, metavar="URL",
              help="Chat with a running `pardec serve` (e.g. http://127.0.0.1:8000) instead of loading the model "
              "here (config: `server = ...` in [chat]); -m names the server's model. Its API key: PARDEC_SERVE_API_KEY.")
def chat(message: tuple[str, ...], model: str | None, dtype: str, weights: str, device: str, offline: bool | None,
         compile: str, method: str, method_opts: tuple[str, ...], draft_model: str | None, heads_dir: str | None,
         max_tokens: int, temperature: float, top_p: float, top_k: int, seed: int | None, stop: tuple[str, ...],
         profile: str, greedy: bool, repetition_guard: bool, system: str | None, resume: str | None, history: bool,
         list_only: bool, save: bool, plain: bool, server: str | None) -> None:
    """Chat with a model in the terminal and watch parallel decoding work.

    MESSAGE, if given, is sent as the first message. Replies stream as the decoding
    method's drafts are accepted; under each one, one line: the method, tokens/s, mean
    tokens per decoding step, time to first token, why it ended, the sampling, and a
    sparkline of tokens per step. Esc stops a reply (the text so far stays). F2 switches
    method, knobs, profile and sampling without restarting; F1 lists the keys and the
    /commands (/clear, /system, /method, /set, /save, /copy, /rename ...).

    Each reply is planned as `pardec gen` plans a prompt: the task profile (-P, or
    detected from your message) gives the sampling you leave unset. The chat profile
    samples, with the model's recommended settings where its generation_config.json
    has them (else temperature 0.8, top-p 0.95), and a guard ends a reply caught in a
    loop; --greedy (or --temp 0) decodes greedily; the code profile is greedy.

    With --plain, or when stdin or stdout is not a terminal, the chat runs line by line:
    each line of input is a message or a /command, each reply is printed as it streams.

    Conversations are saved under the pardec home (`pardec config path` shows where
    the config lives; PARDEC_HOME moves the data) unless --no-save; Ctrl+S or /save
    writes the Markdown transcript next to them.

    \b
    Examples:
      pardec chat
      pardec chat "Write a haiku about fast decoding"
      pardec chat --greedy --method lookahead -O window=8 --dtype float32
      pardec chat -m qwen2.5-0.5b --temp 0.7 --top-p 0.9 -s "Answer briefly."
      pardec chat --continue
      echo "What is a KV cache?" | pardec chat --no-save
      pardec chat --server http://127.0.0.1:8000
    """
    from pardec_cli.tui.conversation import ConversationStore
    from pardec_cli.tui.settings import ChatSettings

    method, method_opts = split_method(method, method_opts)
    store = ConversationStore()
    if list_only:
        print_conversations(store)
        return
    ctx = click.get_current_context()
    given = given_options(ctx, ("max_tokens", "temperature", "top_p", "top_k"))
    if greedy:
        if "temperature" in given and temperature != 0:
            raise PardecUsageError("--greedy and --temp cannot be combined", hint="--greedy is --temp 0")
        temperature, given = 0.0, given | {"temperature"}
    drafters: tuple[str, ...] = (draft_model,) if draft_model and method == AUTO else ()
    options = build_method_options(method, method_opts, draft_model, heads_dir)
    values = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k}
    settings = ChatSettings(method=method, options=options, profile=profile, seed=seed,
                            stop=tuple(clean_text(s) for s in stop), drafters=drafters,
                            repetition_guard=repetition_guard, **{k: v for k, v in values.items() if k in given})
    settings.sampling()  # check the values now, not after the app has started
    if profile != AUTO:
        from pardec_cli.planning import load_profiles_checked

        load_profiles_checked(profile)
    conversation = None
    if resume is not None:
        conversation = store.latest() if resume == "latest" else store.load(resume)
        if conversation is None:
            raise PardecError("there is no saved conversation to continue", hint="start one with `pardec chat`")
    system = clean_text(system) if system is not None else None  # gen's rule for text that is not Unicode
    first = clean_text(" ".join(message)) if message else None
    if server:
        from pardec_cli.client import API_KEY_ENV
        from pardec_cli.tui.backend import RemoteChat

        if engine_options_given(ctx):
            raise PardecUsageError("--server uses the server's model as it was loaded",
                                   hint="leave out --dtype, --weights, --device, --compile (and set them on `pardec serve`)")
        api_key = os.environ.get(API_KEY_ENV) or None

        def load(spec: str | None) -> Any:
            return RemoteChat(server, model=spec, api_key=api_key)
    else:
        def load(spec: str | None) -> Any:
            from pardec_cli.session import Session

            # A reply is one gen's worth of tokens: auto compiles only where that pays back, and
            # a compile would hold the first reply (its notices cannot go to the full screen).
            return Session.load(spec, dtype=dtype, device=device, offline=offline, compile=compile,
                                expected_tokens=settings.value("max_tokens"), weights=weights)

    if plain or not (is_terminal(sys.stdin) and is_terminal(sys.stdout)):
        from pardec_cli.cli.chat_plain import run_plain

        run_plain(load, settings, model=model, system=system, conversation=conversation,
                  store=store if save else None, first_message=first)
        return
    run_app(settings, load, model=model, system=system, conversation=conversation, save=save, history=history,
            store=store, first_message=first)


def given_options(ctx: click.Context, names: Any) -> set[str]:
    """Which of `names` the user set: on the command line, in PARDEC_CHAT_*, or in config.toml
    (the others are left to the task profile, as in `pardec gen`)."""
    from click.core import ParameterSource

    return {name for name in names if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}


def engine_options_given(ctx: click.Context) -> bool:
    return bool(given_options(ctx, ("dtype", "weights", "device", "compile")))


def run_app(settings: Any, load: Any, *, model: str | None, system: str | None, conversation: Any, save: bool,
            history: bool, store: Any, first_message: str | None = None) -> None:
    """Start the Textual app; the model loads in its worker through `load`."""
    from pardec_cli.tui.app import ChatApp, ChatOptions

    options = ChatOptions(settings=settings, model=model, system=system, conversation=conversation, save=save,
                          show_history=history, store=store, first_message=first_message)
    ChatApp(options, load).run()


def print_conversations(store: Any) -> None:
    """`pardec chat --list`: one line per saved conversation, newest first."""
    rows = store.list()
    if not rows:
        click.echo("no saved conversations", err=True)
        return
    for row in rows:
        when = row.updated.replace("T", " ")[:16]
        click.echo(f"{row.id}  {when}  {row.turns:3d} messages  {row.model or '?':<16}  {row.title}")
