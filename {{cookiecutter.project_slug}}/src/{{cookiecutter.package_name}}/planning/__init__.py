"""Planning a run before renting the TPU: per-device memory on any mesh of any slice.

`plan` builds the run's model on PyTorch's meta device (shapes and dtypes, no memory, no
download), lays its parameters, gradients and optimizer state out as the run would
(`core/sharding.py`), records what autograd saves in one forward pass for the activations,
and compares the sum with the HBM of one device of the slice (`core/tpu_generations.json`).
Nothing here needs torch_xla or starts an XLA runtime: it runs on any laptop.
"""
