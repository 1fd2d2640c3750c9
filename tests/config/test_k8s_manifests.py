"""configs/k8s/: every manifest validates against the Kubernetes schemas, offline, and the
container command of every jaxserve pod runs through `jaxserve serve`'s own argument parsing and
configuration, so a renamed flag or config key breaks the build.

Schemas: the built-in kinds against the Kubernetes 1.30 OpenAPI schemas that kubernetes-validate
ships (strict: an unknown field is an error). The LeaderWorkerSet (a CRD) against LWS_SCHEMA,
written from the published leaderworkerset.x-k8s.io/v1 API (lws.sigs.k8s.io, "LeaderWorkerSet
API"): spec.replicas, spec.leaderWorkerTemplate (size, leaderTemplate, workerTemplate,
restartPolicy, subGroupPolicy, volumeClaimTemplates, persistentVolumeClaimRetentionPolicy),
spec.rolloutStrategy (type, rollingUpdateConfiguration: partition, maxUnavailable, maxSurge),
spec.startupPolicy, spec.networkConfig.subdomainPolicy and spec.groupIdentity, with their enums;
nothing else is allowed. Its metadata and both pod templates are then checked against the
Kubernetes schemas (ObjectMeta; PodTemplateSpec, as a PodTemplate's template).

The commands: `$(VAR)` references in args are expanded as the kubelet does, from the container's
env and, in a LeaderWorkerSet, the variables LWS injects (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE,
LWS_WORKER_INDEX); the ConfigMap the pod mounts is written where --config points; then
jaxserve's parser and `serve_engine_config` build the EngineConfig the pod would run, and the
manifest is checked against it (port, probe, accelerators, process ids, caches on the volume,
the drain's grace period).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from jaxserve.cli import build_parser
from jaxserve.config import EngineConfig
from jaxserve.config.serve_flags import serve_engine_config
from jaxserve.server.drain import UVICORN_GRACE_S

K8S = Path(__file__).resolve().parents[2] / "configs" / "k8s"
KUBERNETES_VERSION = "1.30"
LWS_API = "leaderworkerset.x-k8s.io/v1"
PRESTOP_WAIT_S = 5  # the serving pods' preStop sleeps this long before SIGTERM
_INT_OR_STRING = {"type": ["integer", "string"]}
_OBJECT = {"type": "object"}
LWS_SCHEMA = {
  "type": "object",
  "required": ["apiVersion", "kind", "metadata", "spec"],
  "additionalProperties": False,
  "properties": {
    "apiVersion": {"const": LWS_API},
    "kind": {"const": "LeaderWorkerSet"},
    "metadata": _OBJECT,
    "spec": {
      "type": "object",
      "required": ["leaderWorkerTemplate"],
      "additionalProperties": False,
      "properties": {
        "replicas": {"type": "integer", "minimum": 0},
        "leaderWorkerTemplate": {
          "type": "object",
          "required": ["workerTemplate"],
          "additionalProperties": False,
          "properties": {
            "leaderTemplate": _OBJECT,
            "workerTemplate": _OBJECT,
            "size": {"type": "integer", "minimum": 1},
            "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "None", "Default"]},
            "subGroupPolicy": {
              "type": "object",
              "required": ["subGroupSize"],
              "additionalProperties": False,
              "properties": {
                "subGroupPolicyType": {"type": "string"},
                "subGroupSize": {"type": "integer", "minimum": 1},
              },
            },
            "volumeClaimTemplates": {"type": "array"},
            "persistentVolumeClaimRetentionPolicy": _OBJECT,
          },
        },
        "rolloutStrategy": {
          "type": "object",
          "required": ["type"],
          "additionalProperties": False,
          "properties": {
            "type": {"enum": ["RollingUpdate"]},
            "rollingUpdateConfiguration": {
              "type": "object",
              "additionalProperties": False,
              "properties": {
                "partition": {"type": "integer", "minimum": 0},
                "maxUnavailable": _INT_OR_STRING,
                "maxSurge": _INT_OR_STRING,
              },
            },
          },
        },
        "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
        "networkConfig": {
          "type": "object",
          "required": ["subdomainPolicy"],
          "additionalProperties": False,
          "properties": {"subdomainPolicy": {"enum": ["Shared", "UniquePerReplica"]}},
        },
        "groupIdentity": {"enum": ["Ordinal", "Hash"]},
      },
    },
  },
}


def _documents() -> list[dict]:
  docs = []
  for path in sorted(K8S.glob("*.yaml")):
    docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
  return docs


DOCS = _documents()
_NAMES = [f"{d['kind']}/{d['metadata']['name']}" for d in DOCS]


def validate(doc: dict) -> None:
  """Raises if the document does not validate (jsonschema's or kubernetes-validate's error)."""
  if doc.get("apiVersion") == LWS_API:
    jsonschema.validate(doc, LWS_SCHEMA)
    _k8s({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]})
    templates = doc["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
      if role in templates:
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role.lower()}}
        _k8s({**pod, "template": templates[role]})
    return
  _k8s(doc)


def _k8s(doc: dict) -> None:
  kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("doc", DOCS, ids=_NAMES)
def test_every_manifest_validates(doc):
  validate(doc)


def test_the_manifests_are_shipped():
  assert sorted(_NAMES) == sorted(
    [
      "PersistentVolumeClaim/jaxserve-data",
      "ConfigMap/jaxserve-gpu",
      "Deployment/jaxserve-gpu",
      "Service/jaxserve-gpu",
      "ConfigMap/jaxserve-tpu",
      "LeaderWorkerSet/jaxserve-tpu",
      "Service/jaxserve-tpu",
    ]
  )


def test_the_checks_catch_what_they_are_for(tmp_path):
  deployment = _find("Deployment", "jaxserve-gpu")
  broken = copy.deepcopy(deployment)
  broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # misspelt
  with pytest.raises(kubernetes_validate.ValidationError):
    validate(broken)
  lws = copy.deepcopy(_find("LeaderWorkerSet", "jaxserve-tpu"))
  lws["spec"]["leaderWorkerTemplate"]["groupSize"] = 4  # not an LWS field
  with pytest.raises(jsonschema.ValidationError):
    validate(lws)
  lws = copy.deepcopy(_find("LeaderWorkerSet", "jaxserve-tpu"))
  lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["port"] = 1
  with pytest.raises(kubernetes_validate.ValidationError):
    validate(lws)
  spec = copy.deepcopy(deployment["spec"]["template"]["spec"])
  args = spec["containers"][0]["args"]
  args[args.index("--max-model-len")] = "--max-model-length"  # a flag renamed
  with pytest.raises(AssertionError, match="does not take"):
    jaxserve_config(spec, {}, tmp_path)
  args[args.index("--max-model-length")] = "--max-model"  # argparse would take the prefix
  with pytest.raises(AssertionError, match="only abbreviated"):
    jaxserve_config(spec, {}, tmp_path)
  spec = copy.deepcopy(_find("LeaderWorkerSet", "jaxserve-tpu"))["spec"]["leaderWorkerTemplate"]
  injected = {"LWS_LEADER_ADDRESS": "jaxserve-tpu-0.jaxserve-tpu", "LWS_GROUP_SIZE": "4"}
  with pytest.raises(KeyError, match="LWS_WORKER_INDEX"):  # a variable nobody sets
    jaxserve_config(spec["workerTemplate"]["spec"], injected, tmp_path)


def _find(kind: str, name: str) -> dict:
  return next(d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name)


@dataclass(frozen=True)
class Pod:
  """One pod template of a workload, the config its jaxserve container runs, and its spec."""

  name: str
  spec: dict
  labels: dict
  config: EngineConfig
  injected: dict  # the LeaderWorkerSet's variables, {} elsewhere

  @property
  def container(self) -> dict:
    return self.spec["containers"][0]

  def mount_of(self, path: str) -> dict:
    """The volume (its manifest entry) holding `path` in the container."""
    mounts = [m for m in self.container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mounts, f"{self.name}: {path} is on no volume"
    name = max(mounts, key=lambda m: len(m["mountPath"]))["name"]
    return next(v for v in self.spec["volumes"] if v["name"] == name)


def render(container: dict, injected: dict) -> list[str]:
  """The container's command line as the kubelet runs it: $(VAR) from its env and `injected`."""
  values = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e} | injected
  return container["command"] + [
    re.sub(r"\$\((\w+)\)", lambda m: values[m[1]], arg) for arg in container["args"]
  ]


