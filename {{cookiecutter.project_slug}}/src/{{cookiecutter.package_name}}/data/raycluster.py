"""The Ray cluster `prepare --engine ray` runs on: checked before anything is written, joined
for the run, left as found.

`ray.init` retries an address without end when something other than a Ray head answers
there. So before `prepare` claims its output the address is probed once, within
`PROBE_SECONDS`: Ray's GCS must answer (a call for the cluster's metadata, over Ray's own
gRPC channel), and the Ray and Python versions the cluster was started with must pass
Ray's own check against this process's. Joining installs Ray's signal handlers (SIGTERM:
exit on the spot) and leaving does not remove them: the driver's are put back both times.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .manifest import DataError
from .shards import first_line

PROBE_SECONDS = 10.0  # the probe's deadline: an address that is not Ray is refused within it
START_ONE = (
    "start one (make ray-up, or ray up configs/ray-cluster.yaml) and set RAY_ADDRESS or "
    "--ray-address to its head (HOST:6379)"
)
KEPT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise DataError(
            "--engine ray needs the `ray` package, which is not installed: pip install -e "
            "'.[ray]' (or use --engine local)"
        ) from None
    return ray


def check_cluster(address: str) -> None:
    """Refuse, in one line and within PROBE_SECONDS, an address where no Ray cluster of
    this process's versions answers (`local`: a Ray of its own, started here)."""
    if address == "local":
        return
    if address.startswith("ray://"):
        raise DataError(
            f"{address!r} is a Ray Client address: give the head's own address (HOST:6379, "
            "or auto on a node of the cluster)"
        )
    import_ray()
    from ray._private.services import canonicalize_bootstrap_address_or_die

    try:
        target = canonicalize_bootstrap_address_or_die(address)
    except (ConnectionError, ValueError) as error:
        raise DataError(f"no Ray cluster answers at {address!r} ({error}): {START_ONE}") from None
    metadata = _cluster_metadata(address, target)
    if metadata is not None:
        _check_versions(address, metadata)


def _cluster_metadata(address: str, target: str) -> dict[str, Any] | None:
    """What the cluster's GCS holds on how it was started (None: a cluster that keeps none)."""
    import grpc
    from ray._common.usage.usage_constants import CLUSTER_METADATA_KEY
    from ray._private.grpc_utils import init_grpc_channel
    from ray._private.ray_constants import KV_NAMESPACE_CLUSTER
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    request = gcs_service_pb2.InternalKVGetRequest(  # type: ignore[attr-defined]
        key=CLUSTER_METADATA_KEY, namespace=KV_NAMESPACE_CLUSTER
    )
    channel = init_grpc_channel(target)  # TLS and token authentication as Ray sets them up
    try:
        stub = gcs_service_pb2_grpc.InternalKVGcsServiceStub(channel)
        reply = stub.InternalKVGet(request, timeout=PROBE_SECONDS)
    except grpc.RpcError as error:
        code = error.code()
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            raise DataError(
                f"the Ray cluster at {address!r} refused this machine ({error.details()}): "
                "give it the cluster's token (RAY_AUTH_TOKEN) or run prepare on its head"
            ) from None
        message = f"no Ray cluster answers at {address!r} ({_why(error)}): {START_ONE}"
        raise DataError(message) from None
    finally:
        channel.close()
    if reply.status.code != 0 or not reply.value:
        return None
    return dict(json.loads(reply.value))


def _why(error: Any) -> str:
    import grpc

    if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"nothing answered within {PROBE_SECONDS:.0f} s"
    if error.code() == grpc.StatusCode.UNIMPLEMENTED:
        return "a server answers there, but not Ray's"
    details = str(error.details() or error.code().name).splitlines()[0]
    return details.removeprefix("failed to connect to all addresses; last error: ")[:200]


def _check_versions(address: str, metadata: dict[str, Any]) -> None:
    """Ray's own check of the versions a cluster was started with against this process's."""
    from ray._private.utils import check_version_info, compute_version_info

    try:
        check_version_info(metadata, "this machine")
    except RuntimeError:
        ray_version, python = compute_version_info()[:2]
        raise DataError(
            f"the Ray cluster at {address!r} runs Ray {metadata.get('ray_version')} on Python "
            f"{metadata.get('python_version')}, this machine Ray {ray_version} on Python "
            f"{python}: run prepare where they match (on the cluster's head: make tpu-ssh)"
        ) from None


@contextmanager
def joined(address: str, runtime_env: dict[str, Any]) -> Iterator[Any]:
    """Ray, joined to the cluster at `address` for the block, with the driver's signal
    handlers as they were before (during the run too: SIGTERM stops `prepare` in order)."""
    ray = import_ray()
    saved = {sig: signal.getsignal(sig) for sig in KEPT_SIGNALS}
    try:
        try:
            ray.init(address=address, runtime_env=runtime_env, logging_level=logging.ERROR,
                     log_to_driver=False, configure_logging=False)  # fmt: skip
        except (ConnectionError, RuntimeError, ValueError) as error:
            message = f"cannot join the Ray cluster at {address!r}: {first_line(error)}"
            raise DataError(message) from None
        finally:
            _restore(saved)
        yield ray
    finally:
        ray.shutdown()
        _restore(saved)


def _restore(saved: dict[signal.Signals, Any]) -> None:
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            with contextlib.suppress(ValueError):  # not the main thread: Ray installed none
                signal.signal(sig, handler)
