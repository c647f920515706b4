"""Thin I/O shells that run one handler and report what they observed."""
