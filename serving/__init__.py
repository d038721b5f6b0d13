"""Serving: the OpenAI-compatible endpoint at /v1/ (every tier, checkpoint and loaded adapter the
caller may use), the adapters loaded at run time, and the playground page. Above runs, whose policies
it serves; the decoding itself is inference/serving.py."""
