"""A stand-in for the Cloud TPU API (v2) and the bits of Compute Engine the gcloud CLI
asks for around it, served over HTTP on 127.0.0.1 for the real `gcloud`.

Point gcloud at it with `gcloud_environment()`. It keeps nodes, queued resources,
long-running operations (finished at once) and guest attributes, and records every
request (method, path, query, JSON body) so tests can assert what gcloud sent. The
workers of a node are given addresses (127.0.0.2, ...): `hosts_per_node` of them, the
first ones for a node of its own, the next ones for each further slice of a multislice
queued resource (`multisliceParams`: nodes PREFIX-0 ... PREFIX-(N-1)). The stand-in plays
the parts of Google Cloud that touch them:
- the guest agent: ssh keys put in the node's metadata (`ssh-keys`, as gcloud does
  before connecting) are written to `authorized_keys`, and each worker's sshd host key
  is published as the guest attribute `hostkeys/ssh-ed25519`;
- boot: a new node's `startup-script` metadata runs on every worker (`boot`);
- the metadata server's guest attributes, under `/metadata/NODE/WORKER/...` for the
  worker that writes them (`metadata_url`).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

LOCATION = r"/v2/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
QUEUED_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
TPU_PORT = 8470

# boot(worker, script, env): run a node's startup script on one worker.
Boot = Callable[[int, str, Mapping[str, str]], None]


@dataclass(frozen=True)
class Request:
    """One request as gcloud sent it."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: Any

    def line(self) -> str:
        query = "&".join(f"{k}={v}" for k, values in sorted(self.query.items()) for v in values)
        return f"{self.method} {self.path}{'?' + query if query else ''}"


