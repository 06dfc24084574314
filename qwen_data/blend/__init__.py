"""Blends: weighted prefixes → the files Megatron-LM reads, and those files read back."""
