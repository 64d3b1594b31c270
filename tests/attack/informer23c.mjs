// An @kubernetes/client-node informer on pods of one namespace; prints one JSON line per
// handler call (add/update/delete with uid and node) and, on stdin EOF, the final cache.
import { createRequire } from "module";
const require = createRequire(process.argv[2] + "/");
const k8s = require("@kubernetes/client-node");
const ns = process.argv[3];
const kc = new k8s.KubeConfig();
kc.loadFromFile(process.env.KUBECONFIG);
const api = kc.makeApiClient(k8s.CoreV1Api);
const inf = k8s.makeInformer(kc, `/api/v1/namespaces/${ns}/pods`, () => api.listNamespacedPod({ namespace: ns }));
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
for (const ev of ["add", "update", "delete"]) {
  inf.on(ev, (p) => out({ ev, uid: p.metadata.uid, node: p.spec.nodeName, rv: p.metadata.resourceVersion }));
}
inf.on("error", (e) => { out({ ev: "error", err: String(e) }); setTimeout(() => inf.start(), 500); });
inf.on("connect", () => out({ ev: "connect" }));
await inf.start();
out({ ev: "started" });
process.stdin.resume();
process.stdin.on("end", () => {
  out({ ev: "cache", uids: inf.list().map((p) => p.metadata.uid) });
  inf.stop();
  process.exit(0);
});
