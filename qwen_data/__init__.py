"""qwen-data: turn jsonl corpora and chats into Megatron indexed datasets for Qwen."""

__version__ = "0.4.0"
