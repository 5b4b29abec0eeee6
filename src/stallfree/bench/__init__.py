"""Load generator for any OpenAI-compatible server: ``client`` (HTTP), ``prompts`` (sizing),
``scenarios`` (long-prompt, open-loop workloads); scored by :mod:`stallfree.metrics`."""
