"""Figures (matplotlib, Agg backend): timelines, sweeps, distributions."""
