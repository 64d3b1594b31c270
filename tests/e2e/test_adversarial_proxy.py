"""Adversarial: no proxy leaves the object its caller was authorised for (issue 19, item 1).

One ``kube32-sim up --workers 1`` cluster (nodes devkit and sim-1), with:

* the victim in namespace ``default``: pod ``sec`` (the counter: its state, its log
  line ``counter: init``, its K32S snapshot) behind a ClusterIP Service ``sec``;
* the caller's own pod ``mine`` in namespace ``other`` (echo: it answers with the
  path and query that reached it) behind a NodePort Service ``mine``;
* identities: the admin, a node (``system:node:sim-1``), the bootstrap token, no
  token, and ServiceAccounts (``kubectl create token``) with edit or view in their
  own namespace, in another one, or only elsewhere.

The table is every proxy route (pods, services, each also as ``name:port`` and
``http:name:port``, nodes, the NodePort, the kubelet itself) x traversal encodings
(literal, percent-encoded in either case, double and triple encoded, backslashes,
``;`` params, fullwidth dots) x identities x what the victim's kubelet serves
(snapshot, freeze, thaw, log, handler).  Each request must get the answer its
identity gets for any path on that route (400 where it may use the route, else
401/403) and none of the victim's bytes; at the end the victim has served the
admin's one request alone.  Requests go over raw HTTP (``http.client``: the
target goes exactly as written), kubectl and curl.
"""
from __future__ import annotations

import base64
import http.client
import json
import ssl
import subprocess
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlsplit

import pytest
import yaml

from tests.conftest import ROOT, ControlPlane, start_cluster, wait_for
from tests.e2e.helpers import get_json, kubelet_client_token, node_token, push

COUNTER = ROOT / "examples" / "pods" / "counter.wasm"
ECHO = ROOT / "examples" / "pods" / "echo.wasm"
NODE = "sim-1"
VICTIM = (b"K32S", b"counter:", b'"requests"')   # the snapshot, the log, the handler's state
REFUSED = "a proxied path may not leave the object it names"


