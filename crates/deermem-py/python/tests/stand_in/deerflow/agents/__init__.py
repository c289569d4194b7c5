"""Agents of the stand-in host."""
