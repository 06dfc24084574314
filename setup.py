"""The one compiled part, `qwen_data/_native.c`: the loops that must run at memory speed (the
certificate's spelling check, the .bin's joinable hash)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("qwen_data._native", ["qwen_data/_native.c"], extra_compile_args=["-O3"])])
