// @kubernetes/client-node (Node 20) against a Kube32 cluster, driven by tests/e2e/test_clients.py.
// Usage: node clients.js page|checkpoint|informer NAME; KUBECONFIG names the cluster.
// Every result is one JSON line on stdout; a failure is {"ev":"fatal",...} and exit code 1.
'use strict';
const k8s = require('@kubernetes/client-node');

const kc = new k8s.KubeConfig();
kc.loadFromFile(process.env.KUBECONFIG);
const core = kc.makeApiClient(k8s.CoreV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const say = (obj) => console.log(JSON.stringify(obj));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const CK = {group: 'kube32.io', version: 'v1', namespace: 'default', plural: 'checkpoints'};

// Every ConfigMap in default, one per page, following the continue tokens.
async function page() {
  const names = [];
  let token;
  let pages = 0;
  do {
    const list = await core.listNamespacedConfigMap({namespace: 'default', limit: 1, _continue: token});
    names.push(...list.items.map((o) => o.metadata.name));
    token = list.metadata._continue;
    pages += 1;
  } while (token && pages < 100);
  say({ev: 'page', names, pages});
}

// A Save Checkpoint of pod NAME: create, wait for Saved, read its status subresource,
// label it with a merge patch, delete it.
async function checkpoint(pod) {
  const name = `${pod}-node-save`;
  await custom.createNamespacedCustomObject({...CK, body: {
    apiVersion: 'kube32.io/v1', kind: 'Checkpoint', metadata: {name}, spec: {podName: pod, action: 'Save'}}});
  let phase;
  for (let i = 0; i < 100 && phase !== 'Saved' && phase !== 'Failed'; i++) {
    await sleep(200);
    const status = await custom.getNamespacedCustomObjectStatus({...CK, name});
    phase = status.status && status.status.phase;
  }
  const patched = await custom.patchNamespacedCustomObject({...CK, name, body: {metadata: {labels: {'seen-by': 'client-node'}}}},
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch));
  const got = await custom.getNamespacedCustomObject({...CK, name});
  await custom.deleteNamespacedCustomObject({...CK, name});
  say({ev: 'checkpoint', phase, size: got.status.sizeBytes, label: patched.metadata.labels['seen-by']});
}

// An informer on default's pods until stdin closes: every add/update/delete and error.
async function informer() {
  const inf = k8s.makeInformer(kc, '/api/v1/namespaces/default/pods',
    () => core.listNamespacedPod({namespace: 'default'}));
  let stopping = false;
  for (const ev of ['add', 'update', 'delete']) {
    inf.on(ev, (o) => say({ev, name: o.metadata.name, uid: o.metadata.uid, node: o.spec.nodeName || null}));
  }
  inf.on('error', (e) => { if (!stopping) say({ev: 'error', err: String(e)}); });
  await inf.start();
  say({ev: 'started'});
  process.stdin.resume();
  process.stdin.on('end', async () => {
    stopping = true;
    say({ev: 'end', cache: inf.list().map((p) => [p.metadata.name, p.metadata.uid])});
    await inf.stop();
    process.exit(0);
  });
}

const [what, arg] = process.argv.slice(2);
const run = {page, checkpoint, informer}[what];
if (!run) { say({ev: 'fatal', err: `unknown command ${what}`}); process.exit(2); }
run(arg).catch((e) => { say({ev: 'fatal', err: String(e), code: e.code, body: e.body}); process.exit(1); });
