"""The {{ cookiecutter.package_name }} package: {% if cookiecutter.backend == "torch_tpu" %}TorchTPU training on TPU, or on CPU processes{% else %}PyTorch/XLA training on TPU or XLA:CPU{% endif %}."""

__version__ = "0.1.0"
