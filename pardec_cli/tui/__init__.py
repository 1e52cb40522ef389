"""The `pardec chat` TUI: a thin Textual layer over `pardec_cli.session.Session`.

    app.py           ChatApp: layout, bindings, the worker threads that load and generate
    widgets.py       messages, input box, status bar, settings panel
    markdown.py      the replies' Markdown, with code fences that stream cheaply
    pacing.py        how often the generating thread may update the screen
    screens.py       help, saved conversations, model picker
    conversation.py  conversations: JSON store under the pardec home, Markdown transcript
    settings.py      method/profile/sampling settings, validated; the method hook
    commands.py      slash-command parsing
    chat.tcss        styles

Nothing here imports torch at import time: the model (and torch) load in a worker.
"""
