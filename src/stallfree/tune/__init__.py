"""Capacity under latency SLOs and the best token budget (``stallfree tune`` / ``sweep``).

- :mod:`~stallfree.tune.slo` — SLOs on summary metrics; :mod:`~stallfree.tune.search` — the
  QPS search state machine; :mod:`~stallfree.tune.candidates` — budget candidates;
- :mod:`~stallfree.tune.trial` — one seeded simulation (:class:`TrialSpec` -> summary);
- :mod:`~stallfree.tune.pools` — serial, local process pool, Ray;
  :mod:`~stallfree.tune.jobs` — many searches over one pool;
- :mod:`~stallfree.tune.capacity` — ``tune``; :mod:`~stallfree.tune.report` — its table;
  :mod:`~stallfree.tune.grid` and
  :mod:`~stallfree.tune.sweep` — ``sweep``.

Nothing is imported here, so ``stallfree --help`` can read :data:`~stallfree.tune.slo.SLO_FLAGS`
without loading numpy and the simulator.
"""
