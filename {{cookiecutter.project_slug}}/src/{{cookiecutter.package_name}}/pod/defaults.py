"""The baked cloud settings every launcher starts from, and where the project lives on a worker.

`pod` reaches the workers over ssh, `spot` through a SkyPilot task: both put the project in
REMOTE_DIR (relative to where the worker's commands start) and run it with REMOTE_PYTHON,
the environment `scripts/tpu-startup.sh` installs.
"""

from __future__ import annotations

PACKAGE = "{{ cookiecutter.package_name }}"
ZONE = "{{ cookiecutter.zone }}"
PROJECT = "{{ cookiecutter.gcp_project }}"
ACCELERATOR_TYPE = "{{ cookiecutter.accelerator_type }}"
RUNTIME_VERSION = "{{ cookiecutter.runtime_version }}"
REMOTE_DIR = "{{ cookiecutter.project_slug }}"
REMOTE_PYTHON = "/opt/{{ cookiecutter.project_slug }}/.venv/bin/python"
MARKER = "/var/lib/{{ cookiecutter.project_slug }}/startup.done"
STARTUP_LOG = "/var/log/{{ cookiecutter.project_slug }}-startup.log"
STARTUP_SCRIPT = "scripts/tpu-startup.sh"
# What a worker needs of the project: copied by `pod sync`, mounted by a SkyPilot task.
SYNC_PATHS = ("pyproject.toml", "README.md", "Makefile", "src", "configs", "scripts")
