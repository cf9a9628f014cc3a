"""Machinery behind the public API. Nothing here is a stable interface."""