def jaxserve_config(pod_spec: dict, injected: dict, tmp_path: Path) -> EngineConfig:
  """The EngineConfig `jaxserve serve` builds from the container's rendered command line, with
  the ConfigMaps it mounts written to tmp_path."""
  container = pod_spec["containers"][0]
  argv = render(container, injected)
  assert argv[:2] == ["jaxserve", "serve"]
  for mount in container["volumeMounts"]:
    volume = next(v for v in pod_spec["volumes"] if v["name"] == mount["name"])
    if "configMap" in volume:
      local = tmp_path / mount["name"]
      local.mkdir(exist_ok=True)
      for key, text in _find("ConfigMap", volume["configMap"]["name"])["data"].items():
        (local / key).write_text(text)
      argv = [a.replace(mount["mountPath"], str(local), 1) for a in argv]
  parser = build_parser()
  args, unknown = parser.parse_known_args(argv[1:])
  assert unknown == [], f"jaxserve serve does not take {unknown}"
  serve = parser._subparsers._group_actions[0].choices["serve"]
  flags = {flag for action in serve._actions for flag in action.option_strings}
  abbreviated = [a for a in argv if a.startswith("--") and a not in flags]
  assert abbreviated == [], f"jaxserve serve does not take {abbreviated} (only abbreviated)"
  return serve_engine_config(args)


