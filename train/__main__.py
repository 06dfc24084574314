import sys

from .commands import train

sys.exit(train())
