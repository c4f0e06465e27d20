"""clotho: run LLM agents with tools in sandboxes and verify their work with each task's tests."""

__version__ = "0.1.0"
