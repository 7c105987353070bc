import json, os, subprocess
from kubernetes import client
from tests.integration.site_k8s import test_site_kubernetes as t
def flat(d, pre=""):
    out = {}
    if isinstance(d, dict):
        for k, v in d.items(): out.update(flat(v, f"{pre}.{k}"))
    elif isinstance(d, list):
        for i, v in enumerate(d): out.update(flat(v, f"{pre}[{i}]"))
    else: out[pre] = d
    return out
def snap(api):
    a = client.AdmissionregistrationV1Api(api)
    c = api.sanitize_for_serialization
    return {p.metadata.name + "/" + p.kind: c(p) for p in a.list_validating_admission_policy().items + a.list_validating_admission_policy_binding().items if "zjusct" in p.metadata.name}
def test_dbg(k8s_cluster, k8s_api):
    for i in range(4):
        s1 = snap(k8s_api)
        doc = t.run_site(k8s_cluster.kubeconfig)
        for p in doc["plays"]:
            for task in p["tasks"]:
                for h, r in task["hosts"].items():
                    if r.get("changed") and i > 0:
                        print("RUN", i, task["task"]["name"], list(r.keys()))
                        res = r.get("result")
                        items = res.get("results") if isinstance(res, dict) and "results" in res else (res if isinstance(res, list) else [r])
                        for x in items:
                            print(" ITEM", x.get("changed"), x.get("method"), x.get("warnings"))
                            obj = x.get("result") or {}
                            md = obj.get("metadata", {})
                            key = f"{md.get('name')}/{obj.get('kind')}"
                            a, b = flat({k: v for k, v in s1.get(key, {}).items()}), flat(obj)
                            print("  DIFF", key, json.dumps({z: (a.get(z), b.get(z)) for z in set(a) | set(b) if a.get(z) != b.get(z)})[:1500])
