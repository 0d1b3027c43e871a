"""deploy/kubernetes/: every manifest is an object the API server would take as written
(no missing field, no misspelled key that it would silently drop), the objects point at
one another correctly, and what they carry (configs, rules, RBAC) matches the code and
the repo's other files.

Built-in kinds are checked against the OpenAPI models of the installed ``kubernetes``
client: a document is loaded into its model (which refuses missing required fields and
wrong types) and written back; anything that does not come back was unknown to the
model. Prometheus Operator kinds are checked against the CRD schemas vendored in
tests/fixtures/k8s-crds/ with jsonschema, plus a walk that refuses keys the schema does
not name (the CRD schemas do not say additionalProperties: false).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from kubernetes import client as k8s

from sn_monitor.agent.settings import SERVICE_ACCOUNT_DIR, load_agent_settings
from sn_monitor.controller.jobs.crd import CRD_NAME, spec_schema
from sn_monitor.controller.k8s.job_api import JOB_API_CALLS
from sn_monitor.controller.k8s.settings import KubernetesSettings
from tests.conftest import FIXTURES, ROOT

pytestmark = pytest.mark.integration

K8S = ROOT / "deploy" / "kubernetes"
CRD_SCHEMAS = FIXTURES / "k8s-crds"
#: Shows the layout of the Secrets an operator creates by hand; never applied.
SECRET_EXAMPLE = K8S / "secret.example.yaml"
NAMESPACE = "sn-monitor"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
CRD_KINDS = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors",
             "PrometheusRule": "prometheusrules"}
API = k8s.ApiClient()

# ------------------------------------------------------------------ loading


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def objects() -> list[dict[str, Any]]:
    """Every object the kustomization applies, in its resource order."""
    return [doc for name in kustomization()["resources"] for doc in load_all(K8S / name)]


def find(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects()
             if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def example_secrets() -> dict[str, dict[str, str]]:
    """The hand-made Secrets: name -> their keys and placeholder values."""
    return {doc["metadata"]["name"]: doc["stringData"] for doc in load_all(SECRET_EXAMPLE)}


def generated_configmaps() -> dict[str, set[str]]:
    """configMapGenerator name -> the keys (file names) of the ConfigMap it makes."""
    return {gen["name"]: {PurePosixPath(f).name for f in gen["files"]}
            for gen in kustomization().get("configMapGenerator", [])}


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def workloads() -> list[dict[str, Any]]:
    return [o for o in objects() if o["kind"] in ("DaemonSet", "Deployment")]


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# ------------------------------------------------------------------ the checker


def _quantities_as_strings(doc: Any, parent: str = "") -> Any:
    """``cpu: 1`` is a valid quantity, but the model types quantities as strings."""
    if isinstance(doc, dict):
        return {k: (str(v) if parent in ("requests", "limits") and isinstance(v, int | float)
                    else _quantities_as_strings(v, k)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_quantities_as_strings(v, parent) for v in doc]
    return doc


def differences(want: Any, got: Any, path: str) -> Iterator[str]:
    """Where ``got`` (the document after the round trip) lost or changed something."""
    if isinstance(want, dict) and isinstance(got, dict):
        for key, value in want.items():
            if key not in got:
                yield f"{path}.{key}: unknown key (the model dropped it)"
            else:
                yield from differences(value, got[key], f"{path}.{key}")
    elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            yield from differences(a, b, f"{path}[{i}]")
    elif want != got:
        yield f"{path}: {want!r} came back as {got!r}"


def model_problems(doc: dict[str, Any], klass: str) -> list[str]:
    data = _quantities_as_strings(copy.deepcopy(doc))
    try:
        model = API._ApiClient__deserialize(data, klass)
    except (ValueError, TypeError) as err:  # pydantic's ValidationError is a ValueError
        return [f"{klass}: {err}"]
    return list(differences(data, API.sanitize_for_serialization(model), klass))


def unknown_keys(value: Any, schema: dict[str, Any], path: str) -> Iterator[str]:
    """Keys of ``value`` that ``schema`` does not name, at any depth."""
    if isinstance(value, dict):
        if "properties" in schema:
            for key, item in value.items():
                if key not in schema["properties"]:
                    yield f"{path}.{key}: not in the CRD schema"
                else:
                    yield from unknown_keys(item, schema["properties"][key], f"{path}.{key}")
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                yield from unknown_keys(item, schema["additionalProperties"], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from unknown_keys(item, schema["items"], f"{path}[{i}]")


def crd_problems(doc: dict[str, Any]) -> list[str]:
    schema = json.loads((CRD_SCHEMAS / f"monitoring.coreos.com_{CRD_KINDS[doc['kind']]}.json")
                        .read_text())
    # OpenAPI v3.0 schemas are JSON Schema draft 4 with extensions (x-kubernetes-*),
    # which jsonschema ignores.
    validator = jsonschema.Draft4Validator(schema)
    problems = [f"{doc['kind']}.{'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in validator.iter_errors(doc)]
    problems += unknown_keys(doc, schema, doc["kind"])
    # the CRD schema says only "metadata: object": check it as the API server does
    problems += model_problems(doc.get("metadata", {}), "V1ObjectMeta")
    return problems


def problems(doc: dict[str, Any]) -> list[str]:
    """Why the API server would refuse ``doc`` or drop part of it; empty when it is fine."""
    api_version, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    if api_version == "monitoring.coreos.com/v1" and kind in CRD_KINDS:
        return crd_problems(doc)
    klass = api_version.rpartition("/")[2].capitalize() + kind
    if not hasattr(k8s, klass):
        return [f"no model for {api_version} {kind}"]
    return model_problems(doc, klass)


# ------------------------------------------------------------------ files and schemas


def test_every_yaml_parses():
    files = sorted(K8S.rglob("*.yaml"))
    assert len(files) >= 12
    for path in files:
        assert load_all(path), f"{path} is empty"


def test_kustomization_lists_every_manifest():
    kust = kustomization()
    assert kust["namespace"] == NAMESPACE
    listed = kust["resources"]
    assert len(listed) == len(set(listed))
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", SECRET_EXAMPLE.name}
    assert set(listed) == on_disk
    for gen in kust["configMapGenerator"]:
        for name in gen["files"]:
            assert (K8S / name).is_file(), name
            # kustomize refuses files outside its folder (and a test below reads them)
            assert (K8S / name).resolve().is_relative_to(K8S)


def _documents() -> list[tuple[str, dict[str, Any]]]:
    """Every object in the folder, secret.example.yaml's too: (test id, document)."""
    return [(f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc)
            for path in sorted(K8S.glob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in load_all(path)]


DOCUMENTS = _documents()


@pytest.mark.parametrize("doc", [d for _, d in DOCUMENTS], ids=[i for i, _ in DOCUMENTS])
def test_manifest_is_valid(doc: dict[str, Any]):
    assert problems(doc) == []


def _misspelled_node_selector(doc):
    spec = pod_spec(doc)
    spec["nodeSelecter"] = spec.pop("nodeSelector")


def _nameless_container(doc):
    del pod_spec(doc)["containers"][0]["name"]


def _string_for_integer(doc):
    pod_spec(doc)["terminationGracePeriodSeconds"] = "30s"


def _misspelled_probe_key(doc):
    pod_spec(doc)["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/healthz"


def _misspelled_endpoint_key(doc):
    doc["spec"]["podMetricsEndpoints"][0]["portName"] = "metrics"


def _no_selector(doc):
    del doc["spec"]["selector"]


def _rule_without_expr(doc):
    del doc["spec"]["groups"][0]["rules"][0]["expr"]


def _misspelled_metadata_key(doc):
    doc["metadata"]["label"] = doc["metadata"].pop("labels")


@pytest.mark.parametrize(("kind", "break_it", "expected"), [
    pytest.param("DaemonSet", _misspelled_node_selector, "nodeSelecter: unknown key",
                 id="daemonset-misspelled-key"),
    pytest.param("DaemonSet", _nameless_container, "V1Container\nname",
                 id="container-without-name"),
    pytest.param("DaemonSet", _string_for_integer, "terminationGracePeriodSeconds",
                 id="string-for-integer"),
    pytest.param("Deployment", _misspelled_probe_key, "httpGet.paht: unknown key",
                 id="deployment-misspelled-nested-key"),
    pytest.param("PodMonitor", _misspelled_endpoint_key,
                 "podMetricsEndpoints[0].portName: not in the CRD schema",
                 id="podmonitor-unknown-key"),
    pytest.param("ServiceMonitor", _no_selector, "'selector' is a required property",
                 id="servicemonitor-missing-required"),
    pytest.param("PrometheusRule", _rule_without_expr, "'expr' is a required property",
                 id="rule-without-expr"),
    pytest.param("PodMonitor", _misspelled_metadata_key, "V1ObjectMeta.label: unknown key",
                 id="crd-metadata-misspelled-key"),
])
def test_checker_catches_broken_manifests(kind: str, break_it, expected: str):
    doc = find(kind)
    assert problems(doc) == []
    break_it(doc)
    found = problems(doc)
    assert any(expected in p for p in found), found


# ------------------------------------------------------------------ the DistributedJob CRD

CRD_FILE = K8S / "distributedjob-crd.yaml"
JOB_FILES = sorted((ROOT / "deploy" / "jobs").glob("*.yaml"))


def test_distributedjob_crd_is_the_generated_one_and_valid():
    (crd,) = load_all(CRD_FILE)
    assert crd["metadata"]["name"] == CRD_NAME == "distributedjobs.training.ai"
    assert problems(crd) == []  # V1CustomResourceDefinition, as the other manifests
    spec = crd["spec"]
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["dj"]
    assert spec["names"]["kind"] == "DistributedJob"
    (version,) = spec["versions"]
    assert version["name"] == "v1"
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "State", "Generation", "Nodes", "ETTR", "Age"]
    schema = version["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"] == spec_schema()  # made from the loader's spec


def _structural_problems(schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """Where a schema is not structural: a node with neither a type nor an escape."""
    if not ("type" in schema or schema.get("x-kubernetes-int-or-string")
            or schema.get("x-kubernetes-preserve-unknown-fields")):
        yield f"{path or '.'}: no type"
    for key, sub in schema.get("properties", {}).items():
        yield from _structural_problems(sub, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _structural_problems(schema[key], f"{path}[{key}]")


def test_distributedjob_crd_schema_is_structural():
    (crd,) = load_all(CRD_FILE)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert list(_structural_problems(schema)) == []


@pytest.mark.parametrize("path", JOB_FILES, ids=[p.name for p in JOB_FILES])
def test_job_files_apply_unchanged_as_distributedjobs(path: Path):
    (crd,) = load_all(CRD_FILE)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    (doc,) = load_all(path)
    validator = jsonschema.Draft4Validator(schema)
    assert [e.message for e in validator.iter_errors(doc)] == []
    assert list(unknown_keys(doc, schema, "DistributedJob")) == []
    assert doc["apiVersion"] == "training.ai/v1"


# ------------------------------------------------------------------ what they carry


def test_generated_files_are_up_to_date():
    result = subprocess.run([sys.executable, str(K8S / "generate.py"), "--check"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_rules_configmap_is_rules_default_yaml():
    assert (K8S / "rules" / "default.yaml").read_bytes() == \
        (ROOT / "sn_monitor" / "rules" / "default.yaml").read_bytes()
    assert "rules/default.yaml" in [f for g in kustomization()["configMapGenerator"]
                                    for f in g["files"]]


def repo_rule_groups() -> list[dict[str, Any]]:
    groups = []
    # the *.yml next to tests/: alerts and recording rules, not the promtool test cases
    for path in sorted((ROOT / "rules" / "prometheus").glob("*.yml")):
        groups.extend(yaml.safe_load(path.read_text())["groups"])
    return groups


def test_prometheus_rule_carries_the_repo_rule_groups():
    groups = find("PrometheusRule")["spec"]["groups"]
    assert groups == repo_rule_groups()
    names = [g["name"] for g in groups]
    assert len(names) == len(set(names))


def test_promtool_checks_the_prometheus_rule_groups(tmp_path: Path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (CI installs Debian's prometheus: .ci/run)")
    rules = tmp_path / "sn-monitor.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": find("PrometheusRule")["spec"]["groups"]}))
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def check_config(*files: Path) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).parent / "sn-monitor"
    return subprocess.run([str(binary), "check-config", *map(str, files)], capture_output=True,
                          text=True, timeout=60, check=False)


def test_configs_pass_check_config():
    # check-config tells the kinds apart by their keys: each must be read as what it is
    files = {K8S / "config" / "agent.yaml": "agent config",
             K8S / "config" / "controller.yaml": "controller config",
             K8S / "rules" / "default.yaml": "rule file"}
    result = check_config(*files)
    assert result.returncode == 0, result.stdout + result.stderr
    for path, kind in files.items():
        assert f"{path}: ok ({kind})" in result.stdout


def test_example_token_file_passes_check_config(tmp_path: Path):
    secret = example_secrets()["sn-controller-tokens"]
    tokens = yaml.safe_load(secret["tokens.yaml"])
    for entry in tokens:  # the token files are keys of the same Secret: put them in tmp
        key = PurePosixPath(entry["token_file"]).name
        (tmp_path / key).write_text(secret[key])
        entry["token_file"] = str(tmp_path / key)
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump(tokens))
    result = check_config(tmp_path / "tokens.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok (token file)" in result.stdout
    assert secret["agent.token"] == example_secrets()["sn-agent-token"]["agent.token"]


# ------------------------------------------------------------------ cross-references


def test_service_selects_the_controller_pods():
    deployment, service = find("Deployment", "sn-controller"), find("Service", "sn-controller")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels_match(deployment["spec"]["selector"]["matchLabels"], labels)
    assert labels_match(service["spec"]["selector"], labels)
    ports = {p["name"] for c in pod_spec(deployment)["containers"] for p in c["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in ports


def test_servicemonitor_scrapes_the_controller_service():
    monitor, service = find("ServiceMonitor"), find("Service", "sn-controller")
    assert labels_match(monitor["spec"]["selector"]["matchLabels"],
                        service["metadata"]["labels"])
    ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports
        assert endpoint["path"] == "/metrics"
        # /metrics needs no token (sn_monitor/controller/api/routes/probes.py): no
        # credentials to keep
        assert not {"authorization", "bearerTokenSecret", "basicAuth"} & endpoint.keys()


def test_podmonitor_scrapes_the_agent_pods():
    monitor, agent = find("PodMonitor"), find("DaemonSet", "sn-agent")
    labels = agent["spec"]["template"]["metadata"]["labels"]
    assert labels_match(agent["spec"]["selector"]["matchLabels"], labels)
    assert labels_match(monitor["spec"]["selector"]["matchLabels"], labels)
    ports = {p["name"] for c in pod_spec(agent)["containers"] for p in c["ports"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node"} in endpoint["relabelings"]


def test_scrape_jobs_are_the_jobs_the_alerts_use():
    """The operator names jobs after the Service, or namespace/PodMonitor, unless told."""
    monitor, service = find("ServiceMonitor"), find("Service", "sn-controller")
    controller_job = (service["metadata"]["labels"].get(monitor["spec"].get("jobLabel", ""))
                      or service["metadata"]["name"])
    pods, agents = find("PodMonitor"), find("DaemonSet", "sn-agent")
    agent_job = (agents["spec"]["template"]["metadata"]["labels"].get(
        pods["spec"].get("jobLabel", "")) or f"{NAMESPACE}/{pods['metadata']['name']}")
    text = "".join(p.read_text() for p in (ROOT / "rules" / "prometheus").glob("*.yml"))
    used = set(re.findall(r'\bjob="([^"]+)"', text))
    assert used == {"sn-agent", "sn-controller"}
    assert {agent_job, controller_job} == used


def test_probes_and_listen_addresses_match_the_ports():
    configs = {"sn-agent": ("agent.yaml", "metrics"), "sn-controller": ("controller.yaml", "http")}
    for workload in workloads():
        (container,) = pod_spec(workload)["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        # the controller: Ready only while it may act (/readyz), alive while it serves
        paths = ({"readinessProbe": "/readyz", "livenessProbe": "/livez"}
                 if workload["metadata"]["name"] == "sn-controller"
                 else {"readinessProbe": "/healthz", "livenessProbe": "/healthz"})
        for probe, path in paths.items():
            assert container[probe]["httpGet"]["path"] == path
            assert container[probe]["httpGet"]["port"] in ports
        config_file, port_name = configs[workload["metadata"]["name"]]
        listen = yaml.safe_load((K8S / "config" / config_file).read_text())["listen"]
        assert int(listen.rpartition(":")[2]) == ports[port_name]


def test_agents_report_to_the_controller_service():
    url = urlsplit(yaml.safe_load((K8S / "config" / "agent.yaml").read_text())
                   ["controller"]["url"])
    service = find("Service", "sn-controller")
    assert url.hostname == f"{service['metadata']['name']}.{NAMESPACE}.svc"
    assert url.port in [p["port"] for p in service["spec"]["ports"]]
    # the agent is on the host network: only ClusterFirstWithHostNet resolves *.svc there
    spec = pod_spec(find("DaemonSet", "sn-agent"))
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"


def _references(spec: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(kind, name) of every object a pod spec names."""
    yield "ServiceAccount", spec.get("serviceAccountName", "default")
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"]["name"]
        if "secret" in volume:
            yield "Secret", volume["secret"]["secretName"]
        if "persistentVolumeClaim" in volume:
            yield "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]
    for container in spec["containers"] + spec.get("initContainers", []):
        for env in container.get("env", []):
            ref = env.get("valueFrom", {})
            if "configMapKeyRef" in ref:
                yield "ConfigMap", ref["configMapKeyRef"]["name"]
            if "secretKeyRef" in ref:
                yield "Secret", ref["secretKeyRef"]["name"]
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                yield "ConfigMap", source["configMapRef"]["name"]
            if "secretRef" in source:
                yield "Secret", source["secretRef"]["name"]


OPERATING = ROOT / "docs" / "operating"


def readme_install_section() -> str:
    """The documentation's Kubernetes install page (docs/operating/kubernetes.md)."""
    return (OPERATING / "kubernetes.md").read_text()


def test_every_referenced_object_is_defined():
    defined = {(o["kind"], o["metadata"]["name"]) for o in objects()}
    defined |= {("ConfigMap", name) for name in generated_configmaps()}
    by_hand = set(example_secrets())
    readme = readme_install_section()
    referenced = set()
    for workload in workloads():
        referenced |= set(_references(pod_spec(workload)))
    for kind, name in referenced:
        if (kind, name) in defined:
            continue
        # the token Secrets are made by hand: shown in secret.example.yaml, told in the docs
        assert kind == "Secret", f"{kind} {name} is defined nowhere"
        assert name in by_hand, f"Secret {name} is neither defined nor in {SECRET_EXAMPLE.name}"
        assert name in readme, f"docs/operating/kubernetes.md does not say how to create {name}"
    assert {("Secret", name) for name in by_hand} <= referenced  # no stale example


def _mount(workload: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The volume mount holding ``path`` in the workload's container, its volume, the key."""
    spec = pod_spec(workload)
    (container,) = spec["containers"]
    target = PurePosixPath(path)
    covering = [m for m in container["volumeMounts"]
                if PurePosixPath(m["mountPath"]) in (target, *target.parents)]
    assert covering, f"{workload['metadata']['name']}: nothing mounted at {path}"
    best = max(covering, key=lambda m: len(PurePosixPath(m["mountPath"]).parts))
    volume = next(v for v in spec["volumes"] if v["name"] == best["name"])
    return best, volume, str(PurePosixPath(path).relative_to(best["mountPath"]))


def _assert_file_provided(workload: dict[str, Any], path: str) -> None:
    """``path`` is a key of the ConfigMap or Secret mounted over it."""
    _, volume, key = _mount(workload, path)
    if "configMap" in volume:
        assert key in generated_configmaps()[volume["configMap"]["name"]], path
    elif "secret" in volume:
        assert key in example_secrets()[volume["secret"]["secretName"]], path
    else:
        pytest.fail(f"{path} is on volume {volume['name']}, neither ConfigMap nor Secret")


def _config_arg(workload: dict[str, Any]) -> str:
    args = pod_spec(workload)["containers"][0]["args"]
    return args[args.index("--config") + 1]


def test_files_the_agent_reads_are_mounted():
    agent = find("DaemonSet", "sn-agent")
    config_path = _config_arg(agent)
    _assert_file_provided(agent, config_path)
    config = yaml.safe_load((K8S / "config" / PurePosixPath(config_path).name).read_text())
    _assert_file_provided(agent, config["controller"]["token_file"])
    mount, volume, _ = _mount(agent, config["state_dir"])
    assert not mount.get("readOnly")
    assert volume["hostPath"]["path"] == "/var/lib/sn-monitor"
    # the host's kernel file systems, read-only, where the config points the collectors
    host = {"procfs": ("/proc", "Directory"), "sysfs": ("/sys", "Directory"),
            "kmsg": ("/dev/kmsg", "CharDevice")}
    for key, (host_path, host_type) in host.items():
        mount, volume, rest = _mount(agent, config["paths"][key])
        assert rest == "."
        assert mount["readOnly"] is True
        assert volume["hostPath"] == {"path": host_path, "type": host_type}


def test_files_the_controller_reads_are_mounted():
    controller = find("Deployment", "sn-controller")
    config_path = _config_arg(controller)
    _assert_file_provided(controller, config_path)
    config = yaml.safe_load((K8S / "config" / PurePosixPath(config_path).name).read_text())
    for rules_dir in config["rules"]:
        _assert_file_provided(controller, f"{rules_dir}/default.yaml")
    _assert_file_provided(controller, config["token_file"])
    tokens = yaml.safe_load(example_secrets()["sn-controller-tokens"]["tokens.yaml"])
    for entry in tokens:
        _assert_file_provided(controller, entry["token_file"])
    mount, volume, _ = _mount(controller, config["state_dir"])
    assert not mount.get("readOnly")
    claim = find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    # one writer of the SQLite store at a time
    assert controller["spec"]["replicas"] == 1
    assert controller["spec"]["strategy"] == {"type": "Recreate"}


def test_agent_node_name_comes_from_the_downward_api():
    (container,) = pod_spec(find("DaemonSet", "sn-agent"))["containers"]
    args = container["args"]
    assert args[args.index("--node") + 1] == "$(NODE_NAME)"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "node" not in yaml.safe_load((K8S / "config" / "agent.yaml").read_text())
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    # all GPUs through the toolkit, none taken from the scheduler
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])


def test_agent_runs_on_every_gpu_node_even_cordoned_ones():
    agent = find("DaemonSet", "sn-agent")
    spec = pod_spec(agent)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["priorityClassName"] == "system-node-critical"
    tolerated = {(t["key"], t["operator"], t["effect"]) for t in spec["tolerations"]}
    assert ("nvidia.com/gpu", "Exists", "NoSchedule") in tolerated
    # the taint the kubernetes driver cordons with: the agent must stay (and return)
    assert (KubernetesSettings().taint_key, "Exists", "NoSchedule") in tolerated
    assert agent["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                               "rollingUpdate": {"maxUnavailable": "10%"}}


def test_tokens_reach_the_pods_only_as_files():
    for workload in workloads():
        spec = pod_spec(workload)
        for container in spec["containers"]:
            assert not any("secretKeyRef" in e.get("valueFrom", {})
                           for e in container.get("env", []))
            assert not any("secretRef" in s for s in container.get("envFrom", []))
            assert not any("token" in a and not a.startswith("/") for a in container["args"])
        for volume in spec["volumes"]:
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] & 0o007 == 0  # not world-readable


def test_controller_runs_least_privileged():
    spec = pod_spec(find("Deployment", "sn-controller"))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    for workload in workloads():
        (container,) = pod_spec(workload)["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"requests", "limits"} <= container["resources"].keys()


def test_agent_service_account_may_only_read_nodes():
    """The agent reads its own Node (labels_from_node): get on nodes, and nothing else."""
    account = find("ServiceAccount", "sn-agent")
    assert account["automountServiceAccountToken"] is False  # only the agent's pods mount it
    spec = pod_spec(find("DaemonSet", "sn-agent"))
    assert spec["serviceAccountName"] == "sn-agent"
    config = yaml.safe_load((K8S / "config" / "agent.yaml").read_text())
    assert config["labels_from_node"]["enabled"] is True
    assert spec["automountServiceAccountToken"] is True  # the token and CA labels_from_node read
    settings = load_agent_settings(K8S / "config" / "agent.yaml")
    assert settings.labels_from_node.token_file.startswith(SERVICE_ACCOUNT_DIR)
    assert settings.labels_from_node.ca_file.startswith(SERVICE_ACCOUNT_DIR)
    assert settings.labels_from_node.api_url is None  # in-cluster: KUBERNETES_SERVICE_*
    role = find("ClusterRole", "sn-agent")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    binding = find("ClusterRoleBinding", "sn-agent")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "sn-agent"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sn-agent",
                                    "namespace": NAMESPACE}]
    for other in objects():  # no other binding grants the agent anything
        if other["kind"] in ("RoleBinding", "ClusterRoleBinding") \
                and other["metadata"]["name"] != "sn-agent":
            assert all(s["name"] != "sn-agent" for s in other["subjects"])


#: Every CoreV1Api method the drivers call, and the (resource, verb) it needs. A new call
#: in a driver fails the test below until it is listed here and granted in
#: controller-rbac.yaml.
API_CALLS = {
    # controller/actions/drivers/kubernetes.py
    "read_node": ("nodes", "get"),                              # _read_node: every action
    "patch_node": ("nodes", "patch"),                           # _cordon, _uncordon
    "list_pod_for_all_namespaces": ("pods", "list"),            # _evictable_pods (evict)
    "create_namespaced_pod_eviction": ("pods/eviction", "create"),  # _evict
    # controller/actions/drivers/k8s_jobs.py (job control of a DistributedJob on Kubernetes)
    "list_namespaced_pod": ("pods", "list"),                    # _pods
    "delete_namespaced_pod": ("pods", "delete"),                # _delete_failed (restore)
    "patch_namespaced_pod": ("pods", "patch"),                  # _annotate (checkpoint)
}
JOB_API = ROOT / "sn_monitor" / "controller" / "k8s" / "job_api.py"
DRIVERS = [ROOT / "sn_monitor" / "controller" / "actions" / "drivers" / name
           for name in ("kubernetes.py", "k8s_jobs.py")]


def test_controller_rbac_grants_exactly_what_the_drivers_call():
    called = {m for path in DRIVERS for m in re.findall(r"self\.api\.(\w+)\(", path.read_text())}
    assert called, "no API call found: did the drivers move?"
    assert called <= API_CALLS.keys(), f"not in API_CALLS: {sorted(called - API_CALLS.keys())}"
    needed = {API_CALLS[m] for m in called}
    role = find("ClusterRole", "sn-controller")
    core = [rule for rule in role["rules"] if rule["apiGroups"] == [""]]
    granted = {(resource, verb) for rule in core for resource in rule["resources"]
               for verb in rule["verbs"]}
    assert granted == needed
    # the DistributedJob watch (controller/k8s/job_api.py): exactly these, nothing else
    jobs = [rule for rule in role["rules"] if rule["apiGroups"] != [""]]
    assert all(rule["apiGroups"] == ["training.ai"] for rule in jobs)
    granted_jobs = {(resource, verb) for rule in jobs for resource in rule["resources"]
                    for verb in rule["verbs"]}
    assert granted_jobs == {("distributedjobs", v) for v in ("get", "list", "watch")} | {
        ("distributedjobs/status", v) for v in ("get", "update", "patch")}
    job_calls = set(re.findall(r"self\.api\.(\w+)\(", JOB_API.read_text()))
    assert job_calls
    assert job_calls <= JOB_API_CALLS.keys()
    assert {JOB_API_CALLS[m] for m in job_calls} <= granted_jobs
    binding = find("ClusterRoleBinding", "sn-controller")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "sn-controller"}
    account = pod_spec(find("Deployment", "sn-controller"))["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": NAMESPACE}]
    find("ServiceAccount", account)
    config = yaml.safe_load((K8S / "config" / "controller.yaml").read_text())
    assert config["drivers"]["kubernetes"] == {}  # in-cluster: this service account


def test_kustomize_builds():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (the checks above need no kubectl)")
    result = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    built = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert len(built) == len(objects()) + len(generated_configmaps())
    names = set()
    for doc in built:
        names.add((doc["kind"], doc["metadata"]["name"]))
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]
        assert problems(doc) == []
    # the pods name the generated ConfigMaps by their hashed names
    for doc in built:
        if doc["kind"] in ("DaemonSet", "Deployment"):
            for kind, name in _references(pod_spec(doc)):
                if kind == "ConfigMap":
                    assert (kind, name) in names
                    assert name not in generated_configmaps()


def test_the_docs_say_how_to_install():
    bare_metal = (OPERATING / "bare-metal.md").read_text()
    assert bare_metal.startswith("# Install on a bare-metal node")
    assert "deploy/systemd/sn-agent.service" in bare_metal
    section = readme_install_section()
    assert section.startswith("# Install on Kubernetes")
    assert "kubectl apply -k deploy/kubernetes" in section
    assert "--from-file" in section
    assert "deploy/prometheus/prometheus.yml" in section


# ------------------------------------------------------------------ the HA Component

HA = K8S / "ha"
LEASE_CODE = ROOT / "sn_monitor" / "controller" / "ha" / "k8s_lease.py"
ROLE_CODE = ROOT / "sn_monitor" / "controller" / "ha" / "k8s_role.py"
#: The strategic-merge keys (x-kubernetes-patch-merge-key) of the lists the HA patches
#: touch. A list under any other key replaces the base's, as in kustomize.
MERGE_KEYS = {"containers": "name", "volumes": "name", "env": "name",
              "volumeMounts": "mountPath"}


def ha_kustomization() -> dict[str, Any]:
    return yaml.safe_load((HA / "kustomization.yaml").read_text())


def strategic_merge(base: Any, patch: Any, key: str = "") -> Any:
    """A strategic-merge patch as far as the HA patches use it: maps merge, ``null``
    deletes a key, lists under MERGE_KEYS merge item by item on their key."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for name, value in patch.items():
            if value is None:
                merged.pop(name, None)
            elif name in merged:
                merged[name] = strategic_merge(merged[name], value, name)
            else:
                merged[name] = copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        on = MERGE_KEYS[key]
        merged = copy.deepcopy(base)
        for item in patch:
            at = [i for i, old in enumerate(merged) if old[on] == item[on]]
            if at:
                merged[at[0]] = strategic_merge(merged[at[0]], item)
            else:
                merged.append(copy.deepcopy(item))
        return merged
    return copy.deepcopy(patch)


def ha_objects() -> list[dict[str, Any]]:
    """The base with the HA Component applied (checked against kubectl kustomize below)."""
    kust = ha_kustomization()
    assert kust["kind"] == "Component"
    assert set(kust) <= {"apiVersion", "kind", "resources", "patches", "configMapGenerator"}
    built = objects() + [doc for name in kust["resources"] for doc in load_all(HA / name)]
    for entry in kust["patches"]:
        assert set(entry) == {"path"}  # matched by kind and name: no target selectors
        for patch in load_all(HA / entry["path"]):
            key = (patch["kind"], patch["metadata"]["name"])
            (at,) = [i for i, o in enumerate(built) if (o["kind"], o["metadata"]["name"]) == key]
            if patch.get("$patch") == "delete":
                del built[at]
            else:
                assert "$patch" not in json.dumps(patch)  # no directive this merge lacks
                assert "$retainKeys" not in json.dumps(patch)
                built[at] = strategic_merge(built[at], patch)
    return built


def ha_find(kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in ha_objects() if (o["kind"], o["metadata"]["name"]) == (kind, name)]
    return found


def ha_configmaps() -> dict[str, dict[str, Path]]:
    """Generated ConfigMap -> key -> the file it holds, with the Component's generators."""
    maps = {gen["name"]: {PurePosixPath(f).name: K8S / f for f in gen["files"]}
            for gen in kustomization()["configMapGenerator"]}
    for gen in ha_kustomization()["configMapGenerator"]:
        assert gen["behavior"] == "replace"
        assert gen["name"] in maps
        maps[gen["name"]] = {PurePosixPath(f).name: HA / f for f in gen["files"]}
    return maps


def ha_secrets() -> dict[str, dict[str, str]]:
    ours = load_all(HA / "secret.example.yaml")
    return {**example_secrets(), **{d["metadata"]["name"]: d["stringData"] for d in ours}}


def ha_file(workload: dict[str, Any], path: str) -> Path | None:
    """The repo file a path in the HA pod is (a ConfigMap key), None for a Secret's key;
    fails when nothing provides it."""
    _, volume, key = _mount(workload, path)
    if "configMap" in volume:
        keys = ha_configmaps()[volume["configMap"]["name"]]
        assert key in keys, path
        return keys[key]
    assert "secret" in volume, f"{path} is on {volume['name']}, neither ConfigMap nor Secret"
    assert key in ha_secrets()[volume["secret"]["secretName"]], path
    return None


def ha_config() -> dict[str, Any]:
    controller = ha_find("Deployment", "sn-controller")
    path = ha_file(controller, _config_arg(controller))
    assert path == HA / "config" / "controller.yaml"
    return yaml.safe_load(path.read_text())


def test_ha_component_lists_every_file():
    kust = ha_kustomization()
    used = {*kust["resources"], *(p["path"] for p in kust["patches"]),
            *(f for g in kust["configMapGenerator"] for f in g["files"])}
    on_disk = {str(p.relative_to(HA)) for p in HA.rglob("*.yaml")}
    assert on_disk - used == {"kustomization.yaml", "secret.example.yaml"}
    for name in used:
        assert (HA / name).is_file(), name
        assert (HA / name).resolve().is_relative_to(HA), name
    # one line in the base switches it on
    assert "# components: [ha]" in (K8S / "kustomization.yaml").read_text()


def test_ha_objects_are_valid():
    docs = ha_objects() + load_all(HA / "secret.example.yaml")
    found = [f"{d['kind']}/{d['metadata']['name']}: {p}" for d in docs for p in problems(d)]
    assert found == []


def test_ha_controller_runs_two_replicas_one_active():
    controller = ha_find("Deployment", "sn-controller")
    assert controller["spec"]["replicas"] == 2
    # both are Ready (the Service picks the active by label): an ordinary rollout that
    # stops an old pod only once a new one stands by
    assert controller["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    spec = pod_spec(controller)
    (container,) = spec["containers"]
    # a standby answers /livez 200 and /readyz 503: Ready while it serves, either role
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/livez", "port": "http"}, probe
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # the pod the controller labels with its role (k8s_role.py)
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    (term,) = spec["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert labels_match(term["podAffinityTerm"]["labelSelector"]["matchLabels"],
                        controller["spec"]["template"]["metadata"]["labels"])
    # no volume: the state is in PostgreSQL
    assert not any(o["kind"] == "PersistentVolumeClaim" for o in ha_objects())
    assert not any("persistentVolumeClaim" in v for v in spec["volumes"])


def test_ha_config_is_the_base_config_plus_store_and_ha():
    config = ha_config()
    base = yaml.safe_load((K8S / "config" / "controller.yaml").read_text())
    assert {k: v for k, v in config.items() if k not in ("store", "ha")} == base
    assert config["store"] == {"backend": "postgresql", "dsn_file": "/etc/sn-monitor/store/dsn"}
    assert config["ha"] == {"lease": "kubernetes",
                            "kubernetes": {"name": "sn-monitor-controller"}}


def test_ha_config_passes_check_config():
    result = check_config(HA / "config" / "controller.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{HA / 'config' / 'controller.yaml'}: ok (controller config)" in result.stdout


def test_ha_files_the_controller_reads_are_mounted():
    controller = ha_find("Deployment", "sn-controller")
    config = ha_config()
    for rules_dir in config["rules"]:
        assert ha_file(controller, f"{rules_dir}/default.yaml") == K8S / "rules" / "default.yaml"
    assert ha_file(controller, config["token_file"]) is None  # the base's Secret
    for entry in yaml.safe_load(ha_secrets()["sn-controller-tokens"]["tokens.yaml"]):
        ha_file(controller, entry["token_file"])
    dsn_mount, dsn_volume, key = _mount(controller, config["store"]["dsn_file"])
    assert dsn_volume["secret"]["secretName"] == "sn-monitor-store"
    assert key == "dsn"
    assert dsn_mount["readOnly"] is True
    assert dsn_volume["secret"]["defaultMode"] & 0o007 == 0  # not world-readable
    mount, volume, _ = _mount(controller, config["state_dir"])
    assert not mount.get("readOnly")
    assert volume == {"name": mount["name"], "emptyDir": {}}


def test_ha_every_referenced_object_is_defined_or_told():
    built = ha_objects()
    defined = {(o["kind"], o["metadata"]["name"]) for o in built}
    defined |= {("ConfigMap", name) for name in ha_configmaps()}
    readme = (HA / "README.md").read_text()
    for workload in (o for o in built if o["kind"] in ("DaemonSet", "Deployment")):
        spec = pod_spec(workload)
        for kind, name in _references(spec):
            if (kind, name) not in defined:
                assert kind == "Secret", f"{kind} {name} is defined nowhere"
                assert name in ha_secrets(), f"Secret {name}: in no secret.example.yaml"
        for volume in spec["volumes"]:
            if "secret" in volume:
                assert volume["secret"]["defaultMode"] & 0o007 == 0
        for container in spec["containers"]:
            assert not any("secretKeyRef" in e.get("valueFrom", {})
                           for e in container.get("env", []))
    assert "kubectl create secret generic sn-monitor-store" in readme
    assert "--from-file=dsn=" in readme
    assert "components: [ha]" in readme


def test_ha_lease_rbac_grants_exactly_what_the_lease_calls():
    from sn_monitor.controller.ha.k8s_lease import LEASE_CALLS

    called = set(re.findall(r"self\.api\.(\w+)\(", LEASE_CODE.read_text()))
    assert called == LEASE_CALLS.keys(), "a Lease call is missing from LEASE_CALLS"
    name = ha_config()["ha"]["kubernetes"]["name"]
    # create cannot be narrowed by name (the name is in the body): every other verb is
    needed = {(resource, verb, () if verb == "create" else (name,))
              for resource, verb in LEASE_CALLS.values()}
    assert ha_role_grants("sn-controller-lease", "coordination.k8s.io") == needed
    # the base, one controller without a Lease, is granted none
    assert not any(o["kind"] in ("Role", "RoleBinding") for o in objects())


def test_ha_pod_label_rbac_grants_exactly_what_the_role_label_calls():
    from sn_monitor.controller.ha.k8s_role import POD_CALLS, RBAC_FILE

    called = set(re.findall(r"self\.api\.(\w+)\(", ROLE_CODE.read_text()))
    assert called, "no API call found: did k8s_role.py move?"
    assert called == POD_CALLS.keys(), "a pod call is missing from POD_CALLS"
    # a Deployment's pod names are generated: no resourceNames can narrow these
    needed = {(resource, verb, ()) for resource, verb in POD_CALLS.values()}
    assert ha_role_grants("sn-controller-pod-label", "") == needed
    # the 403 log line points at the file that grants it
    assert (ROOT / RBAC_FILE).resolve() == (HA / "pod-label-rbac.yaml").resolve()
    assert "pod-label-rbac.yaml" in ha_kustomization()["resources"]


def ha_role_grants(name: str, api_group: str) -> set[tuple[str, str, tuple[str, ...]]]:
    """(resource, verb, resourceNames) the HA Role ``name`` grants the controller, which
    must be in ``api_group`` only, in the namespace, and bound to the controller's
    ServiceAccount."""
    role = ha_find("Role", name)
    assert role["metadata"]["namespace"] == NAMESPACE  # where POD_NAMESPACE points
    assert all(rule["apiGroups"] == [api_group] for rule in role["rules"])
    binding = ha_find("RoleBinding", name)
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": name}
    account = pod_spec(ha_find("Deployment", "sn-controller"))["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": NAMESPACE}]
    return {(resource, verb, tuple(rule.get("resourceNames", [])))
            for rule in role["rules"] for resource in rule["resources"]
            for verb in rule["verbs"]}


def test_ha_service_selects_only_the_active_controller():
    from sn_monitor.controller.ha.k8s_role import ROLE_LABEL

    controller, service = ha_find("Deployment", "sn-controller"), ha_find("Service",
                                                                          "sn-controller")
    selector = dict(service["spec"]["selector"])
    assert selector.pop(ROLE_LABEL) == "active"  # the label the active puts on its pod
    assert selector == find("Service", "sn-controller")["spec"]["selector"]  # the base's
    labels = controller["spec"]["template"]["metadata"]["labels"]
    assert labels_match(selector, labels)
    # the controller sets it, not the template (every new pod would start "active"),
    # and the Deployment must not select on it (its pods would fall out of it)
    assert ROLE_LABEL not in labels
    assert ROLE_LABEL not in controller["spec"]["selector"]["matchLabels"]
    ports = {p["name"] for c in pod_spec(controller)["containers"] for p in c["ports"]}
    assert all(p["targetPort"] in ports for p in service["spec"]["ports"])


def test_ha_prometheus_scrapes_both_controllers_as_the_alerts_job():
    # the active-only Service would hide the standby's sn_controller_leader 0 (and so
    # SnControllerNoneActive): the ServiceMonitor selects a Service of every pod
    controller, monitor = ha_find("Deployment", "sn-controller"), ha_find(
        "ServiceMonitor", "sn-controller")
    selected = [o for o in ha_objects() if o["kind"] == "Service" and labels_match(
        monitor["spec"]["selector"]["matchLabels"], o["metadata"]["labels"])]
    assert [s["metadata"]["name"] for s in selected] == ["sn-controller-pods"]
    (pods,) = selected
    assert pods["spec"]["selector"] == find("Service", "sn-controller")["spec"]["selector"]
    assert labels_match(pods["spec"]["selector"],
                        controller["spec"]["template"]["metadata"]["labels"])
    job = pods["metadata"]["labels"][monitor["spec"]["jobLabel"]]
    assert job == "sn-controller"  # what rules/prometheus/ select (see the base's test)
    ports = {p["name"] for p in pods["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


def test_ha_disruption_budget_keeps_one_controller():
    controller = ha_find("Deployment", "sn-controller")
    budget = ha_find("PodDisruptionBudget", "sn-controller")
    assert budget["metadata"]["namespace"] == NAMESPACE
    assert budget["spec"]["selector"]["matchLabels"] == \
        controller["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["minAvailable"] == 1 < controller["spec"]["replicas"]
    # a crash-looping controller must not block a drain
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # the base, one controller, has none: a budget would block every drain of its node
    assert not any(o["kind"] == "PodDisruptionBudget" for o in objects())


def _without_hash(name: str, generated: set[str]) -> str:
    base, _, suffix = name.rpartition("-")
    return base if base in generated and len(suffix) == 10 else name


def _canonical(doc: Any, key: str = "") -> Any:
    """Lists under MERGE_KEYS in key order: kustomize puts a patch's new items first."""
    if isinstance(doc, dict):
        return {k: _canonical(v, k) for k, v in doc.items()}
    if isinstance(doc, list):
        items = [_canonical(v) for v in doc]
        return sorted(items, key=lambda v: v[MERGE_KEYS[key]]) if key in MERGE_KEYS else items
    return doc


def test_ha_kustomize_builds_what_the_test_merges(tmp_path: Path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (the checks above merge the patches themselves)")
    # a kustomization of one's own next to the base, as ha/README.md shows (kustomize
    # wants relative paths, and refuses a kustomization below the one it builds on)
    own = tmp_path / "own"
    own.mkdir()
    (own / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(K8S, own)], "components": [os.path.relpath(HA, own)]}))
    result = subprocess.run([kubectl, "kustomize", str(own)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    generated = set(ha_configmaps())
    built = {}
    for doc in yaml.safe_load_all(result.stdout):
        if doc:
            doc["metadata"]["name"] = _without_hash(doc["metadata"]["name"], generated)
            built[(doc["kind"], doc["metadata"]["name"])] = doc
    ours = {(o["kind"], o["metadata"]["name"]): o for o in ha_objects()}
    assert set(built) == set(ours) | {("ConfigMap", name) for name in generated}
    controller = built[("Deployment", "sn-controller")]
    for volume in pod_spec(controller)["volumes"]:
        if "configMap" in volume:
            volume["configMap"]["name"] = _without_hash(volume["configMap"]["name"], generated)
    for key in (("Deployment", "sn-controller"), ("Service", "sn-controller"),
                ("ServiceMonitor", "sn-controller"), ("Service", "sn-controller-pods")):
        merged = ours[key]
        merged["metadata"]["namespace"] = NAMESPACE  # the base's kustomization sets it
        assert _canonical(built[key]) == _canonical(merged), key
    config = built[("ConfigMap", "sn-controller-config")]["data"]["controller.yaml"]
    assert config == (HA / "config" / "controller.yaml").read_text()
