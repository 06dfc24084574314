import sys

from .commands import train

try:
    sys.exit(train())
except ValueError as exc:  # a refusal before the process group (torchrun then ends the other ranks)
    print(f"qwen-data train: error: {exc}", file=sys.stderr)
    sys.exit(2)
