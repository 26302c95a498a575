#!/usr/bin/env python3
"""Writes the hand-made seed inputs into fuzz/corpus/<target>/ (run once; `cargo fuzz cmin` keeps
them small afterwards). Binary seeds (kubelet protobufs) are encoded here by hand.

  python3 fuzz/seeds/make_seeds.py [TARGET...]   only those targets' seeds (a new target's,
                                                 without re-adding seeds cmin dropped)"""
import hashlib, json, os, pathlib, re, sys

root = pathlib.Path(__file__).resolve().parents[2]
out = root / "fuzz" / "corpus"

def put(target, data):
    if len(sys.argv) > 1 and target not in sys.argv[1:]:
        return
    if isinstance(data, str):
        data = data.encode()
    d = out / target
    d.mkdir(parents=True, exist_ok=True)
    (d / ("seed-" + hashlib.sha1(data).hexdigest()[:16])).write_bytes(data)

def read(p):
    return (root / p).read_text()

# mig-parted configs, plain and ConfigMap.
for p in ["crates/decide/mig/tests/fixtures/device-filters.yaml",
          "crates/decide/mig/tests/fixtures/nvidia-mig-parted-v0.15.0-config-default.yaml",
          "crates/bin/gpuops/tests/fixtures/seed-mig-parted-config.yaml",
          "deploy/helm/gpuops/files/default-mig-config.yaml"]:
    put("mig_config", read(p))
    put("mig_configmap", read(p))
for p in ["crates/decide/mig/tests/fixtures/seed-mig-parted-configmap.yaml",
          "crates/decide/mig/tests/fixtures/nvidia-mig-manager-v0.15.0-example.yaml"]:
    put("mig_config", read(p))
small = "version: v1\nmig-configs:\n  all-disabled:\n    - devices: all\n      mig-enabled: false\n  custom:\n    - devices: [0, 1]\n      device-filter: [\"0x233010DE\"]\n      mig-enabled: true\n      mig-devices:\n        \"1g.10gb\": 7\n    - devices: [2]\n      mig-enabled: true\n      mig-devices: {\"3g.40gb\": 2}\n"
put("mig_config", small)
put("mig_configmap", small)
put("mig_config", "version: v1\nmig-configs:\n  bad:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"9g.1tb\": 1}\n")

# Hooks.
for h in ["version: v1\nhooks:\n  apply-start:\n    - command: /bin/echo\n      args: [start]\n      envs: {A: b}\n  apply-exit:\n    - command: /bin/true\n      workdir: /\n",
          "version: v1\nhooks:\n  pre-apply-mode:\n    - command: systemctl\n      args: [stop, nvidia-dcgm]\n  pre-apply-config:\n    - command: /usr/bin/true\n",
          "version: v2\n", "version: v1\nhooks:\n  apply-start:\n    - command: ' '\n"]:
    put("mig_hooks", h)

# Checkpoints.
for c in ['{"version":"v1","applying":"all-1g.10gb","gpus":[{"index":0,"uuid":"GPU-a","mig_enabled":true,"layout":{"instances":[{"profile":"3g.40gb","start":4}]}}]}',
          '{"version":"v1","applying":null,"gpus":[{"index":0,"uuid":"GPU-a","mig_enabled":false,"layout":{"instances":[]}},{"index":1,"uuid":"GPU-b","mig_enabled":true,"layout":{"instances":[{"profile":"1g.10gb","start":0},{"profile":"1g.10gb+me","start":1}]}}]}',
          '{"version":"v9","applying":null,"gpus":[]}']:
    put("mig_checkpoint", c)

