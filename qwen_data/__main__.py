"""`python -m qwen_data`: as the `qwen-data` command runs (`launch`)."""

import sys

from .launch import main

sys.exit(main())
