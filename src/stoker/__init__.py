"""stoker: a Kubernetes operator that keeps vLLM fleets hot."""

__version__ = "0.1.0"
