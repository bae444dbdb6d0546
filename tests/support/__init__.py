"""Shared test helpers: the emulated API server, an in-process kopf runner, real kubectl and helm."""
