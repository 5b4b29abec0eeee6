"""stallfree: LLM serving without stalls — one pure scheduler, simulated or real."""

__version__ = "0.1.0"
