"""``stallfree ui``: an interactive page over the same functions the command line uses.

- :mod:`.api`: the JSON API as one pure function (routes, OpenAI-style 4xx errors);
- :mod:`.explain_view`, :mod:`.traffic_view`, :mod:`.tune_view`: each view's data, from
  :func:`stallfree.explain.run_explain` (the options ``stallfree explain`` builds from its flags),
  :func:`stallfree.sim.simulate`, and a saved ``tune --json`` result; nothing is computed a
  second time in the page's JavaScript;
- :mod:`.server`: the standard library's threading HTTP server;
- :mod:`.export`: ``stallfree explain --html``, the page as one self-contained file;
- ``static/``: the page (HTML, CSS, and plain-SVG charts in a few hundred lines of JavaScript).

Nothing here imports the command line (``stallfree.cli``): both stand on the same library calls.
"""