class Wire:
    """HTTP/1.1 whose request target goes exactly as written (no client resolving dot
    segments or quoting again), over kept-alive connections."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.ctx = ctx
        self.conns: dict[str, http.client.HTTPConnection] = {}

    def send(self, method: str, url: str, token: str | None = None) -> tuple[int, bytes]:
        u = urlsplit(url)
        target = url[len(f"{u.scheme}://{u.netloc}"):]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        for attempt in range(2):
            conn = self._conn(u.scheme, u.netloc)
            try:
                conn.request(method, target, headers=headers)
                r = conn.getresponse()
                body = r.read()
            except (http.client.RemoteDisconnected, ConnectionError):
                self.conns.pop(u.netloc).close()
                if attempt:
                    raise
                continue
            if r.will_close:
                self.conns.pop(u.netloc).close()
            return r.status, body
        raise AssertionError("unreachable")

    def _conn(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        if netloc not in self.conns:
            self.conns[netloc] = (http.client.HTTPSConnection(netloc, timeout=60, context=self.ctx)
                                  if scheme == "https" else http.client.HTTPConnection(netloc, timeout=60))
        return self.conns[netloc]

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()


@dataclass
class Lab:
    cp: ControlPlane
    api: str
    kubelet: str       # sim-1's kubelet
    nodeport: str      # the NodePort of Service other/mine on sim-1
    tokens: dict[str, str | None]
    wire: Wire

    def kubectl(self, who: str, *args: str) -> subprocess.CompletedProcess:
        return self.cp.kubectl("--token", self.tokens[who] or "", *args, check=False)


# Who is who: (namespace of the ServiceAccount, its name) for the ServiceAccounts.
ACCOUNTS = {"editor": ("other", "editor"),              # edit in its own namespace, other
            "viewer": ("other", "viewer"),              # view in its own namespace
            "cross-editor": ("third", "cross-editor"),  # lives in third, edit in other
            "cross-viewer": ("third", "cross-viewer"),  # lives in third, view in other
            "stranger": ("third", "stranger")}          # edit in third only
BINDINGS = [("other", "edit", "editor"), ("other", "view", "viewer"), ("other", "edit", "cross-editor"),
            ("other", "view", "cross-viewer"), ("third", "edit", "stranger")]
API_IDENTITIES = ("admin", "node", "bootstrap", "anonymous", *ACCOUNTS)


def _objects(counter: str, echo: str) -> list[dict]:
    def pod(ns: str, name: str, image: str) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
                "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": image}]}}

    def service(ns: str, name: str, kind: str) -> dict:
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
                "spec": {"type": kind, "selector": {"app": name}, "ports": [{"port": 80}]}}
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in ("other", "third")]
    docs += [pod("default", "sec", counter), service("default", "sec", "ClusterIP"),
             pod("other", "mine", echo), service("other", "mine", "NodePort")]
    docs += [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": n, "namespace": ns}}
             for ns, n in ACCOUNTS.values()]
    for ns, role, who in BINDINGS:
        sa_ns, sa = ACCOUNTS[who]
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": f"{who}-{role}", "namespace": ns},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                     "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}]})
    return docs


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    cp = start_cluster(tmp_path_factory.mktemp("adversarial-proxy"), 1, "--backoff", "1")
    try:
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(_objects(push(cp, COUNTER), push(cp, ECHO))))
        kubeconfig = yaml.safe_load(cp.kubeconfig.read_text())
        ctx = ssl.create_default_context(cadata=base64.b64decode(
            kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]).decode())
        # The API server's CA (the kubeconfig's) and, for kubelets, the kubelet-serving signer.
        ctx.load_verify_locations(cafile=str(cp.data_dir / "pki" / "kubelet-ca.crt"))
        users = {u["username"]: t for t, u in json.loads((cp.data_dir / "tokens.json").read_text()).items()}
        node_kubeconfig = yaml.safe_load((cp.data_dir / "node.kubeconfig").read_text())
        tokens: dict[str, str | None] = {
            "admin": users["kubernetes-admin"], "node": node_token(cp, NODE),
            "bootstrap": node_kubeconfig["users"][0]["user"]["token"], "anonymous": None,
            "kubelet-client": kubelet_client_token(cp, NODE)}
        for who, (ns, sa) in ACCOUNTS.items():
            tokens[who] = cp.kubectl("create", "token", sa, "-n", ns, "--duration", "1h").stdout.strip()
        for ns, name in (("default", "sec"), ("other", "mine")):
            wait_for(lambda: ((get_json(cp, "pod", name, "-n", ns).get("status") or {}).get("containerStatuses")
                              or [{}])[0].get("ready"), 60, what=f"pod {ns}/{name} ready")
        node = get_json(cp, "node", NODE)
        ip = node["status"]["addresses"][0]["address"]
        scheme = node["metadata"]["annotations"]["kube32.io/kubelet-scheme"]
        port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        node_port = get_json(cp, "service", "mine", "-n", "other")["spec"]["ports"][0]["nodePort"]
        lab = Lab(cp, kubeconfig["clusters"][0]["cluster"]["server"], f"{scheme}://{ip}:{port}",
                  f"http://{ip}:{node_port}", tokens, Wire(ctx))
        wait_for(lambda: lab.wire.send("GET", f"{lab.nodeport}/")[0] == 200, 30, what="the NodePort listening")
        yield lab
        lab.wire.close()
    finally:
        cp.proc.stop(timeout=30)


# --- the table ------------------------------------------------------------------------
@dataclass(frozen=True)
class Encoding:
    name: str
    up: str      # one step up, separator included
    sep: str     # the separator between the target's segments

    def path(self, depth: int, target: str) -> str:
        return self.up * depth + self.sep.join(target.split("/"))


ENCODINGS = [
    Encoding("literal", "../", "/"),
    Encoding("slash-encoded", "..%2f", "%2f"),
    Encoding("slash-encoded-upper", "..%2F", "%2F"),
    Encoding("dots-encoded", "%2e%2e/", "/"),
    Encoding("dots-encoded-upper", "%2E%2E/", "/"),
    Encoding("all-encoded-mixed-case", "%2e%2E%2f", "%2F"),
    Encoding("one-dot-encoded", ".%2e/", "/"),
    Encoding("double-encoded", "%252e%252e%252f", "%252f"),
    Encoding("double-encoded-slash", "..%252f", "%252f"),
    Encoding("double-encoded-upper", "%252E%252E%252F", "%252F"),
    Encoding("triple-encoded", "%25252e%25252e%25252f", "%25252f"),
    Encoding("backslash", "..\\", "\\"),
    Encoding("backslash-encoded", "..%5c", "%5c"),
    Encoding("backslash-double-encoded", "%252e%252e%255c", "%255c"),
    Encoding("semicolon", "..;/", "/"),
    Encoding("semicolon-param", "..;x=1/", "/"),
    Encoding("semicolon-encoded", "..%3b/", "/"),
    Encoding("fullwidth-dots", "%ef%bc%8e%ef%bc%8e/", "/"),
    Encoding("dot-then-dotdot", "./../", "/"),
]

# What the victim's kubelet serves (method, path from the kubelet's root, query).
KUBELET_TARGETS = [("POST", "checkpoint/default/sec/main", "leave=running"),
                   ("POST", "checkpoint/default/sec/main", "leave=frozen"),
                   ("POST", "thaw/default/sec/main", ""),
                   ("GET", "containerLogs/default/sec/main", ""),
                   ("GET", "pods/default/sec/http/", "")]
# What the API serves a node's credentials (from /api/v1/), for the NodePort's hop.
API_TARGETS = [("GET", "namespaces/default/services/sec/proxy/", ""),
               ("GET", "namespaces/default/pods/sec/proxy/", ""),
               ("GET", "nodes", "")]


@dataclass(frozen=True)
class Route:
    name: str
    prefix: str            # up to the suffix, from the lab's address (``{api}``, ...)
    allowed: tuple[str, ...]
    depth: int = 4         # steps up from the suffix to the kubelet's root
    identities: tuple[str, ...] = API_IDENTITIES
    api_depth: int = 0     # steps up from the suffix to /api/v1/ (a hop through the API)

    def url(self, lab: Lab) -> str:
        return self.prefix.format(api=lab.api, kubelet=lab.kubelet, nodeport=lab.nodeport)

    def expect(self, who: str) -> int:
        return 400 if who in self.allowed else 401 if who == "anonymous" else 403

    def targets(self) -> list[tuple[str, int, str, str]]:
        out = [(m, self.depth, t, q) for m, t, q in KUBELET_TARGETS]
        return out + [(m, self.api_depth, t, q) for m, t, q in API_TARGETS] if self.api_depth else out


POD_USERS = ("admin", "editor", "cross-editor")
OTHER = "{api}/api/v1/namespaces/other"
ROUTES = [
    Route("pods", OTHER + "/pods/mine/proxy/", POD_USERS),
    Route("pods-name-port", OTHER + "/pods/mine:80/proxy/", POD_USERS),
    Route("pods-scheme-name-port", OTHER + "/pods/http:mine:80/proxy/", POD_USERS),
    Route("services", OTHER + "/services/mine/proxy/", POD_USERS + ("node",)),
    Route("services-name-port", OTHER + "/services/mine:80/proxy/", POD_USERS + ("node",)),
    Route("services-scheme-name-port", OTHER + "/services/http:mine:80/proxy/", POD_USERS + ("node",)),
    # The node proxy reaches the kubelet's root already; a dot segment is refused all the same.
    Route("nodes", "{api}/api/v1/nodes/" + NODE + "/proxy/", ("admin",), depth=1),
    Route("nodeport", "{nodeport}/", ("anonymous",), identities=("anonymous",), api_depth=5),
    Route("kubelet", "{kubelet}/pods/other/mine/http/", ("kubelet-client",), identities=("kubelet-client",)),
]


def _leaks(body: bytes) -> bool:
    return any(mark in body for mark in VICTIM)


def _refused_clearly(status: int, body: bytes) -> bool:
    """A 400 that says why (a Status from the API server, text from a node)."""
    text = body.decode(errors="replace")
    if status != 400:
        return True
    try:
        doc = json.loads(text)
    except ValueError:
        return REFUSED in text
    return doc.get("reason") == "BadRequest" and REFUSED in doc.get("message", "")


@pytest.mark.parametrize("encoding", ENCODINGS, ids=lambda e: e.name)
@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_no_proxy_leaves_the_object_it_names(lab: Lab, route: Route, encoding: Encoding) -> None:
    failures = []
    for who in route.identities:
        for method, depth, target, query in route.targets():
            url = route.url(lab) + encoding.path(depth, target) + (f"?{query}" if query else "")
            status, body = lab.wire.send(method, url, lab.tokens[who])
            if status != route.expect(who) or _leaks(body) or not _refused_clearly(status, body):
                failures.append(f"{who}: {method} {url} -> {status} {body[:160]!r}")
    assert not failures, f"{len(failures)} requests not refused:\n" + "\n".join(failures)


# --- who may use each route, on a path that stays inside ---------------------------------
@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_who_may_use_each_proxy(lab: Lab, route: Route) -> None:
    suffix = "pods/other/mine/http/hello/there" if route.name == "nodes" else "hello/there"
    others = ("admin", "node", "editor", "anonymous") if route.name == "kubelet" else ()
    failures = []
    for who in route.identities + others:
        status, body = lab.wire.send("GET", route.url(lab) + suffix + "?x=1", lab.tokens[who])
        want = 200 if who in route.allowed else 401 if who == "anonymous" else 403
        if status != want or (want == 200 and b"path: /hello/there\nquery: x=1\n" not in body):
            failures.append(f"{who}: {status} {body[:160]!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("route", [r for r in ROUTES if r.name in ("pods", "services-name-port", "nodeport")],
                         ids=lambda r: r.name)
def test_a_pods_own_paths_and_queries_reach_it_unchanged(lab: Lab, route: Route) -> None:
    who = route.allowed[-1]
    status, body = lab.wire.send("GET", route.url(lab) + "a%20b/c%25d;e=f/x:y@z/...?q=%26x&r=%23&s=%2F",
                                 lab.tokens[who])
    assert status == 200, body
    assert b"path: /a b/c%d;e=f/x:y@z/...\nquery: q=%26x&r=%23&s=%2F\n" in body, body


def test_the_reported_exploit_is_refused_with_kubectl_and_curl(lab: Lab) -> None:
    """The issue's request, as kubectl and curl send it, for each thing it reached."""
    pod = "/api/v1/namespaces/other/pods/mine/proxy/"
    up = "..%2f" * 4
    snapshot = f"{pod}{up}checkpoint%2fdefault%2fsec%2fmain?leave=running"
    out = lab.kubectl("editor", "create", "--raw", snapshot, "-f", "/dev/null")
    assert out.returncode != 0 and b"K32S" not in out.stdout.encode(errors="replace")
    assert out.stderr.strip() == (
        'Error from server (BadRequest): the path segment ".." is a dot segment (".."): ' + REFUSED), out.stderr
    for path in (f"{pod}{up}containerLogs%2fdefault%2fsec%2fmain", f"{pod}{up}pods%2fdefault%2fsec%2fhttp%2f",
                 f"{pod}../../../../pods/default/sec/http/"):
        out = lab.kubectl("editor", "get", "--raw", path)
        assert out.returncode != 0 and "Error from server (BadRequest)" in out.stderr and not _leaks(
            out.stdout.encode()), (path, out.stdout, out.stderr)
    curl = subprocess.run(["curl", "-sS", "--path-as-is", "--cacert", str(lab.cp.data_dir / "pki" / "ca.crt"),
                           "-X", "POST", "-H", f"Authorization: Bearer {lab.tokens['editor']}",
                           "-w", "\n%{http_code}", lab.api + snapshot], capture_output=True, timeout=60)
    assert curl.stdout.endswith(b"\n400") and not _leaks(curl.stdout), curl
    # Anyone on the network, through the NodePort (the node's own credentials on the next hop).
    for path in ("%252e%252e%252f" * 4 + "checkpoint%252fdefault%252fsec%252fmain?leave=running",
                 "../" * 5 + "namespaces/default/services/sec/proxy/"):
        curl = subprocess.run(["curl", "-sS", "--path-as-is", "-X", "POST", "-w", "\n%{http_code}",
                               f"{lab.nodeport}/{path}"], capture_output=True, timeout=60)
        assert curl.stdout.endswith(b"\n400") and REFUSED.encode() in curl.stdout and not _leaks(curl.stdout), curl


