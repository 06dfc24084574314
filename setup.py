"""The one compiled part: the certificate's spelling loop (`qwen_data/certify/_spell.c`). Optional: where
it cannot be built, the same check runs in numpy, slower (`certify.spelling`)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("qwen_data.certify._spell", ["qwen_data/certify/_spell.c"], optional=True,
                             extra_compile_args=["-O2"])])
