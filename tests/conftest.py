import os
import sys

# Tests import their helpers (multilingual.py ...) by plain name.
sys.path.insert(0, os.path.dirname(__file__))