def test_a_nodeport_caller_asks_nothing_of_the_nodes_credentials(lab: Lab) -> None:
    """Impersonate-* from the network is dropped: the node's credentials carry the request."""
    curl = subprocess.run(["curl", "-sS", "-H", "Impersonate-User: kubernetes-admin", "-H", "Impersonate-Group: "
                           "system:masters", "-w", "\n%{http_code}", f"{lab.nodeport}/hi"], capture_output=True,
                          timeout=60)
    assert curl.stdout.endswith(b"\n200") and b"path: /hi\n" in curl.stdout and b"Impersonate" not in curl.stdout, curl


def test_a_proxied_name_holds_at_most_a_scheme_and_a_port(lab: Lab) -> None:
    for path, message in (("pods/a:b:c:d/proxy/", 'invalid pod request "a:b:c:d"'),
                          ("services/ftp:mine:80/proxy/", 'invalid service request "ftp:mine:80"'),
                          ("pods/:80/proxy/", 'invalid pod request ":80"')):
        out = lab.kubectl("admin", "get", "--raw", f"/api/v1/namespaces/other/{path}")
        assert out.returncode != 0 and out.stderr.strip() == f"Error from server (BadRequest): {message}", out.stderr


def test_a_node_proxies_only_to_the_services_its_node_ports_serve(lab: Lab) -> None:
    status, body = lab.wire.send("GET", f"{lab.api}/api/v1/namespaces/default/services/sec/proxy/",
                                 lab.tokens["node"])
    assert status == 403 and not _leaks(body)
    assert json.loads(body)["message"] == (
        f'services "sec" is forbidden: User "system:node:{NODE}" cannot get resource "services/proxy" in API '
        f'group "" in the namespace "default": node \'{NODE}\' may only proxy to NodePort and LoadBalancer Services')
    status, body = lab.wire.send("GET", f"{lab.api}/api/v1/namespaces/other/services/mine:80/proxy/hi",
                                 lab.tokens["node"])
    assert status == 200 and b"path: /hi\n" in body


def test_the_kubelet_refuses_a_name_holding_a_slash(lab: Lab) -> None:
    for path in ("/containerLogs/default%2fsec/x/main", "/checkpoint/other/mine%2Fx/main",
                 "/pods/default%2Fsec/x/http/"):
        status, body = lab.wire.send("POST" if "checkpoint" in path else "GET", lab.kubelet + path,
                                     lab.tokens["kubelet-client"])
        assert status == 400 and b'holds a "/"' in body and not _leaks(body), (path, status, body)


def test_the_victim_served_the_admin_alone(lab: Lab) -> None:
    """Last: after everything above, the victim answered one request (this one), was never
    frozen or restored, and logged only its start."""
    out = lab.kubectl("admin", "get", "--raw", "/api/v1/namespaces/default/pods/sec/proxy/")
    state = json.loads(out.stdout)
    assert (state["requests"], state["init_calls"], state["restored_calls"]) == (1, 1, 0), state
    assert lab.kubectl("admin", "logs", "sec").stdout.strip() == "counter: init"
    pod = get_json(lab.cp, "pod", "sec")
    assert pod["status"]["containerStatuses"][0]["ready"] and pod["status"]["containerStatuses"][0]["restartCount"] == 0
