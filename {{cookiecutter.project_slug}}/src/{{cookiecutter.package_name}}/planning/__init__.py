"""Planning a run before renting the TPU: per-device memory on any mesh of any slice, and
per-host memory while the model is loaded and exported.

`plan` builds the run's model on PyTorch's meta device (shapes and dtypes, no memory, no
download), lays its parameters, gradients and optimizer state out as the run would
(`core/sharding.py`), records what autograd saves in one forward pass for the activations,
and compares the sum with the HBM of one device of the slice (`core/tpu_generations.json`);
`host_memory.py` holds what each host needs to load and export the model against the RAM
of the slice's hosts. Nothing here needs torch_xla or starts an XLA runtime: it runs on any
laptop.
"""
