"""The certificate: what a run checks and proves, in one room (see checks.py)."""
