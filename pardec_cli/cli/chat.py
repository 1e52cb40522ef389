"""`pardec chat`: the Textual chat (pardec_cli/tui), started from the command line.

Thin: parse and check the options (before anything slow happens), pick the conversation
to continue, start the app. The model loads inside the app, in a worker thread, so the
window opens at once and torch is never imported on the UI thread.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from pardec_cli.cli.options import (
    build_method_options,
    compile_option,
    method_options,
    model_options,
    profile_option,
    sampling_options,
)
from pardec_cli.cli.output import is_terminal
from pardec_cli.errors import PardecError, PardecUsageError
from pardec_cli.prompt_files import clean_text


@click.command()
@model_options
@compile_option
@method_options()
@sampling_options
@profile_option
@click.option("-s", "--system", default=None, help="System prompt (through the model's chat template).")
@click.option("-c", "--continue", "resume", is_flag=False, flag_value="latest", default=None, metavar="[ID]",
              help="Continue the latest saved conversation, or the one with this id (or id prefix).")
@click.option("--history", is_flag=True, help="Open on the list of saved conversations.")
@click.option("--list", "list_only", is_flag=True, help="Print the saved conversations (id, date, title) and exit.")
@click.option("--save/--no-save", default=True, show_default=True,
              help="Save conversations under the pardec home (config: `save = false` in [chat]).")
def chat(model: str | None, dtype: str, weights: str, device: str, offline: bool | None, compile: str, method: str,
         method_opts: tuple[str, ...], draft_model: str | None, heads_dir: str | None, max_tokens: int,
         temperature: float, top_p: float, top_k: int, seed: int | None, stop: tuple[str, ...], profile: str, system: str | None,
         resume: str | None, history: bool, list_only: bool, save: bool) -> None:
    """Chat with a model in the terminal and watch parallel decoding work.

    Replies stream as the decoding method's drafts are accepted; under each one: the
    method and its knobs, tokens/s, mean tokens per decoding step, time to first token,
    and a sparkline of tokens per step. Esc stops a reply (the text so far stays).
    F2 switches method, knobs, profile and sampling without restarting; F1 lists the
    keys and the /commands (/clear, /system, /method, /save ...).

    Conversations are saved under the pardec home (`pardec config path` shows where
    the config lives; PARDEC_HOME moves the data) unless --no-save.

    \b
    Examples:
      pardec chat
      pardec chat --method lookahead -O window=8 --dtype float32
      pardec chat -m qwen2.5-0.5b --temp 0.7 --top-p 0.9 -s "Answer briefly."
      pardec chat --continue
    """
    from pardec_cli.tui.conversation import ConversationStore
    from pardec_cli.tui.settings import ChatSettings

    store = ConversationStore()
    if list_only:
        print_conversations(store)
        return
    options = build_method_options(method, method_opts, draft_model, heads_dir)
    settings = ChatSettings(method=method, options=options, profile=profile, max_tokens=max_tokens,
                            temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                            stop=tuple(clean_text(s) for s in stop))
    settings.sampling()  # check the values now, not after the app has started
    conversation = None
    if resume is not None:
        conversation = store.latest() if resume == "latest" else store.load(resume)
        if conversation is None:
            raise PardecError("there is no saved conversation to continue", hint="start one with `pardec chat`")
    if not (is_terminal(sys.stdin) and is_terminal(sys.stdout)):
        raise PardecUsageError("pardec chat needs a terminal", hint="in scripts and pipes use `pardec gen`")
    system = clean_text(system) if system is not None else None  # gen's rule for text that is not Unicode
    run_app(settings, model=model, dtype=dtype, device=device, offline=offline, system=system, weights=weights,
            conversation=conversation, save=save, history=history, store=store, compile=compile)


def run_app(settings: Any, *, model: str | None, dtype: str, device: str, offline: bool | None, system: str | None,
            conversation: Any, save: bool, history: bool, store: Any, compile: str = "auto", weights: str = "auto") -> None:
    """Start the Textual app; the model loads in its worker through `Session.load`."""
    from pardec_cli.session import Session
    from pardec_cli.tui.app import ChatApp, ChatOptions

    def load(spec: str | None) -> Session:
        # A reply is one gen's worth of tokens: auto compiles only where that pays back, and
        # a compile would hold the first reply (its notices cannot go to the full screen).
        return Session.load(spec, dtype=dtype, device=device, offline=offline, compile=compile,
                            expected_tokens=settings.max_tokens, weights=weights)

    options = ChatOptions(settings=settings, model=model, system=system, conversation=conversation, save=save,
                          show_history=history, store=store)
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
