"""OpenAI-compatible HTTP server over the engine: ``build_server`` and ways to run it.

``protocol`` is the wire format, ``engine_thread`` the one thread that steps the engine,
``app`` the FastAPI routes, ``metrics`` the Prometheus registry, ``runner`` binding and serving.
"""
