"""Test support: let accelerate run FSDP across CPU processes (gloo), so the FSDP path runs without GPUs.

accelerate only turns FSDP on for GPU-like distributed types; on CPU (MULTI_CPU) it silently falls back to
DDP. The tests put this folder on PYTHONPATH of the ranks they launch (with FINETUNE_APP_TEST_CPU_FSDP=1),
and this hook promotes MULTI_CPU to FSDP when the Trainer passes an FSDP plugin. Everything else -
wrapping, sharding, gathering the state dict - is accelerate's and torch's real code.
"""

import os

if os.environ.get("FINETUNE_APP_TEST_CPU_FSDP") == "1":
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    _original_init = AcceleratorState.__init__

    def _init_with_cpu_fsdp(self, *args, **kwargs):
        _original_init(self, *args, **kwargs)
        plugin = kwargs.get("fsdp_plugin")
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            # Later AcceleratorState() calls copy PartialState's shared state back in: change it there too.
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin

    AcceleratorState.__init__ = _init_with_cpu_fsdp
