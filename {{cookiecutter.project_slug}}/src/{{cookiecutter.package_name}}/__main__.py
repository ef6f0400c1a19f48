"""`python -m {{ cookiecutter.package_name }}`."""

from .cli import main

main()
