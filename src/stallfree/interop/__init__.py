"""Interop with other serving simulators: stallfree's prices, deployments and workloads written
in their formats (DynoSim: :mod:`.dynosim`, :mod:`.dynosim_tables`). Imports sim, costs, workload;
nothing imports it."""
