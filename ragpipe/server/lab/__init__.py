"""The laboratory: server-rendered pages over the workspace's evaluation runs and corpora.

``ragpipe serve`` mounts it under ``/lab/`` (``ragpipe.server.app``). Only a key whose entry has the
role ``reviewer`` may open it (``login.py``); the pages read runs through the evaluation run readers
(``readers.py``: ``verify_run``, ``TraceReader``) and compare runs with the experiment's own pairing
and comparison; ``views.py`` renders them with autoescaped Jinja2 templates and one vendored CSS
and JS file (package data), under a ``default-src 'self'`` Content Security Policy. docs/lab.md.
"""