class ApiError(Exception):
    """An error answered in the Google API format."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class StandIn:
    """The TPU API's state and what it was asked."""

    workers: Sequence[str]
    host_keys: Sequence[str]
    authorized_keys: Path
    boot: Boot | None = None
    hosts_per_node: int = 0  # 0: every worker belongs to each node
    requests: list[Request] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    queued_resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    guest_attributes: dict[tuple[str, int], dict[tuple[str, str], str]] = field(
        default_factory=dict
    )
    boots: list[threading.Thread] = field(default_factory=list)
    url: str = ""
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> StandIn:
        """Serve on a free port of 127.0.0.1 in a background thread."""
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                standin._handle(self)

            do_POST = do_PATCH = do_DELETE = do_PUT = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the requests are recorded, not logged

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def wait_for_boots(self, timeout: float = 300) -> None:
        """Wait until every startup script that was started has finished."""
        for thread in list(self.boots):
            thread.join(timeout)

    def gcloud_environment(self, config_dir: Path, project: str) -> dict[str, str]:
        """Settings that send the gcloud CLI here instead of to Google Cloud."""
        token = config_dir / "access-token"
        token.write_text("stand-in-token\n", encoding="utf-8")
        return {
            "CLOUDSDK_CONFIG": str(config_dir),
            "CLOUDSDK_CORE_PROJECT": project,
            "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token),
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": self.url,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{self.url}compute/v1/",
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "1",
            "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
        }

    def metadata_url(self, node: str, worker: int) -> str:
        """The metadata server as worker `worker` of `node` sees it."""
        return f"{self.url}metadata/{node}/{worker}/computeMetadata/v1"

    # -- what tests read -------------------------------------------------------------

    def calls(self, method: str | None = None, pattern: str = "") -> list[Request]:
        """The recorded requests with this method whose path matches the pattern."""
        return [
            r
            for r in self.requests
            if (method is None or r.method == method) and re.search(pattern, r.path)
        ]

    # -- HTTP ------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = raw.decode("utf-8", "replace")
        request = Request(handler.command, parts.path, parse_qs(parts.query), body)
        with self._lock:
            self.requests.append(request)
            try:
                status, answer = HTTPStatus.OK, self._route(request)
            except ApiError as error:
                status = error.status
                answer = {
                    "error": {"code": status.value, "message": str(error), "status": status.name}
                }
        data = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _route(self, request: Request) -> Any:
        routes: list[tuple[str, str, Callable[..., Any]]] = [
            ("POST", rf"{LOCATION}/nodes", self._create_node),
            ("GET", rf"{LOCATION}/nodes/(?P<name>[^/:]+)", self._get_node),
            ("PATCH", rf"{LOCATION}/nodes/(?P<name>[^/:]+)", self._patch_node),
            ("DELETE", rf"{LOCATION}/nodes/(?P<name>[^/:]+)", self._delete_node),
            ("POST", rf"{LOCATION}/nodes/(?P<name>[^/:]+):getGuestAttributes", self._guest),
            ("GET", rf"{LOCATION}/operations/(?P<op>[^/]+)", self._get_operation),
            ("POST", rf"{LOCATION}/queuedResources", self._create_queued),
            ("GET", rf"{LOCATION}/queuedResources/(?P<name>[^/]+)", self._get_queued),
            ("DELETE", rf"{LOCATION}/queuedResources/(?P<name>[^/]+)", self._delete_queued),
            ("GET", r"/compute/v1/projects/(?P<project>[^/]+)", self._get_project),
            (
                "PUT",
                r"/metadata/(?P<name>[^/]+)/(?P<worker>\d+)/computeMetadata/v1/instance/"
                r"guest-attributes/(?P<namespace>[^/]+)/(?P<key>[^/]+)",
                self._put_guest_attribute,
            ),
        ]
        for method, pattern, action in routes:
            match = re.fullmatch(pattern, request.path)
            if match and method == request.method:
                return action(request, **match.groupdict())
        raise ApiError(HTTPStatus.NOT_FOUND, f"{request.method} {request.path} is not served")

    # -- nodes -----------------------------------------------------------------------

    def _node_name(self, project: str, zone: str, name: str) -> str:
        return f"projects/{project}/locations/{zone}/nodes/{name}"

    def _operation(self, project: str, zone: str, response: dict[str, Any], kind: str) -> Any:
        name = f"projects/{project}/locations/{zone}/operations/operation-{next(self._ids)}"
        operation = {"name": name, "done": True, "response": {"@type": kind, **response}}
        self.operations[name] = operation
        return operation

    def _new_node(
        self, project: str, zone: str, name: str, spec: Mapping[str, Any], slot: int = 0
    ) -> Any:
        """A node on the workers of slot `slot` (the slot-th run of hosts_per_node workers)."""
        full = self._node_name(project, zone, name)
        if full in self.nodes:
            raise ApiError(HTTPStatus.CONFLICT, f"node {full} already exists")
        per_node = self.hosts_per_node or len(self.workers)
        first = slot * per_node
        if first + per_node > len(self.workers):
            raise ApiError(HTTPStatus.TOO_MANY_REQUESTS, f"no workers left for node {name}")
        addresses = self.workers[first : first + per_node]
        node = {
            **spec,
            "name": full,
            "id": str(1000 + next(self._ids)),
            "state": "READY",
            "health": "HEALTHY",
            "apiVersion": "V2",
            "networkEndpoints": [{"ipAddress": ip, "port": TPU_PORT} for ip in addresses],
        }
        self.nodes[full] = node
        for worker, host_key in enumerate(self.host_keys[first : first + per_node]):
            self.guest_attributes[(name, worker)] = {("hostkeys", "ssh-ed25519"): host_key}
        self._grant_ssh_keys(node)
        script = node.get("metadata", {}).get("startup-script")
        if script and self.boot is not None:
            for worker in range(per_node):
                env = {"METADATA_URL": self.metadata_url(name, worker)}
                thread = threading.Thread(target=self.boot, args=(first + worker, script, env))
                thread.start()
                self.boots.append(thread)
        return node

    def _create_node(self, request: Request, project: str, zone: str) -> Any:
        name = request.query.get("nodeId", [""])[0]
        if not name:
            raise ApiError(HTTPStatus.BAD_REQUEST, "nodeId is required")
        node = self._new_node(project, zone, name, request.body or {})
        return self._operation(project, zone, node, NODE_TYPE)

    def _get_node(self, request: Request, project: str, zone: str, name: str) -> Any:
        full = self._node_name(project, zone, name)
        if full not in self.nodes:
            raise ApiError(HTTPStatus.NOT_FOUND, f"Resource '{full}' was not found")
        return self.nodes[full]

    def _patch_node(self, request: Request, project: str, zone: str, name: str) -> Any:
        node = self._get_node(request, project, zone, name)
        for field_name in request.query.get("updateMask", [""])[0].split(","):
            if field_name and field_name in (request.body or {}):
                node[field_name] = request.body[field_name]
        self._grant_ssh_keys(node)
        return self._operation(project, zone, node, NODE_TYPE)

    def _delete_node(self, request: Request, project: str, zone: str, name: str) -> Any:
        node = self._get_node(request, project, zone, name)
        del self.nodes[node["name"]]
        return self._operation(project, zone, {}, "type.googleapis.com/google.protobuf.Empty")

    def _grant_ssh_keys(self, node: Mapping[str, Any]) -> None:
        """What the guest agent does: `user:key` lines of ssh-keys become authorized keys."""
        entries = node.get("metadata", {}).get("ssh-keys", "")
        keys = [line.split(":", 1)[1] for line in entries.splitlines() if ":" in line]
        if keys:
            self.authorized_keys.write_text("\n".join(keys) + "\n", encoding="utf-8")

    def _guest(self, request: Request, project: str, zone: str, name: str) -> Any:
        query_path = (request.body or {}).get("queryPath", "")
        wanted = [w for w in (request.body or {}).get("workerIds", []) if w != ""]
        node = self._get_node(request, project, zone, name)
        workers = [int(w) for w in wanted] or range(len(node["networkEndpoints"]))
        answer = []
        for worker in workers:
            items = [
                {"namespace": namespace, "key": key, "value": value}
                for (namespace, key), value in sorted(self.guest_attributes[(name, worker)].items())
                if f"{namespace}/{key}".startswith(query_path)
            ]
            answer.append({"queryPath": query_path, "queryValue": {"items": items}})
        return {"guestAttributes": answer}

    def _put_guest_attribute(
        self, request: Request, name: str, worker: str, namespace: str, key: str
    ) -> Any:
        value = request.body if isinstance(request.body, str) else json.dumps(request.body)
        self.guest_attributes.setdefault((name, int(worker)), {})[(namespace, key)] = value
        return {}

    def _get_operation(self, request: Request, project: str, zone: str, op: str) -> Any:
        name = f"projects/{project}/locations/{zone}/operations/{op}"
        if name not in self.operations:
            raise ApiError(HTTPStatus.NOT_FOUND, f"operation {name} was not found")
        return self.operations[name]

    # -- queued resources --------------------------------------------------------------

    @staticmethod
    def _spec_nodes(name: str, body: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
        """The nodes a queued resource asks for: a nodeId each, or a multislice's N nodes."""
        nodes = []
        for spec in body.get("tpu", {}).get("nodeSpec", []):
            if "nodeId" in spec:
                nodes.append((spec["nodeId"], spec.get("node", {})))
                continue
            params = spec.get("multisliceParams", {})
            count, prefix = int(params.get("nodeCount", 0)), params.get("nodeIdPrefix") or name
            if count < 2:
                raise ApiError(HTTPStatus.BAD_REQUEST, "nodeId or nodeCount > 1 is required")
            nodes += [(f"{prefix}-{index}", spec.get("node", {})) for index in range(count)]
        return nodes

    def _create_queued(self, request: Request, project: str, zone: str) -> Any:
        name = request.query.get("queuedResourceId", [""])[0]
        full = f"projects/{project}/locations/{zone}/queuedResources/{name}"
        body = request.body or {}
        for slot, (node_id, node) in enumerate(self._spec_nodes(name, body)):
            self._new_node(project, zone, node_id, node, slot)
        resource = {**body, "name": full, "state": {"state": "ACTIVE"}}
        self.queued_resources[full] = resource
        return self._operation(project, zone, resource, QUEUED_TYPE)

    def _get_queued(self, request: Request, project: str, zone: str, name: str) -> Any:
        full = f"projects/{project}/locations/{zone}/queuedResources/{name}"
        if full not in self.queued_resources:
            raise ApiError(HTTPStatus.NOT_FOUND, f"Resource '{full}' was not found")
        return self.queued_resources[full]

    def _delete_queued(self, request: Request, project: str, zone: str, name: str) -> Any:
        resource = self._get_queued(request, project, zone, name)
        nodes = [self._node_name(project, zone, n) for n, _ in self._spec_nodes(name, resource)]
        if request.query.get("force", ["false"])[0].lower() == "true":
            for node in nodes:
                self.nodes.pop(node, None)
        elif any(node in self.nodes for node in nodes):
            raise ApiError(
                HTTPStatus.BAD_REQUEST, "the queued resource has nodes: delete with force"
            )
        del self.queued_resources[resource["name"]]
        return self._operation(project, zone, {}, "type.googleapis.com/google.protobuf.Empty")

    # -- Compute Engine ------------------------------------------------------------------

    def _get_project(self, request: Request, project: str) -> Any:
        return {"name": project, "id": "4242", "commonInstanceMetadata": {"items": []}}
