// An @kubernetes/client-node informer on pods with one label, through a move: prints
// each handler call as JSON lines.  argv: kubeconfig, labelSelector, seconds
import { createRequire } from 'module';
const require = createRequire(process.env.NODECLIENT + '/package.json');
const k8s = require('@kubernetes/client-node');
const [kc_path, sel, secs] = process.argv.slice(2);
const kc = new k8s.KubeConfig(); kc.loadFromFile(kc_path);
const api = kc.makeApiClient(k8s.CoreV1Api);
const lister = () => api.listNamespacedPod({ namespace: 'default', labelSelector: sel });
const inf = k8s.makeInformer(kc, '/api/v1/namespaces/default/pods', lister, sel);
const out = (h, o) => console.log(JSON.stringify({ h, uid: o.metadata.uid, node: o.spec?.nodeName, rv: o.metadata.resourceVersion }));
inf.on('add', o => out('add', o)); inf.on('update', o => out('update', o)); inf.on('delete', o => out('delete', o));
inf.on('error', e => { console.log(JSON.stringify({ h: 'error', e: String(e) })); setTimeout(() => inf.start(), 500); });
inf.on('connect', () => console.log(JSON.stringify({ h: 'connect' })));
await inf.start();
setTimeout(() => { inf.stop(); process.exit(0); }, Number(secs) * 1000);
