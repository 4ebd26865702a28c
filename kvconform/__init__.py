"""kvconform: a differential-testing harness for vLLM's KV-cache block reservation."""

__version__ = "0.1.0"
