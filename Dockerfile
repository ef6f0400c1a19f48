# An image that runs the template's whole test suite (`make test`).
#   docker build -t tpu-template-tests .
#   docker run --rm tpu-template-tests
# Build from a local or mirrored base with --build-arg BASE_IMAGE=<image>.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# make drives the tests; git lets cookiecutter bake from repository URLs.
# Versions follow the base image's distribution release, so they are not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make git \
    && rm -rf /var/lib/apt/lists/*

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN useradd --create-home --uid 10001 --shell /bin/bash tester
WORKDIR /home/tester/tpu-template
USER 10001

# The virtual environments (torch, torch_xla, cookiecutter...; SkyPilot apart) change only with
# requirements-dev.txt and requirements-sky.txt, so they get their own cached layer.
COPY --chown=10001:10001 Makefile requirements-dev.txt requirements-sky.txt ./
RUN make venv

COPY --chown=10001:10001 . .

CMD ["make", "test"]