# Device-plugin configs.
dp = read("crates/bin/gpuops/tests/fixtures/seed-nvidia-device-plugin.yaml")
put("plugin_config", dp)
for c in ["version: v1\nflags:\n  migStrategy: mixed\n  failOnInitError: false\n  plugin:\n    deviceListStrategy: [envvar, cdi-annotations]\n    deviceIDStrategy: index\n",
          "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    failRequestsGreaterThanOne: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
          "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
          "version: v1\nresources:\n  gpus:\n  - pattern: \"*H100*\"\n    name: h100\n",
          '{"version": "v1", "flags": {"migStrategy": "single"}}']:
    put("plugin_config", c)

# Fleets (the built-in ones and a few more).
fleet_src = read("crates/sim/sim/src/fleet.rs")
for m in re.finditer(r'\(\s*"[a-z0-9-]+",\s*"((?:[^"\\]|\\.)*)",\s*\)', fleet_src):
    put("fleet", m.group(1).encode().decode("unicode_escape"))
put("fleet", "hostname: mixed\ndriver-version: \"550.54.15\"\ncuda-version: \"12.4\"\nfabric: pairs\ngpus:\n  - model: A100-PCIE-40GB\n    count: 2\n  - model: L4\n    count: 1\n")

# kubelet messages: selector byte, then protobuf.
def varint(n):
    b = bytearray()
    while True:
        x = n & 0x7F
        n >>= 7
        if n:
            b.append(x | 0x80)
        else:
            b.append(x)
            return bytes(b)
def ld(field, payload):
    return varint(field << 3 | 2) + varint(len(payload)) + payload
def vi(field, n):
    return varint(field << 3) + varint(n & 0xFFFFFFFFFFFFFFFF)
uuid = lambda i: f"GPU-{i:08x}-0000-0000-0000-000000000000".encode()
for sel, ids in [(0, [uuid(0)]), (0, [uuid(1), uuid(2)]), (1, [uuid(0) + b"::1"]), (1, [uuid(3) + b"::0", uuid(3) + b"::2"]), (0, [b"GPU-nope"]), (0, [])]:
    put("kubelet", bytes([sel]) + ld(1, b"".join(ld(1, i) for i in ids)))
for sel, avail, must, size in [(2, range(8), [], 2), (2, range(8), [5], 4), (2, range(4), [], 4), (3, range(8), [], 3), (2, [0], [1], 1)]:
    if sel & 1:
        a = [uuid(i) + b"::" + str(r).encode() for i in avail for r in range(4)]
        m = [uuid(i) + b"::0" for i in must]
    else:
        a = [uuid(i) for i in avail]
        m = [uuid(i) for i in must]
    msg = b"".join(ld(1, x) for x in a) + b"".join(ld(2, x) for x in m) + vi(3, size)
    put("kubelet", bytes([sel]) + ld(1, msg))
put("kubelet", bytes([4]) + ld(1, b"pod-uid") + ld(2, uuid(0)))

# Extender bodies: selector byte (bit 0: prioritize, bit 1: not synced), then ExtenderArgs JSON.
pod = '{"metadata":{"name":"p","namespace":"default","annotations":{"gpuops.io/gpu-milli":"250"}},"spec":{"containers":[{"name":"c","resources":{"requests":{"nvidia.com/gpu.shared":"1"}}}]}}'
whole = '{"metadata":{"name":"w","namespace":"default"},"spec":{"containers":[{"name":"c","resources":{"requests":{"nvidia.com/gpu":"2","cpu":"1"}}}]}}'
for sel in [0, 1, 2, 3]:
    put("extender", bytes([sel]) + ('{"Pod":%s,"NodeNames":["node-a","node-b","node-c","node-x"]}' % pod).encode())
for sel in [0, 1]:
    put("extender", bytes([sel]) + ('{"Pod":%s,"NodeNames":["node-a","node-b"]}' % whole).encode())
    put("extender", bytes([sel]) + ('{"Pod":%s,"Nodes":{"metadata":{},"items":[{"metadata":{"name":"node-new","labels":{"nvidia.com/gpu.count":"8"}},"status":{"allocatable":{"nvidia.com/gpu":"8","cpu":"64"}}}]}}' % whole).encode())
    put("extender", bytes([sel]) + b'{"Pod": {"metadata": {"name": 3}}')

