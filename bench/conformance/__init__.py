"""Conformance harness: stoker's rendered seed and serving commands run as real vLLM CPU processes.

`make conformance` (python -m bench.conformance) runs the version matrix; tests/e2e/test_live_engine.py
uses the same pieces to give one e2e VLLMService a live engine as its log source.
"""