def pods(tmp_path: Path) -> list[Pod]:
  found = []
  for doc in DOCS:
    name = doc["metadata"]["name"]
    if doc["kind"] == "Deployment":
      template = doc["spec"]["template"]
      config = jaxserve_config(template["spec"], {}, tmp_path)
      found.append(Pod(name, template["spec"], template["metadata"]["labels"], config, {}))
    if doc["kind"] == "LeaderWorkerSet":
      group = doc["spec"]["leaderWorkerTemplate"]
      for index in range(group["size"]):
        role = "leaderTemplate" if index == 0 else "workerTemplate"
        injected = {
          "LWS_LEADER_ADDRESS": f"{name}-0.{name}.default",
          "LWS_GROUP_SIZE": str(group["size"]),
          "LWS_WORKER_INDEX": str(index),
        }
        template = group[role]
        config = jaxserve_config(template["spec"], injected, tmp_path)
        labels = template["metadata"]["labels"] | {
          "leaderworkerset.sigs.k8s.io/name": name,
          "leaderworkerset.sigs.k8s.io/worker-index": str(index),
        }
        found.append(Pod(f"{name}-{index}", template["spec"], labels, config, injected))
  return found


@pytest.fixture(scope="module")
def all_pods(tmp_path_factory) -> list[Pod]:
  found = pods(tmp_path_factory.mktemp("configmaps"))
  assert [p.name for p in found] == ["jaxserve-gpu"] + [f"jaxserve-tpu-{i}" for i in range(4)]
  return found


def _serves_http(pod: Pod) -> bool:
  return pod.config.distributed.process_id in (None, 0)


def test_serving_pods_listen_where_probes_and_services_look(all_pods):
  services = [d for d in DOCS if d["kind"] == "Service"]
  for pod in all_pods:
    selected = [s for s in services if s["spec"]["selector"].items() <= pod.labels.items()]
    if not _serves_http(pod):
      assert selected == [] and "readinessProbe" not in pod.container, pod.name
      continue
    server = pod.config.server
    assert server.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in pod.container["ports"]}
    assert ports["http"] == server.port
    probe = pod.container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/health" and ports[probe["port"]] == server.port
    assert len(selected) == 1 and selected[0]["spec"]["ports"][0]["targetPort"] == "http"


def test_accelerators_match_the_mesh(all_pods):
  for pod in all_pods:
    resources = pod.container["resources"]
    assert resources["requests"] | resources["limits"] == resources["requests"], pod.name
    tp = pod.config.tensor_parallel_size
    if "nvidia.com/gpu" in resources["limits"]:
      assert int(resources["limits"]["nvidia.com/gpu"]) == tp
      continue
    hosts = pod.config.distributed.num_processes
    assert int(resources["limits"]["google.com/tpu"]) * hosts == tp, pod.name


def test_multi_host_pods_join_process_0s_coordinator(all_pods):
  group = [p for p in all_pods if p.injected]
  leader = group[0]
  coordinator = {p["name"]: p["containerPort"] for p in leader.container["ports"]}["coordinator"]
  assert [p.config.distributed.process_id for p in group] == list(range(len(group)))
  for pod in group:
    dist = pod.config.distributed
    assert dist.active and dist.num_processes == len(group)
    assert dist.coordinator_address == f"{leader.injected['LWS_LEADER_ADDRESS']}:{coordinator}"
    assert pod.config.model == leader.config.model


def test_caches_and_model_are_on_the_persistent_volume(all_pods):
  claims = {d["metadata"]["name"] for d in DOCS if d["kind"] == "PersistentVolumeClaim"}
  for pod in all_pods:
    hub = {e["name"]: e["value"] for e in pod.container["env"]}["HF_HUB_CACHE"]
    for path in (pod.config.compilation_cache_dir, hub):
      assert pod.mount_of(path)["persistentVolumeClaim"]["claimName"] in claims, pod.name


def test_the_drain_fits_the_grace_period(all_pods):
  """Serving pods: preStop waits, sends SIGTERM to jaxserve (PID 1) and waits for it to exit
  within the grace period; other hosts of the job wait for their follower to exit first."""
  graces = {}
  for pod in all_pods:
    hook = " ".join(pod.container["lifecycle"]["preStop"]["exec"]["command"])
    assert "while kill -0 1" in hook, pod.name
    grace = pod.spec["terminationGracePeriodSeconds"]
    graces[pod.name] = grace
    if _serves_http(pod):
      assert f"sleep {PRESTOP_WAIT_S}; kill -TERM 1" in hook
      assert grace >= PRESTOP_WAIT_S + pod.config.server.drain_timeout_s + UVICORN_GRACE_S + 10
    else:
      assert "kill -TERM" not in hook and grace > graces["jaxserve-tpu-0"]
