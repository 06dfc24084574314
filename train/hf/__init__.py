"""Hugging Face folders: config.json ↔ model shape, which HF tensors make each parameter, load, save and convert."""
