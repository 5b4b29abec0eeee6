"""OpenAI-compatible HTTP server over the engine: ``build_server`` and ways to run it.

``protocol`` is the wire format, ``errors`` the error bodies, ``engine_thread`` the one thread
that steps the engine, ``app`` the FastAPI routes, ``responses`` the answers, ``prometheus`` the
metrics registry, ``step_log`` the per-step log, ``launch`` naming the model, binding and serving.
"""
