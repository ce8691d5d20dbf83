"""Chaos tests: real worker processes killed at failpoints chosen by a logged seed."""
