"""``stallfree ui``: an interactive page over the same functions the command line uses.

- :mod:`.api`: the JSON API as one pure function (routes, OpenAI-style 4xx errors);
- :mod:`.explain_view`, :mod:`.traffic_view`, :mod:`.tune_view`: each view's data, from
  ``stallfree explain``'s own parser and builder, :func:`stallfree.sim.simulate`, and a saved
  ``tune --json`` result; nothing is computed a second time in the page's JavaScript;
- :mod:`.server`: the standard library's threading HTTP server;
- :mod:`.export`: ``stallfree explain --html``, the page as one self-contained file;
- ``static/``: the page (HTML, CSS, and plain-SVG charts in a few hundred lines of JavaScript).
"""
