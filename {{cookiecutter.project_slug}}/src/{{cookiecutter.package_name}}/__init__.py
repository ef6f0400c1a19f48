"""The {{ cookiecutter.package_name }} package: PyTorch/XLA training on TPU or XLA:CPU."""

__version__ = "0.1.0"
