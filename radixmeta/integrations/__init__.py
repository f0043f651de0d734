"""Integrations of radixmeta into serving engines.

Each engine has a subpackage that imports the engine only when it is used;
radixmeta itself never depends on an engine.
"""