# Trace CSVs.
for t in ["sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,32000,1000,0,\n",
          "model,gpu,sn,memory_mib,cpu_milli\nV100M32,8,\"n,2\",524288,96000\r\n",
          "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,65,T4\n"]:
    put("trace_nodes", t)
H = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
for t in [H + "\np0,12000,16384,1,460,V100M16|V100M32,LS,Running,0,1,0\np1,6000,1,0,0,,BE,Running,0,1,0\n",
          "gpu_milli,num_gpu,name,memory_mib,cpu_milli\n1000,8,big,100,32000\n",
          H + "\np2,1000,1024,2,500,,LS,Pending,5,,\n"]:
    put("trace_pods", t)

# Prometheus text.
top = read("crates/decide/doctor/src/top.rs")
m = re.search(r'const FIXTURE: &str = r#"(.*?)"#;', top, re.S)
put("prometheus_text", m.group(1))
put("prometheus_text", '# HELP x y\n# TYPE x counter\nx_total{a="b\\"c\\\\d\\ne"} 1.5e3\nup 1\nnan_metric NaN\ninf{le="+Inf"} +Inf 1700000000000\n')

# Go durations.
for d in ["300ms", "1m30s", "1h2m3.5s", "2us", "2µs", "3ns", "0", "1.5h", "-1s", "9223372036s", "1e3s", ".5m", "10", "1h1h"]:
    put("go_duration", d)

# Autoscaler annotations: MachineDeployments as JSON, and annotation=value lines.
A = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-"
C = "capacity.cluster-autoscaler.kubernetes.io/"
def md(annotations, replicas=1, name="h100"):
    return json.dumps({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                       "metadata": {"namespace": "default", "name": name, "annotations": annotations},
                       "spec": {"replicas": replicas}}, indent=1)
base = {A + "min-size": "0", A + "max-size": "8", C + "cpu": "32", C + "memory": "256Gi"}
for extra in [{},
              {C + "gpu-type": "nvidia.com/gpu", C + "gpu-count": "8", "gpuops.io/price-per-hour": "98.32",
               "gpuops.io/gpu-product": "NVIDIA-H100-80GB-HBM3", C + "maxPods": "110",
               C + "labels": "pool=h100,zone=a", C + "taints": "nvidia.com/gpu=present:NoSchedule",
               "gpuops.io/provision-timeout": "20m", "cluster.x-k8s.io/autoscaling-options-maxnodeprovisiontime": "15m0s"},
              {C + "gpu-count": "8", "gpuops.io/gpu-product": "NVIDIA-H100-80GB-HBM3", "gpuops.io/mig-config": "all-1g.10gb"},
              {C + "gpu-count": "4", "gpuops.io/mig-devices": "1g.10gb=7,3g.40gb=2"},
              {C + "gpu-count": "2", "gpuops.io/gpu-replicas": "4", "gpuops.io/registration-timeout": "5m",
               "gpuops.io/devices-timeout": "90s", C + "ephemeral-disk": "100Gi"},
              {A + "min-size": "9"},
              {"gpuops.io/price-per-hour": "-1", C + "cpu": "500m"}]:
    put("autoscale_annotations", md({**base, **extra}))
put("autoscale_annotations", md({A + "max-size": "3"}, replicas=None, name="no-capacity"))
put("autoscale_annotations", "\n".join(f"{k}={v}" for k, v in {**base, C + "gpu-count": "1"}.items()) + "\n")
put("autoscale_annotations", A + "min-size=1\n" + A + "max-size=2\n" + C + "cpu=4\n" + C + "memory=1Ti\n" + C + "taints=a=b:Bogus\n")
put("autoscale_annotations", '{"metadata": {"annotations": {"' + A + 'min-size": 1}}, "spec": {"replicas": -1}}')
