"""What megatron-core needs around it in this process, entered once: `with megatron_core():`.

The patches live by how long they are needed, one module each:
  cpu       stand-ins for CUDA where there is none (smoke tests, CI); nothing on a GPU host
  compat    backports from newer megatron-core, each applied only below the version that fixes it
  autocast  what float32 masters under autocast cost: every run of the trainer needs them
  rope      RoPE's cosine and sine as tables a layer call (a speed patch: the same numbers), and the
            fused QKV split + RoPE in Transformer Engine's place (train/kernels.py's kernel on CUDA)
  swiglu    the MLP's SwiGLU by a Triton kernel on CUDA (a speed patch: train/kernels.py)

Each replaces an attribute with `replacing.replaced`, which restores it on exit, so nothing outside the
`with` block (another test, a later run in the same process) sees a patched library.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def megatron_core() -> Iterator[None]:
    """megatron-core as this process runs it: on the CPU where there is no CUDA, with the backports
    its version lacks, and fit for float32 weights under autocast. Entering it again inside the
    block is harmless: each inner replacement restores the outer one."""
    from . import autocast, compat, cpu, rope, swiglu

    with cpu.megatron_on_cpu(), compat.backports(), autocast.float32_masters_under_autocast(), \
            rope.rope_from_tables(), swiglu.swiglu_kernels():
        yield
