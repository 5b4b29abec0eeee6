"""What every benchmark script shares: servers (start, wait, stop), the host (its CPU, its load), the CLI.

The scripts under ``benchmarks/<group>/`` put ``benchmarks/`` on ``sys.path`` and import
``common.servers``, ``common.host`` and ``common.cli``; a script that needs another group's
helper imports it by group (``from fidelity.validate_cpu import ...``).
"""
