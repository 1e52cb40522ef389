"""`pardec serve`: an OpenAI-compatible HTTP server over one loaded Session.

protocol  request parsing and checks, response and chunk objects, error bodies (no torch)
worker    the decoding thread: a bounded queue, one generation at a time, cancellation
metrics   Prometheus metrics (one registry per server)
app       the Starlette app: routes, API key, body limit, streaming, disconnects

Layering: like the CLI and the TUI, serve sits on top (session, planning, select);
nothing below imports it, and it imports nothing from the CLI.
"""
